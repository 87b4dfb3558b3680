"""Where a direct call's CPU goes, per process: py-spy flame graphs of the gateway and of the
container process under load, and each one's CPU per request split by what the code was doing (issue
44).

The embedded server of bench_invoke (the iris pipeline in a scikit-learn container, one Direct
endpoint, no AccessControl), wrk at `--connections` for `--seconds` while py-spy samples both
processes twice: once as a flame graph (SVG, committed under docs/benchmarks/profiles/) and once as
collapsed stacks, which are classified here: each sample goes to the category of its innermost frame
that has one (so a category is the CPU spent in that code itself, below no other category). The
shares are scaled by each process's CPU per request read from /proc in the same window (py-spy
counts runnable threads as well as running ones).

What py-spy cannot see is in no row: the kernel's share of a syscall (seccomp filters, socket calls)
shows as the Python frame that made the call, and the C code of uvloop, httptools and CPython
itself, run under no Python frame, shows as the event loop's frame. A second load, as long, runs
under `strace -c -f` on both processes instead, to count the syscalls each makes per request (strace
slows every syscall, so only its counts are used). A third runs under `perf record` (where perf may
read these processes): each process's CPU split by the binary it ran in, the kernel, CPython's
interpreter (bytecode and the C API that extensions call) and other native code.

    python -m loadtests.bench_profile [--seconds 20] [--connections 8] [--write-docs]

Results: loadtests/results/bench_profile.json; with --write-docs, docs/benchmarks/bench_profile.md
and the SVGs.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadtests.harness.cpu import CpuMeter
from loadtests.harness.models import iris_models
from loadtests.harness.processes import Processes, log
from loadtests.harness.proctree import gateway_and_container, process_cpu_seconds
from loadtests.harness.profile import record
from loadtests.harness.results import ROOT, run_meta, write_results, write_section
from loadtests.harness.wrk import Wrk, ensure_wrk
from loadtests.invoke.measure import DIRECT, JSON_HEADERS, OUR_BODY, start_ours

RATE_HZ = 250
PROFILES = ROOT / "docs" / "benchmarks" / "profiles"
# (category, how a frame of it is recognised: a path fragment of its file, or its function's name),
# innermost wins.
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("hop signature: sign (gateway) / verify (container)", ("trust/hops.py", "hmac.py", "hashlib")),
    ("model: scikit-learn / numpy predict", ("sklearn/", "numpy/", "scipy/", "threadpoolctl")),
    ("JSON decode / encode", ("json/", "orjson", "codecs.py", "serialization")),
    ("metrics and stats events", ("metrics/", "events.py", "prometheus_client")),
    ("logging", ("logging/",)),
    (
        "hop client (aiohttp) and hop transport",
        ("aiohttp/", "yarl/", "multidict", "gateway/transport.py", "gateway/hop_client.py"),
    ),
    ("routing and access (router, invocation, failures)", ("gateway/",)),
    ("container app, predictor, runtime, handler hooks", ("model_server/", "runtimes/")),
    ("HTTP server: uvicorn + httptools (parse, write)", ("uvicorn/", "httptools")),
    ("Starlette: request, response, headers", ("starlette/",)),
    ("serving: other (http/, hot path, protocol)", ("serving/",)),
    (
        "event loop, threads and sockets (asyncio, uvloop, concurrent)",
        ("asyncio/", "uvloop", "concurrent/", "threading.py", "selectors.py"),
    ),
]


# the HTTP thread's root (serving/http/server.py): everything runs under it
ROOT_FRAME = "BackgroundServer._run "


def category(frames: list[str]) -> str:
    for frame in reversed(frames):  # innermost first
        if frame.startswith(ROOT_FRAME):
            break
        location = frame[frame.rfind("(") + 1 :] if "(" in frame else frame
        for name, marks in CATEGORIES:
            if any(mark in location for mark in marks):
                return name
    return "other (Python runtime, Ray's threads)"


def classify(raw: str, cpu_us: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Collapsed stacks -> CPU per request by category, and by innermost function (the 15 largest),
    scaled to the process's measured CPU per request."""
    counts: dict[str, int] = {}
    leaves: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            frames = stack.split(";")
            name = category(frames)
            counts[name] = counts.get(name, 0) + int(count)
            leaves[frames[-1]] = leaves.get(frames[-1], 0) + int(count)
    total = sum(counts.values()) or 1

    def rows(table: dict[str, int], key: str, limit: int | None = None) -> list[dict[str, Any]]:
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:limit]
        return [
            {key: k, "share": round(n / total, 3), "us_per_request": round(n / total * cpu_us, 1)}
            for k, n in ranked
        ]

    return rows(counts, "category"), rows(leaves, "function", 15)


def py_spy(processes: Processes, pid: int, seconds: float, fmt: str, out: Path) -> subprocess.Popen:
    binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return record(processes, binary, pid, seconds, RATE_HZ, fmt, out)


