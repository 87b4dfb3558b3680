"""What the gRPC door costs before any of our code: an echo server per transport library, CPU per call.

    .venv/bin/python -m loadtests.bench_grpc_floor [--rounds 3] [--seconds 5] [--write-docs]

Open Inference gRPC through a gateway cost more per call than MLServer's gRPC, where V2 REST cost less
(`bench_open_inference`). This bench asks how much of that is the transport library itself: the same
200-byte echo served by the gateway's own gRPC server (`serving.http.grpc_server` on uvloop, what the
gateway runs since grpcio's server was found to be that cost), by grpcio's asyncio server (on
uvloop, and on asyncio's own loop), by grpcio's thread-pool server, and, for the REST door, by the
HTTP/1.1 server our gateway and data ports run (`serving.http.server.BackgroundServer`: uvicorn, httptools, uvloop). Each server is a
process of its own with one handler that returns its input; the load comes from C clients, so that the
client's own CPU is small and stays out of the figure: `h2load` (Debian's `nghttp2-client`) for gRPC,
sending a framed gRPC message with gRPC's headers, `wrk` for HTTP. Two loads: 32 calls in flight on one
connection (as `bench_open_inference` drives gRPC; HTTP/1.1 cannot multiplex, so 32 connections) and
16 connections with one call each. The servers are measured in turn within each round, `--seconds`
each after a warm-up; CPU is the server process's user + system time from /proc. The docs report
medians over rounds and each server's ratio to the HTTP/1.1 server in the same round.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.harness.proctree import process_cpu_seconds
from loadtests.harness.results import ROOT, run_line, run_meta, write_results, write_section

RESULTS = ROOT / "loadtests" / "results" / "bench_grpc_floor.json"
DOCS = ROOT / "docs" / "benchmarks" / "bench_open_inference.md"
SERVICE = "inference.GRPCInferenceService"
PAYLOAD = b"x" * 200
SERVERS = ("serving-grpc", "grpc-aio-uvloop", "grpc-aio-asyncio", "grpc-threads", "http1")
LOADS = {"1x32": (1, 32), "16x1": (16, 1)}  # connections x calls in flight on each


def serve(kind: str) -> None:
    """The child: an echo server of `kind` on a free port, printed on stdout; serves until stdin closes."""
    import asyncio
    import socket
    import threading

    def until_stdin_closes() -> None:
        sys.stdin.read()

    if kind == "http1":
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route

        from serving.http.server import BackgroundServer

        async def echo_http(request: Request) -> Response:
            return Response(await request.body(), media_type="application/octet-stream")

        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(2048)
        server = BackgroundServer(
            Starlette(routes=[Route("/echo", echo_http, methods=["POST"])]), sock=listener
        )
        server.wait_started()
        print(listener.getsockname()[1], flush=True)
        until_stdin_closes()
        server.stop()
        return

    if kind == "serving-grpc":
        import uvloop

        from serving.http.grpc_server import GrpcCall, GrpcLimits, GrpcServer

        async def echo_ours(raw: bytes, call: GrpcCall) -> bytes:
            return raw

        async def run_ours() -> None:
            server = GrpcServer(SERVICE, {"ModelInfer": echo_ours}, GrpcLimits())
            print(await server.start("127.0.0.1", 0), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, until_stdin_closes)
            await server.stop(0)

        uvloop.run(run_ours())
        return

    import grpc

    if kind == "grpc-threads":
        from concurrent.futures import ThreadPoolExecutor

        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"ModelInfer": grpc.unary_unary_rpc_method_handler(lambda raw, _: raw)}
        )
        threaded = grpc.server(ThreadPoolExecutor(8))
        threaded.add_generic_rpc_handlers((handler,))
        print(threaded.add_insecure_port("127.0.0.1:0"), flush=True)
        threaded.start()
        until_stdin_closes()
        threaded.stop(0)
        return

    from grpc import aio

    async def echo_grpc(raw: bytes, context: Any) -> bytes:
        return raw

    async def run() -> None:
        server = aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE, {"ModelInfer": grpc.unary_unary_rpc_method_handler(echo_grpc)}
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        closed = asyncio.Event()
        loop = asyncio.get_running_loop()

        def watch_stdin() -> None:
            until_stdin_closes()
            loop.call_soon_threadsafe(closed.set)

        threading.Thread(target=watch_stdin, daemon=True).start()
        await closed.wait()
        await server.stop(0)

    if kind == "grpc-aio-uvloop":
        import uvloop

        uvloop.run(run())
    else:
        asyncio.run(run())


def _client(kind: str, port: int, load: str, seconds: float, body: Path) -> list[str]:
    connections, streams = LOADS[load]
    duration = max(1, round(seconds))  # both clients take whole seconds
    if kind == "http1":
        total = connections * streams
        script = body.with_suffix(".lua")
        return [
            "wrk",
            f"-c{total}",
            "-t2",
            f"-d{duration}s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}/echo",
        ]
    return [
        "h2load", f"-c{connections}", f"-m{streams}", f"-D{duration}", "-d", str(body),
        "-H", "content-type: application/grpc", "-H", "te: trailers",
        f"http://127.0.0.1:{port}/{SERVICE}/ModelInfer",
    ]  # fmt: skip


def _calls(kind: str, output: str) -> int:
    """Calls answered, from the client's report."""
    if kind == "http1":
        found = re.search(r"(\d+) requests in", output)
        errors = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
        if errors:
            raise RuntimeError(f"wrk: {errors.group(1)} calls failed")
    else:
        found = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded", output)
        failed = re.search(r"(\d+) failed, (\d+) errored", output)
        if failed and (int(failed.group(1)) or int(failed.group(2))):
            raise RuntimeError(f"h2load: {failed.group(0)}")
    if found is None:
        raise RuntimeError(f"no count in the client's report:\n{output}")
    return int(found.group(1))


