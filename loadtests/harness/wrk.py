"""wrk runs: one case is one server at one concurrency, with latency percentiles, errors and CPU per
request.

On a shared machine a case waits (bounded) for quiet and is measured again when other processes
disturbed it, keeping the least disturbed attempt (`Wrk(quiet_wait=..., retries=...)`).
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.harness.cpu import OTHER, CpuMeter, wait_for_quiet
from loadtests.harness.processes import BenchError, log


class WrkStalled(BenchError):
    """wrk overran its time (a starved machine): the attempt is void, not the run."""


LUA_TEMPLATE = """\
wrk.method = "{method}"
{body}
{headers}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('BENCH_JSON {{"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,' ..
    '"write":%d,"status":%d,"timeout":%d,"p50":%.1f,"p90":%.1f,"p99":%.1f,"mean":%.2f,"stdev":%.2f,' ..
    '"max":%d,"min":%d}}\\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.stdev,
    latency.max, latency.min))
end
"""


def _lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def lua_bytes(text: str) -> str:
    """`text` (bytes as latin-1) as a Lua string literal: printable ASCII as is, every other byte as
    \\ddd."""
    out = []
    for char in text:
        code = ord(char)
        out.append(char if 32 <= code < 127 and char not in '"\\' else f"\\{code:03d}")
    return '"' + "".join(out) + '"'


def ensure_wrk() -> str:
    path = shutil.which("wrk")
    if path:
        return path
    log("wrk not found: installing it with apt-get (Debian package 'wrk') ...")
    if os.geteuid() == 0 and shutil.which("apt-get"):
        for step in (
            ["apt-get", "install", "-y", "wrk"],
            ["apt-get", "update"],
            ["apt-get", "install", "-y", "wrk"],
        ):
            subprocess.run(
                step,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=300,
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            )
            path = shutil.which("wrk")
            if path:
                return path
    raise BenchError(
        "this benchmark needs wrk (https://github.com/wg/wrk): install it, e.g. `apt-get install -y wrk`, and run again"
    )


@dataclass
class Case:
    """One wrk run against one server at one concurrency."""

    system: str
    load: str
    connections: int
    url: str
    duration_s: float
    warmup_s: float
    command: str = ""
    requests: int = 0
    rps: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    mean_ms: float = 0.0
    stdev_ms: float = 0.0
    max_ms: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    warmup_errors: int = 0
    flagged: str | None = None  # why these numbers must not be trusted
    # CPU seconds per process group in the window
    cpu_s: dict[str, float] = field(default_factory=dict)
    cpu_us_per_request: dict[str, float] = field(default_factory=dict)
    busy_cores: float = 0.0
    loadavg: str = ""
    other_cores: float = 0.0  # CPU that processes outside this run used during the case, in cores
    steal_cores: float = 0.0  # CPU the hypervisor gave to other guests during the case, in cores
    attempts: int = 1

    @property
    def disturbance(self) -> float:
        return self.other_cores + self.steal_cores


class Wrk:
    def __init__(
        self,
        binary: str,
        workdir: Path,
        meter: CpuMeter,
        timeout_s: float = 10.0,
        quiet_wait: float = 0.0,
        quiet_threshold: float = 0.15,
        retries: int = 0,
    ) -> None:
        self.quiet_wait = quiet_wait
        self.quiet_threshold = quiet_threshold
        self.retries = retries
        self.binary = binary
        self.workdir = workdir
        self.meter = meter
        self.timeout_s = timeout_s
        self.count = 0

    def _script(self, method: str, body: str | None, headers: dict[str, str]) -> Path:
        self.count += 1
        path = self.workdir / f"case{self.count}.lua"
        path.write_text(
            LUA_TEMPLATE.format(
                method=method,
                body=f"wrk.body = {_lua_string(body)}" if body is not None else "",
                headers="\n".join(
                    f"wrk.headers[{_lua_string(k)}] = {_lua_string(v)}" for k, v in headers.items()
                ),
            )
        )
        return path

    def _run(
        self, script: Path, url: str, connections: int, seconds: float
    ) -> tuple[dict[str, Any], str]:
        args = [
            self.binary,
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            f"{self.timeout_s:g}s",
            "--latency",
            "-s",
            str(script),
            url,
        ]
        try:  # generous: on a swamped machine wrk itself may be starved of CPU
            done = subprocess.run(
                args, capture_output=True, text=True, timeout=2 * seconds + self.timeout_s + 60
            )
        except subprocess.TimeoutExpired:
            raise WrkStalled(f"wrk did not finish in time: {shlex.join(args)}") from None
        for line in done.stdout.splitlines():
            if line.startswith("BENCH_JSON "):
                return json.loads(line[len("BENCH_JSON ") :]), shlex.join(args)
        raise BenchError(
            f"wrk failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
        )

    def case(
        self,
        system: str,
        load: str,
        connections: int,
        url: str,
        duration: float,
        warmup: float,
        method: str = "POST",
        body: str | None = None,
        headers: dict[str, str] | Callable[[], dict[str, str]] | None = None,
    ) -> Case:
        """One case; on a shared machine, waits for quiet and repeats a case that other processes
        disturbed. `headers` may be a function, called before each attempt: a hop signature (valid
        for a minute) is made just before the requests that carry it, however long the wait for
        quiet was."""
        best: Case | None = None
        for attempt in range(1, self.retries + 2):
            if self.quiet_wait > 0:
                wait_for_quiet(
                    self.meter,
                    self.quiet_wait,
                    self.quiet_threshold,
                    window=2.0,
                    quiet=attempt == 1,
                )
            script = self._script(method, body, (headers() if callable(headers) else headers) or {})
            try:
                result = self._case_once(
                    script, system, load, connections, url, duration, warmup, method
                )
            except WrkStalled as stalled:
                result = Case(
                    system,
                    load,
                    connections,
                    url,
                    duration,
                    warmup,
                    flagged=str(stalled),
                    other_cores=float(os.cpu_count() or 1),
                )  # as disturbed as it gets: try again
            if best is None or result.disturbance < best.disturbance:
                best = result  # keep the least disturbed attempt
            best.attempts = attempt
            if result.disturbance <= self.quiet_threshold or attempt > self.retries:
                break
            log(
                f"  {system:<34} {load:<10} disturbed: other processes used {result.other_cores:.2f} cores, "
                f"the hypervisor stole {result.steal_cores:.2f}; measuring again"
            )
        result = best
        tag = f"  ** FLAGGED: {result.flagged}" if result.flagged else ""
        noise = (
            f"  (disturbed: other processes {result.other_cores:.2f} cores, steal {result.steal_cores:.2f})"
            if result.disturbance > self.quiet_threshold
            else ""
        )
        log(
            f"  {system:<34} {load:<10} p50 {result.p50_ms:7.3f} ms  p99 {result.p99_ms:7.3f} ms  "
            f"{result.rps:8.0f} req/s{tag}{noise}"
        )
        return result

    def _case_once(
        self,
        script: Path,
        system: str,
        load: str,
        connections: int,
        url: str,
        duration: float,
        warmup: float,
        method: str,
    ) -> Case:
        result = Case(system, load, connections, url, duration, warmup)
        if warmup > 0:
            warm, _ = self._run(script, url, connections, warmup)
            result.warmup_errors = sum(
                warm[k] for k in ("connect", "read", "write", "status", "timeout")
            )
        before, children = self.meter.snapshot(), resource.getrusage(resource.RUSAGE_CHILDREN)
        stats, command = self._run(script, url, connections, duration)
        after, children_after = self.meter.snapshot(), resource.getrusage(resource.RUSAGE_CHILDREN)
        result.command = command.replace(str(script), "POST.lua" if method == "POST" else "GET.lua")
        result.loadavg = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        seconds, result.busy_cores = CpuMeter.delta(before, after)
        seconds["wrk (load generator)"] = (
            children_after.ru_utime
            + children_after.ru_stime
            - children.ru_utime
            - children.ru_stime
        )  # wrk: the only child that exited
        CpuMeter.clamp_other(seconds, result.busy_cores, after[0] - before[0])
        result.requests = stats["requests"]
        elapsed = stats["duration_us"] / 1e6
        result.rps = result.requests / elapsed if elapsed else 0.0
        result.other_cores = round(seconds.get(OTHER, 0.0) / elapsed, 3) if elapsed else 0.0
        result.steal_cores = round(CpuMeter.machine(before, after)[1], 3)
        result.p50_ms, result.p90_ms, result.p99_ms = (
            stats[k] / 1000 for k in ("p50", "p90", "p99")
        )
        result.mean_ms, result.stdev_ms, result.max_ms = (
            stats[k] / 1000 for k in ("mean", "stdev", "max")
        )
        result.errors = {
            k: stats[k] for k in ("connect", "read", "write", "status", "timeout") if stats[k]
        }
        result.cpu_s = {k: round(v, 3) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}
        if result.requests:
            result.cpu_us_per_request = {
                k: round(v / result.requests * 1e6, 1) for k, v in result.cpu_s.items()
            }
        if result.requests == 0:
            result.flagged = "no request completed"
        elif result.errors:
            result.flagged = (
                "errors: "
                + ", ".join(f"{k} {v}" for k, v in result.errors.items())
                + f" of {result.requests} requests (status = non-2xx/3xx responses)"
            )
        return result