def syscalls(summary: str, requests: int) -> list[dict[str, Any]]:
    """`strace -c` output -> calls per request of each syscall (the 10 most frequent, errors
    included)."""
    counts: dict[str, int] = {}
    for line in summary.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
            # % time, seconds, usecs/call, calls, [errors], syscall
            counts[fields[-1]] = int(fields[3])
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    rows = [{"syscall": name, "per_request": round(n / requests, 2)} for name, n in ranked[:10]]
    return [{"syscall": "all", "per_request": round(sum(counts.values()) / requests, 1)}, *rows]


def load_under(
    processes: Processes,
    pids: dict[str, int],
    command: Callable[[str, int], list[str]],
    wrk: Wrk,
    url: str,
    args,
    started: Callable[[], object] | None = None,
) -> tuple[dict[str, subprocess.Popen], dict[str, Any]]:
    """A load as long as the profiled one, with `command(name, pid)` (a tracer) attached to each
    process first: the tracers and wrk's stats. `started` runs once they are attached, just before
    the load."""
    watchers = {
        name: processes.start(
            command(name, pid), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for name, pid in pids.items()
    }
    time.sleep(1.0)  # the tracers attach
    if started is not None:
        started()
    stats, _ = wrk._run(
        wrk._script("POST", OUR_BODY, JSON_HEADERS), url, args.connections, args.seconds
    )
    return watchers, stats


def strace_counts(
    processes: Processes, pids: dict[str, int], wrk: Wrk, url: str, args
) -> dict[str, Any]:
    """Syscalls per request of each process, from a load as long as the profiled one under `strace
    -c -f`."""
    binary = shutil.which("strace")
    if binary is None:
        return {"skipped": "strace not installed"}
    work = wrk.workdir
    tracers, stats = load_under(
        processes,
        pids,
        lambda name, pid: [binary, "-c", "-f", "-p", str(pid), "-o", str(work / f"{name}.strace")],
        wrk,
        url,
        args,
    )
    for tracer in tracers.values():
        tracer.send_signal(signal.SIGINT)  # strace writes its summary on SIGINT
        tracer.wait(30)
    return {
        "requests": stats["requests"],
        **{
            name: syscalls((work / f"{name}.strace").read_text(), stats["requests"])
            for name in pids
        },
    }


def binaries(report: str) -> dict[str, float]:
    """`perf report --sort dso` output -> share of samples in the kernel, CPython and other native
    code."""
    shares = {"kernel": 0.0, "CPython interpreter (libpython)": 0.0, "other native code": 0.0}
    for line in report.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].endswith("%"):
            share, dso = float(fields[0][:-1]) / 100, fields[1]
            key = (
                "kernel"
                if dso.startswith("[kernel")
                else "CPython interpreter (libpython)"
                if "libpython" in dso
                else "other native code"
            )
            shares[key] += share
    return shares


