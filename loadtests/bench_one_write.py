"""What sending a response's head with its body (serving.http.one_write) saves per hop, measured in
one process.

One process runs this runtime's HTTP server (`BackgroundServer`, uvicorn with
`LimitedHttpToolsProtocol`, on its own thread) with a minimal `/invocations` app, and the gateway's
hop client (`serving.gateway.hop_client`, uvloop) on the main thread calling it at 1, 8 and 32
requests in flight. The held head is switched on and off between blocks of `--block` seconds, in the
order off, on, on, off, ... (`--pairs` of each), so that this VM's speed, which drifts by up to 2x
within minutes, falls on both alike. Each block reports the process's CPU per request (server and
client together: the saving is on both sides of the socket), the median latency and the server
thread's socket writes per response (its `syscw`, /proc/self/task/TID/io).

    python -m loadtests.bench_one_write [--block 1.0] [--pairs 20] [--write-docs]

Results: loadtests/results/bench_one_write.json; with --write-docs, its section of
docs/benchmarks/bench_one_write.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import time
from pathlib import Path

import uvloop

import serving.http.limits as limits
from loadtests.harness.results import (
    ROOT,
    command_line,
    machine_facts,
    package_versions,
    write_results,
    write_section,
)
from serving.gateway.hop_client import HopClient
from serving.http.one_write import HeldHeadTransport
from serving.http.server import BackgroundServer

BODY = b"[[5.1, 3.5, 1.4, 0.2]]"
ANSWER = b'{"predictions": [0]}'


async def invocations(scope, receive, send):
    """A container's data port with no model: read the body, answer 20 bytes (Starlette's Response
    does the same)."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(ANSWER)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": ANSWER})


def held_head(on: bool) -> None:
    """What the protocol wraps each response's transport in: the held head, or the transport
    itself."""
    limits.HeldHeadTransport = HeldHeadTransport if on else (lambda transport, loop: transport)  # type: ignore[assignment]


def server_writes(server: BackgroundServer) -> int:
    text = Path(f"/proc/self/task/{server._thread.native_id}/io").read_text()
    return int(dict(line.split(": ") for line in text.splitlines())["syscw"])


async def block(
    server: BackgroundServer, client: HopClient, in_flight: int, seconds: float
) -> dict[str, float]:
    latencies: list[float] = []

    async def worker(until: float, keep: bool) -> None:
        while time.monotonic() < until:
            start = time.perf_counter()
            answer = await client.post(
                server.host,
                server.port,
                "/invocations",
                BODY,
                {"content-type": "application/json"},
                10,
            )
            if answer.status != 200 or answer.body != ANSWER:
                raise SystemExit(f"unexpected answer: {answer.status} {answer.body!r}")
            if keep:
                latencies.append(time.perf_counter() - start)

    # settle in this mode
    await asyncio.gather(*(worker(time.monotonic() + 0.1, False) for _ in range(in_flight)))
    cpu, writes, began = time.process_time(), server_writes(server), time.monotonic()
    await asyncio.gather(*(worker(began + seconds, True) for _ in range(in_flight)))
    n = len(latencies)
    return {
        "cpu_us": (time.process_time() - cpu) / n * 1e6,
        "p50_us": statistics.median(latencies) * 1e6,
        "req_s": n / (time.monotonic() - began),
        "writes": (server_writes(server) - writes) / n,
    }


async def run(
    server: BackgroundServer, in_flight: int, seconds: float, pairs: int
) -> dict[str, list[dict[str, float]]]:
    client = HopClient()
    blocks: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    try:
        for i in range(2 * pairs):
            on = i % 4 in (1, 2)  # off, on, on, off, ...
            held_head(on)
            blocks["on" if on else "off"].append(await block(server, client, in_flight, seconds))
    finally:
        held_head(True)
        client.close()
    return blocks


