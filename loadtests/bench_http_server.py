"""HTTP server settings: CPU per request and idle CPU of `BackgroundServer` as this runtime configures it vs uvicorn's defaults.

    .venv/bin/python -m loadtests.bench_http_server [--rounds 3] [--seconds 10] [--idle-seconds 20] [--write-docs]

Every HTTP server this runtime starts (the gateway, each container's data port) is a `BackgroundServer`. It
turns off two of uvicorn's defaults: `proxy_headers` (a middleware that rewrites each request's client and
scheme from `X-Forwarded-*`; docs/security.md says why we trust no such header) and `server_header`. This
measures what they cost per request: one server process per case, serving a 1-row JSON echo (the shape of an
invocation) through a real `BackgroundServer`, the baseline with those two options put back to uvicorn's
defaults; wrk at 32 connections for `--seconds`, cases alternating for `--rounds`. CPU per request is the
server process's user + system time over the run (from /proc) divided by the requests wrk completed.

Idle: the same two servers started side by side and left alone for `--idle-seconds` (after the load, once per
round): the CPU each used, in cores. The baseline runs uvicorn's own main loop, which wakes every 0.1 s; ours wakes
once a second (`serving.http.server._Server`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.harness.proctree import process_cpu_seconds as cpu_seconds
from loadtests.harness.results import (
    ROOT,
    command_line,
    machine_facts,
    run_line,
    write_results,
    write_section,
)
from loadtests.harness.wrk import ensure_wrk

RESULTS = ROOT / "loadtests" / "results" / "bench_http_server.json"
DOCS = ROOT / "docs" / "benchmarks" / "bench_http_server.md"
CASES = ("ours", "uvicorn defaults")
BODY = '{"instances": [[5.1, 3.5, 1.4, 0.2]]}'
LUA = f"""wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Forwarded-For"] = "10.0.0.9"
done = function(summary, latency, requests)
  io.write(string.format("BENCH %d %d\\n", summary.requests, summary.errors.status + summary.errors.connect
    + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


def serve(case: str) -> None:
    """The child: one BackgroundServer on 127.0.0.1, its port on stdout, until stdin closes."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from serving.http.server import BackgroundServer

    if case == "uvicorn defaults":
        import serving.http.server as ours

        original = uvicorn.Config

        def config(*args: Any, **kwargs: Any) -> uvicorn.Config:
            kwargs.pop("proxy_headers", None)
            kwargs.pop("server_header", None)
            return original(*args, **kwargs)

        uvicorn.Config = config  # type: ignore[misc]
        ours._Server.main_loop = uvicorn.Server.main_loop  # type: ignore[method-assign]  # wakes every 0.1 s

    async def echo(request: Request) -> Response:
        body = json.loads(await request.body())
        return Response(
            json.dumps({"predictions": body["instances"]}), media_type="application/json"
        )

    server = BackgroundServer(Starlette(routes=[Route("/invocations", echo, methods=["POST"])]))
    server.wait_started()
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()


def idle_cores(seconds: float) -> dict[str, float]:
    """Both servers side by side, no requests: the CPU each used over `seconds` after a 2 s settle, in cores."""
    children = {
        case: subprocess.Popen(
            [sys.executable, "-m", "loadtests.bench_http_server", "--serve", case],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for case in CASES
    }
    try:
        for child in children.values():
            assert child.stdout is not None
            child.stdout.readline()  # its port: it is serving
        time.sleep(2)
        before = {case: cpu_seconds(child.pid) for case, child in children.items()}
        time.sleep(seconds)
        return {
            case: (cpu_seconds(child.pid) - before[case]) / seconds
            for case, child in children.items()
        }
    finally:
        for child in children.values():
            if child.stdin:
                child.stdin.close()
            child.wait(30)


def one_case(case: str, wrk: str, script: Path, seconds: float) -> dict[str, float]:
    child = subprocess.Popen(
        [sys.executable, "-m", "loadtests.bench_http_server", "--serve", case],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        url = f"http://127.0.0.1:{port}/invocations"
        subprocess.run(
            [wrk, "-t1", "-c32", "-d2s", "-s", str(script), url], capture_output=True, timeout=60
        )
        before = cpu_seconds(child.pid)
        done = subprocess.run(
            [wrk, "-t1", "-c32", f"-d{seconds:g}s", "-s", str(script), url],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
        used = cpu_seconds(child.pid) - before
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(30)
    line = next(line for line in done.stdout.splitlines() if line.startswith("BENCH "))
    requests, errors = (int(value) for value in line.split()[1:])
    if errors or not requests:
        raise RuntimeError(f"{case}: {errors} errors in {requests} requests")
    return {
        "requests": requests,
        "rps": requests / seconds,
        "cpu_us_per_request": used * 1e6 / requests,
    }


def docs_section(saved: dict[str, Any]) -> str:
    rounds = saved["rounds"]
    median = {
        case: statistics.median(r[case]["cpu_us_per_request"] for r in rounds) for case in CASES
    }
    rps = {case: statistics.median(r[case]["rps"] for r in rounds) for case in CASES}
    ratios = [
        r["ours"]["cpu_us_per_request"] / r["uvicorn defaults"]["cpu_us_per_request"]
        for r in rounds
    ]
    idle = {case: statistics.median(r["idle_cores"][case] for r in rounds) for case in CASES}
    rows = [
        f"| {case} | {median[case]:.0f} | {rps[case]:,.0f} | {idle[case]:.4f} |" for case in CASES
    ]
    return "\n".join(
        [
            "## HTTP server settings: proxy headers and the idle tick",
            "",
            "CPU per request of one `BackgroundServer` (what the gateway and every container data port run) serving a",
            "1-row JSON echo, as this runtime configures it and with uvicorn's defaults for `proxy_headers` and",
            "`server_header` and uvicorn's own main loop (a wake-up every 0.1 s) put back; wrk at 32 connections, then",
            f"both left idle side by side; {len(rounds)} alternating rounds, medians (`loadtests/bench_http_server.py` has",
            "the method).",
            "",
            "| server | CPU µs per request | req/s | idle CPU (cores) |",
            "|---|---|---|---|",
            *rows,
            "",
            f"Ours over uvicorn's defaults: {statistics.median(ratios):.2f}× the CPU per request (rounds: "
            + ", ".join(f"{ratio:.2f}" for ratio in ratios)
            + "). Every invocation passes two such servers (the gateway's",
            "and its container's), a Serial chain one more per container. The change is made for docs/security.md's reason",
            "(no caller may choose the address a container sees); what it saves per request is small next to the spread",
            "between rounds on this VM.",
            "",
            f"Idle, ours uses {idle['ours'] / idle['uvicorn defaults']:.2f}× the baseline's CPU "
            f"({idle['uvicorn defaults'] - idle['ours']:.4f} cores less per server). An endpoint runs one such server per",
            "container process and one in the gateway: the fifteen-container example, sixteen. (/proc counts CPU in",
            f"10 ms ticks: one tick in {saved['idle_seconds']:g} s is {0.01 / saved['idle_seconds']:.4f} cores.)",
            "",
            run_line(saved, RESULTS),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--serve", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    started, clock = dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), time.perf_counter()
    machine = machine_facts()
    wrk = ensure_wrk()
    rounds = []
    with tempfile.TemporaryDirectory() as work:
        script = Path(work) / "post.lua"
        script.write_text(LUA)
        for index in range(args.rounds):
            found: dict[str, Any] = {
                case: one_case(case, wrk, script, args.seconds)
                for case in (CASES if index % 2 == 0 else CASES[::-1])
            }
            found["idle_cores"] = idle_cores(args.idle_seconds)
            print(index, json.dumps(found), flush=True)
            rounds.append(found)
    saved = {
        "started": started,
        "seconds": time.perf_counter() - clock,
        "command": command_line(__file__),
        "machine": machine,
        "idle_seconds": args.idle_seconds,
        "rounds": rounds,
    }
    write_results(RESULTS, saved)
    print(docs_section(saved))
    if args.write_docs:
        write_section(DOCS, "bench_http_server", docs_section(saved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