def perf_split(
    processes: Processes, pids: dict[str, int], wrk: Wrk, url: str, args
) -> dict[str, Any]:
    """Each process's CPU per request split by binary, from a load as long as the profiled one under
    perf."""
    binary = shutil.which("perf")
    if binary is None:
        return {"skipped": "perf not installed"}
    work = wrk.workdir
    before: dict[str, float] = {}
    recorders, stats = load_under(
        processes,
        pids,
        lambda name, pid: [
            binary,
            "record",
            "-F",
            "999",
            "-p",
            str(pid),
            "-o",
            str(work / f"{name}.perf"),
            "--",
            "sleep",
            str(args.seconds + 1),  # the load starts a second after perf does
        ],
        wrk,
        url,
        args,
        started=lambda: before.update(
            {name: process_cpu_seconds(pid) for name, pid in pids.items()}
        ),
    )
    used = {
        name: (process_cpu_seconds(pid) - before[name]) / stats["requests"] * 1e6
        for name, pid in pids.items()
    }
    out: dict[str, Any] = {"requests": stats["requests"]}
    for name, recorder in recorders.items():
        recorder.wait(args.seconds + 30)
        report = subprocess.run(
            [
                binary,
                "report",
                "-i",
                str(work / f"{name}.perf"),
                "--sort",
                "dso",
                "--stdio",
                "-q",
                "-g",
                "none",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if report.returncode != 0 or "%" not in report.stdout:
            return {"skipped": f"perf could not record {name}: {report.stderr.strip()[-200:]}"}
        out[name] = {
            "cpu_us_per_request": round(used[name], 1),
            "binaries": {k: round(v, 3) for k, v in binaries(report.stdout).items()},
        }
    return out


def docs_section(result: dict[str, Any]) -> str:
    meta, lines = result["meta"], ["## Measured", ""]
    lines.append(
        f"wrk at {meta['connections']} connections for {meta['seconds']:.0f} s: {result['rps']:,} req/s. CPU per "
        "request of each process from /proc, split by the category of the innermost classified frame of each "
        f"py-spy sample ({RATE_HZ} Hz). Flame graphs: [gateway](profiles/gateway.svg), "
        "[container process](profiles/container.svg)."
    )
    for name, process in result["processes"].items():
        lines += [
            "",
            f"### {name}: {process['cpu_us_per_request']:.0f} µs per request",
            "",
            "| where | share | µs per request |",
            "|---|---|---|",
        ]
        lines += [
            f"| {row['category']} | {row['share']:.1%} | {row['us_per_request']:.0f} |"
            for row in process["rows"]
        ]
        lines += [
            "",
            "Innermost functions that took the most:",
            "",
            "| function (file:line) | share | µs per request |",
            "|---|---|---|",
        ]
        lines += [
            f"| `{row['function']}` | {row['share']:.1%} | {row['us_per_request']:.0f} |"
            for row in process["functions"]
        ]
    traced = result.get("syscalls", {})
    if "requests" in traced:
        lines += [
            "",
            f"### Syscalls per request (`strace -c -f`, {traced['requests']:,} requests)",
            "",
            "| gateway | per request | container process | per request |",
            "|---|---|---|---|",
        ]
        for g, c in zip(traced["gateway"], traced["container"], strict=False):
            lines.append(
                f"| {g['syscall']} | {g['per_request']} | {c['syscall']} | {c['per_request']} |"
            )
    split = result.get("binaries", {})
    if "requests" in split:
        names = [name for name in split if name != "requests"]
        lines += [
            "",
            f"### Where each process ran, by binary (`perf record`, {split['requests']:,} requests)",
            "",
            "| binary | " + " | ".join(f"{name}: share | µs per request" for name in names) + " |",
            "|---|" + "---|---|" * len(names),
        ]
        for kind in split[names[0]]["binaries"]:
            cells = [
                f"{split[name]['binaries'][kind]:.1%} | {split[name]['binaries'][kind] * split[name]['cpu_us_per_request']:.0f}"
                for name in names
            ]
            lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Run: `{meta['command']}` at {meta['started']} ({meta['seconds_total']:.0f} s); {meta['machine']['nproc']} "
        f"CPUs ({meta['machine']['cpu_model']}), load average before {meta['machine']['loadavg_at_start']}. "
        "Results: `loadtests/results/bench_profile.json`.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "loadtests" / "results" / "bench_profile.json"
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    meta = run_meta(__file__, seconds=args.seconds, connections=args.connections)
    processes = Processes()
    work = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    server = None
    try:
        paths = iris_models(work)
        log("starting the embedded server (bench_invoke's endpoints) ...")
        server, ours = start_ours(paths)
        url = f"{ours['base']}/endpoints/{DIRECT}/invocations"
        wrk = Wrk(ensure_wrk(), work, CpuMeter())
        wrk.case("warm-up", "c8", args.connections, url, 5, 0, body=OUR_BODY, headers=JSON_HEADERS)
        pids = gateway_and_container(DIRECT)
        spies = [
            (name, fmt, py_spy(processes, pid, args.seconds, fmt, work / f"{name}.{fmt}"))
            for name, pid in pids.items()
            for fmt in ("raw", "flamegraph")
        ]
        time.sleep(1.0)  # py-spy attaches
        cpu_before = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
        stats, _ = wrk._run(
            wrk._script("POST", OUR_BODY, JSON_HEADERS), url, args.connections, args.seconds
        )
        cpu = {name: process_cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        for _, _, spy in spies:
            spy.wait(args.seconds + 60)
        requests = stats["requests"]
        result: dict[str, Any] = {
            "meta": meta,
            "requests": requests,
            "rps": round(requests / (stats["duration_us"] / 1e6)),
            "processes": {},
        }
        for name in pids:
            used = cpu[name] / requests * 1e6
            rows, functions = classify((work / f"{name}.raw").read_text(), used)
            result["processes"][name] = {
                "cpu_us_per_request": round(used, 1),
                "rows": rows,
                "functions": functions,
            }
            log(f"{name}: {used:.0f} µs per request")
            for row in rows:
                log(f"  {row['us_per_request']:6.0f} µs  {row['share']:6.1%}  {row['category']}")
        result["syscalls"] = strace_counts(processes, pids, wrk, url, args)
        result["binaries"] = perf_split(processes, pids, wrk, url, args)
    finally:
        processes.stop_all()
        if server is not None:
            server.__exit__(None, None, None)
    meta["seconds_total"] = time.monotonic() - started
    write_results(args.out, result)
    if args.write_docs:
        PROFILES.mkdir(parents=True, exist_ok=True)
        for name in pids:
            shutil.copy(work / f"{name}.flamegraph", PROFILES / f"{name}.svg")
        write_section(
            ROOT / "docs" / "benchmarks" / "bench_profile.md",
            "bench_profile",
            docs_section(result),
            title="# Where a direct call's CPU goes, per process",
        )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