def measure(kind: str, load: str, seconds: float, body: Path) -> dict[str, float]:
    """One server of `kind` under one load: calls per second and its CPU per call."""
    server = subprocess.Popen(
        [sys.executable, "-m", "loadtests.bench_grpc_floor", "--serve", kind],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        warm = _client(kind, port, load, 1.0, body)
        subprocess.run(warm, check=True, capture_output=True, timeout=60)
        command = _client(kind, port, load, seconds, body)
        before, started = process_cpu_seconds(server.pid), time.perf_counter()
        report = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
        cpu, wall = process_cpu_seconds(server.pid) - before, time.perf_counter() - started
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:  # grpcio's thread pool can hang its stop: it was measured
            server.kill()
            server.wait(timeout=10)
    calls = _calls(kind, report.stdout)
    return {"calls_per_s": calls / wall, "cpu_us_per_call": cpu / calls * 1e6}


def render(saved: dict[str, Any]) -> str:
    lines = [
        "### The transport's own cost: an echo server per library",
        "",
        "`python -m loadtests.bench_grpc_floor`: a 200-byte echo, no model, no hop, driven by C clients "
        "(h2load, wrk); the server process's CPU per call, median over rounds, and its ratio to the HTTP/1.1 "
        "server's in the same round.",
        "",
        "| server | load | calls/s | CPU µs per call | × HTTP/1.1 |",
        "|---|---|---:|---:|---:|",
    ]
    for load in LOADS:
        for kind in SERVERS:
            rounds = saved["rounds"]
            cpu = statistics.median(r[load][kind]["cpu_us_per_call"] for r in rounds)
            rate = statistics.median(r[load][kind]["calls_per_s"] for r in rounds)
            ratio = statistics.median(
                r[load][kind]["cpu_us_per_call"] / r[load]["http1"]["cpu_us_per_call"]
                for r in rounds
            )
            lines.append(f"| {kind} | {load} | {rate:,.0f} | {cpu:.0f} | {ratio:.2f}× |")
    lines += ["", run_line(saved, RESULTS)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    missing = [tool for tool in ("h2load", "wrk") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"needs {', '.join(missing)} (Debian: nghttp2-client, wrk)")
    saved = run_meta(__file__, rounds_asked=args.rounds, seconds_each=args.seconds)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        body = Path(folder) / "call.bin"
        body.write_bytes(b"\0" + len(PAYLOAD).to_bytes(4, "big") + PAYLOAD)  # one gRPC frame
        body.with_suffix(".lua").write_text(
            f'wrk.method = "POST"\nwrk.body = string.rep("x", {len(PAYLOAD)})\n'
            'wrk.headers["Content-Type"] = "application/octet-stream"\n'
        )
        saved["rounds"] = []
        for number in range(args.rounds):
            found: dict[str, dict[str, Any]] = {load: {} for load in LOADS}
            for load in LOADS:
                for kind in SERVERS if number % 2 == 0 else SERVERS[::-1]:
                    found[load][kind] = measure(kind, load, args.seconds, body)
                    print(load, kind, found[load][kind], flush=True)
            saved["rounds"].append(found)
    saved["seconds"] = time.monotonic() - started
    write_results(RESULTS, saved)
    print(render(saved))
    if args.write_docs:
        write_section(DOCS, "bench_grpc_floor", render(saved))


if __name__ == "__main__":
    main()