def summary(blocks: dict[str, list[dict[str, float]]]) -> dict[str, float]:
    mean = {
        mode: {key: statistics.mean(b[key] for b in blocks[mode]) for key in blocks[mode][0]}
        for mode in blocks
    }
    return {
        "cpu_us_off": mean["off"]["cpu_us"],
        "cpu_us_on": mean["on"]["cpu_us"],
        "cpu_ratio": mean["on"]["cpu_us"] / mean["off"]["cpu_us"],
        "p50_us_off": mean["off"]["p50_us"],
        "p50_us_on": mean["on"]["p50_us"],
        "req_s_ratio": mean["on"]["req_s"] / mean["off"]["req_s"],
        "writes_off": mean["off"]["writes"],
        "writes_on": mean["on"]["writes"],
    }


def docs_section(result: dict) -> str:
    rows = [
        "| requests in flight | CPU per request, head apart → held | ratio | p50 (µs), apart → held | req/s ratio "
        "| server socket writes per response |",
        "|---|---|---|---|---|---|",
    ]
    for in_flight, s in result["cases"].items():
        rows.append(
            f"| {in_flight} | {s['cpu_us_off']:.0f} → {s['cpu_us_on']:.0f} µs | {s['cpu_ratio']:.3f}× "
            f"| {s['p50_us_off']:.0f} → {s['p50_us_on']:.0f} | {s['req_s_ratio']:.3f}× "
            f"| {s['writes_off']:.2f} → {s['writes_on']:.2f} |"
        )
    meta = result["meta"]
    return "\n".join(
        [
            "## One write per response: measured",
            "",
            "A response's head waits for its body and both go out in one write (`serving/http/one_write.py`). One process,",
            "this runtime's HTTP server on its thread and the gateway's hop client on the main thread (uvloop), the held",
            f"head switched off and on between {meta['block_s']:g} s blocks ({meta['pairs']} of each, off/on/on/off order);",
            "CPU per request is both sides together, since a write's cost lands on the sender and the receiver:",
            "",
            *rows,
            "",
            f"Run: `{meta['command']}` at {meta['started']} ({meta['seconds']:.0f} s); {meta['machine']['nproc']} CPUs "
            f"({meta['machine']['cpu_model']}), load average before {meta['machine']['loadavg_at_start']}. "
            "Results: `loadtests/results/bench_one_write.json`.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--block", type=float, default=1.0, help="seconds per block")
    parser.add_argument("--pairs", type=int, default=20, help="blocks per mode and case")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "loadtests" / "results" / "bench_one_write.json"
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    meta = {
        "command": command_line(__file__),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "versions": package_versions(("uvicorn", "uvloop", "httptools")),
        "block_s": args.block,
        "pairs": args.pairs,
    }
    server = BackgroundServer(invocations)
    if not server.wait_started():
        raise SystemExit("the server did not start")
    cases, blocks = {}, {}
    try:
        for in_flight in args.in_flight:
            blocks[in_flight] = uvloop.run(run(server, in_flight, args.block, args.pairs))
            cases[in_flight] = summary(blocks[in_flight])
            s = cases[in_flight]
            print(
                f"{in_flight} in flight: CPU/request {s['cpu_us_off']:.1f} -> {s['cpu_us_on']:.1f} us "
                f"({s['cpu_ratio']:.3f}x), p50 {s['p50_us_off']:.0f} -> {s['p50_us_on']:.0f} us, "
                f"writes/response {s['writes_off']:.2f} -> {s['writes_on']:.2f}",
                flush=True,
            )
    finally:
        server.stop()
    meta["seconds"] = time.monotonic() - started
    result = {"meta": meta, "cases": cases, "blocks": blocks}
    write_results(args.out, result)
    if args.write_docs:
        write_section(
            ROOT / "docs" / "benchmarks" / "bench_one_write.md",
            "bench_one_write",
            docs_section(result),
        )


if __name__ == "__main__":
    main()
