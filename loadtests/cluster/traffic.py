"""Load and CPU on a simulated cluster: wrk processes in the load namespace, one per gateway address (as a
balancer spreads connections over hosts), run together; the CPU of any set of the hosts' processes, from
/proc."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from loadtests.cluster.cluster import SimulatedCluster
from loadtests.harness.wrk import LUA_TEMPLATE, _lua_string, ensure_wrk

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Traffic:
    """What wrk saw over all addresses together: calls/s, latency percentiles (of the address that
    fared worse), failures, and each address's own report."""

    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    failures: int
    hosts: list[dict]

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds of `pids` so far (a process gone meanwhile counts as nothing)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def invoke_script(folder: Path, endpoint: str, container: str | None) -> Path:
    """A wrk script that POSTs one small JSON row to `endpoint` (naming `container` when given) and
    reports as `harness.wrk` does."""
    headers = 'wrk.headers["Content-Type"] = "application/json"'
    if container:
        headers += f'\nwrk.headers["X-Amzn-SageMaker-Target-Container-Hostname"] = "{container}"'
    script = folder / f"{endpoint}-{container or 'chain'}.lua"
    body = "wrk.body = " + _lua_string('{"x": 1}')
    script.write_text(LUA_TEMPLATE.format(method="POST", body=body, headers=headers))
    return script


def wrk(
    cluster: SimulatedCluster,
    hosts: list[int],
    script: Path,
    path: str,
    seconds: float,
    connections: int,
) -> Traffic:
    """`connections` connections to each host in `hosts`, one wrk each, all at once, for `seconds`."""
    assert cluster.machine.load is not None
    binary = ensure_wrk()
    runs = [
        cluster.machine.start(
            cluster.machine.load,
            [
                binary, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
                "-s", str(script), f"{cluster.url(index)}{path}",
            ],
            cluster.environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for index in hosts
    ]  # fmt: skip
    started = time.monotonic()
    reports = []
    for run in runs:
        out, _ = run.communicate(timeout=seconds + 60)
        line = next((x for x in out.splitlines() if x.startswith("BENCH_JSON ")), None)
        if line is None:
            raise RuntimeError(f"wrk reported nothing:\n{out[-2000:]}")
        reports.append(json.loads(line.removeprefix("BENCH_JSON ")))
    elapsed = max(time.monotonic() - started, seconds)
    return Traffic(
        requests=sum(report["requests"] for report in reports),
        seconds=min(elapsed, max(report["duration_us"] for report in reports) / 1e6),
        p50_ms=max(report["p50"] for report in reports) / 1000,
        p99_ms=max(report["p99"] for report in reports) / 1000,
        failures=sum(
            report[kind]
            for report in reports
            for kind in ("connect", "read", "write", "status", "timeout")
        ),
        hosts=reports,
    )


def scratch() -> Path:
    """A folder for wrk's scripts (removed by the caller)."""
    return Path(tempfile.mkdtemp(prefix="bench-cluster-"))
