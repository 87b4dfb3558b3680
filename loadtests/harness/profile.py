"""py-spy profiles of server processes under load: CPU by component (model, HTTP client, our code,
...) per request."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadtests.harness.cpu import CpuMeter, read_procs
from loadtests.harness.processes import Processes
from loadtests.harness.wrk import Wrk, WrkStalled

ROOT = Path(__file__).resolve().parents[2]
JSON_HEADERS = {"Content-Type": "application/json"}

PROFILE_RATE = 200


PROFILE_BUCKETS = [  # a frame's top-level module -> what the time is spent on
    (
        ("sklearn", "numpy", "scipy", "narwhals", "skops", "joblib", "threadpoolctl"),
        "model: scikit-learn/numpy (incl. sklearn's input validation)",
    ),
    (
        (
            "aiohttp",
            "yarl",
            "multidict",
            "aiohappyeyeballs",
            "propcache",
            "frozenlist",
            "aiosignal",
            "async_timeout",
        ),
        "aiohttp client (the hop to the container)",
    ),
    # py-spy names this project's files without their package folder ("router.py",
    # "runtimes/base.py"). (http/server.py's BackgroundServer._run sits at the root of every
    # HTTP-thread sample: not a cost of its own, so `summarize_profile` skips its frame.)
    (
        tuple(
            {"serving"}
            | {p.stem for p in (ROOT / "serving").glob("*.py") if p.stem != "__init__"}
            | {
                p.name
                for p in (ROOT / "serving").iterdir()
                if p.is_dir() and not p.name.startswith("__")
            }
        ),
        "serving code (router, transport, container app, runtime, codecs)",
    ),
    (("starlette", "anyio"), "starlette (requests, responses, routing)"),
    (("uvicorn", "httptools", "h11"), "uvicorn + httptools (HTTP server)"),
    (("ray", "grpc", "google", "opentelemetry", "prometheus_client"), "ray (replica machinery)"),
    (("uvloop",), "event loop and sockets (uvloop)"),
]


ROOT_FRAME = (
    # the HTTP thread's root frame (serving/http/server.py): the event loop runs under it
    "BackgroundServer._run "
)


def _frame_module(frame: str) -> str:
    if not frame.endswith(")") or "(" not in frame:
        return ""
    location = frame[frame.rfind("(") + 1 : -1]
    return location.rsplit(":", 1)[0].split("/")[0].removesuffix(".py")


def summarize_profile(raw: str, requests: int, cpu_us_per_request: float | None) -> dict[str, Any]:
    """py-spy raw (collapsed, --threads, non-idle samples) -> CPU by component, per request."""
    buckets: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        all_frames = stack.split(";")
        frames = [f for f in all_frames if not f.startswith(ROOT_FRAME)]
        total += count
        thread = (
            frames[0].split(": ", 1)[1]
            if frames[0].startswith("thread (") and ": " in frames[0]
            else "?"
        )
        if thread == "status-poll" or any("_poll_status" in f for f in frames):
            bucket = "status-poll thread (none since the registry polls statuses)"
        elif thread.startswith("http-") or len(frames) < len(all_frames):
            bucket = next(
                (
                    name
                    for f in reversed(frames)
                    for mods, name in PROFILE_BUCKETS
                    if _frame_module(f) in mods
                ),
                None,
            )
            if bucket is None:
                bucket = (
                    "event loop and sockets (asyncio/uvloop)"
                    if _frame_module(frames[-1]) in ("asyncio", "selectors")
                    or frames[-1].startswith(("Runner.run", "run (asyncio"))
                    else "other Python in the HTTP thread"
                )
        elif any("Worker.main_loop" in f for f in frames):
            bucket = "Ray core worker's main thread (native code)"
        else:
            bucket = f"other threads of the replica: {thread}"
        buckets[bucket] = buckets.get(bucket, 0) + count
    # py-spy counts running and runnable threads alike, which over-counts on a busy 2-core machine:
    # keep its shares, and scale them by the CPU the process really used (from /proc) in the same
    # window.
    rows = [
        {
            "bucket": name,
            "samples": n,
            "share": round(n / total, 3) if total else 0.0,
            "us_per_request": round(n / total * cpu_us_per_request, 1)
            if total and cpu_us_per_request
            else None,
        }
        for name, n in sorted(buckets.items(), key=lambda kv: -kv[1])
    ]
    return {
        "samples": total,
        "rate_hz": PROFILE_RATE,
        "requests": requests,
        "cpu_us_per_request": cpu_us_per_request,
        "buckets": rows,
    }


def record(
    processes: Processes,
    binary: str,
    pid: int,
    seconds: float,
    rate: int,
    fmt: str,
    out: Path,
    *options: str,
) -> subprocess.Popen:
    """`py-spy record` of process `pid` for `seconds`, without pausing it, into `out` in format
    `fmt`."""
    command = [
        binary,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(round(seconds)),
        "--rate",
        str(rate),
    ]
    command += ["--format", fmt, "--nonblocking", *options, "-o", str(out)]
    return processes.start(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def profile_case(
    processes: Processes,
    wrk: Wrk,
    meter: CpuMeter,
    targets: dict[str, str],
    url: str,
    body: str,
    seconds: float,
    work: Path,
) -> dict[str, Any]:
    """Load `url` at 32 connections while py-spy samples the processes whose labels are in
    `targets`."""
    py_spy = Path(sys.executable).parent / "py-spy"
    if not py_spy.exists() and not shutil.which("py-spy"):
        return {"skipped": "py-spy not installed"}
    py_spy_bin = str(py_spy) if py_spy.exists() else shutil.which("py-spy")
    table = read_procs()
    pids, labels = {}, {}
    for pid in table:
        label = meter.label(pid, table)
        if label in targets:
            pids[targets[label]] = pid
            labels[targets[label]] = label
    runs = []
    for name, pid in pids.items():
        out = work / f"profile-{pid}.raw"
        process = record(processes, py_spy_bin, pid, seconds, PROFILE_RATE, "raw", out, "--threads")
        runs.append((name, process, out))
    time.sleep(0.5)  # let py-spy attach
    script = wrk._script("POST", body, JSON_HEADERS)
    before = meter.snapshot()
    try:
        stats, _ = wrk._run(script, url, 32, seconds)
    except WrkStalled as stalled:
        for _, process, _ in runs:
            processes.stop(process)
        return {"skipped": str(stalled)}
    cpu, _ = CpuMeter.delta(before, meter.snapshot())
    result: dict[str, Any] = {
        "url": url,
        "connections": 32,
        "seconds": seconds,
        "requests": stats["requests"],
        "rps": round(stats["requests"] / (stats["duration_us"] / 1e6)),
        "processes": {},
    }
    for name, process, out in runs:
        try:
            process.wait(seconds + 30)
        except subprocess.TimeoutExpired:
            processes.stop(process)
        processes.started.remove(process) if process in processes.started else None
        if out.exists():
            used = (
                cpu.get(labels[name], 0.0) / stats["requests"] * 1e6 if stats["requests"] else None
            )
            result["processes"][name] = summarize_profile(
                out.read_text(), stats["requests"], used and round(used, 1)
            )
        else:
            result["processes"][name] = {
                "skipped": "py-spy wrote nothing (needs ptrace permission)"
            }
    return result
