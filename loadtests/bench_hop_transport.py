"""Gateway -> container hops over TCP vs over the data port's Unix socket: latency and CPU per hop.

    .venv/bin/python -m loadtests.bench_hop_transport [--rounds 3] [--seconds 5] [--write-docs]

The two real pieces of a hop, each in a process of its own: a container data port's server
(`BackgroundServer` on a TCP listener and on the Unix socket `http.local_socket.listen` makes for
that address, as a container process serves them) answering a 256-number JSON row with a 10-number
answer, and the gateway's `HopClient` (uvloop, as in the gateway) posting to it with `unix_sockets`
off (TCP) and on (the Unix socket), one client of each in one process. This VM's speed drifts ~2x
within seconds, so the transports are interleaved finely rather than run one after the other:
sequential calls (1 caller) alternate them request by request; 32 concurrent callers alternate them
in 0.2 s blocks, with the CPU of the server and the client process (user + system, from /proc)
summed per transport over its blocks. `--seconds` of each transport per load, after 1 s of warm-up;
each round is a fresh client process. The docs report medians over rounds and the ratio Unix / TCP
of each round. No model, no signing, no Ray: what differs is only the transport.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
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

RESULTS = ROOT / "loadtests" / "results" / "bench_hop_transport.json"
DOCS = ROOT / "docs" / "benchmarks" / "bench_hop_transport.md"
MODES = ("tcp", "unix")
LOADS = (1, 32)
BLOCK_S = 0.2  # 32 callers: how long one transport runs before the other takes over
BODY = ("[[" + ",".join(f"{i / 7:.4f}" for i in range(256)) + "]]").encode()
ANSWER = b"[[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0]]"


def serve() -> None:
    """The child: a data port on TCP and its Unix socket; the TCP port on stdout, until stdin
    closes."""
    import socket

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from serving.http import local_socket
    from serving.http.server import BackgroundServer

    async def invoke(request: Request) -> Response:
        await request.body()
        return Response(ANSWER, media_type="application/json")

    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(2048)
    port = tcp.getsockname()[1]
    unix = local_socket.listen("127.0.0.1", port)
    if unix is None:
        raise SystemExit("no safe folder for the Unix socket (see serving/http/local_socket.py)")
    path = unix.getsockname()
    server = BackgroundServer(
        Starlette(routes=[Route("/invocations", invoke, methods=["POST"])]), sock=tcp, also=(unix,)
    )
    server.wait_started()
    print(port, flush=True)
    sys.stdin.read()
    server.stop()
    local_socket.remove(unix, path)


def load(seconds: float, port: int, server_pid: int) -> None:
    """The child: both transports interleaved finely, so that this VM's drift (its speed changes ~2x
    within seconds) falls on both alike; a JSON line of what each saw.

    One caller: requests alternate TCP and Unix socket one by one (the order flips each pair), each
    timed alone. 32 callers: 0.2 s blocks alternate the transport; hops and the CPU of both
    processes (/proc) are summed per transport over its blocks."""
    import uvloop

    from serving.gateway.hop_client import HopClient

    headers = {"content-type": "application/json", "accept": "application/json"}

    async def run() -> dict[str, Any]:
        clients = {mode: HopClient(unix_sockets=mode == "unix") for mode in MODES}

        async def hop(mode: str) -> float:
            started = time.perf_counter()
            answer = await clients[mode].post("127.0.0.1", port, "/invocations", BODY, headers, 10)
            if answer.status != 200 or answer.body != ANSWER:
                raise RuntimeError(f"{mode}: answered {answer.status}")
            return time.perf_counter() - started

        warm_until = time.monotonic() + 1.0
        while time.monotonic() < warm_until:  # connections open, code paths warm
            for mode in MODES:
                await asyncio.gather(*(hop(mode) for _ in range(32)))
        found: dict[str, Any] = {mode: {} for mode in MODES}
        sequential: dict[str, list[float]] = {mode: [] for mode in MODES}
        stop, pair = time.monotonic() + 2 * seconds, 0
        while time.monotonic() < stop:
            for mode in MODES if pair % 2 == 0 else MODES[::-1]:
                sequential[mode].append(await hop(mode))
            pair += 1
        for mode in MODES:
            times = sorted(sequential[mode])
            found[mode]["1"] = {
                "requests": len(times),
                "p50_us": times[len(times) // 2] * 1e6,
                "p99_us": times[int(len(times) * 0.99)] * 1e6,
            }
        totals = {
            mode: {"hops": 0, "wall": 0.0, "server": 0.0, "client": 0.0, "times": []}
            for mode in MODES
        }
        for block in range(int(2 * seconds / BLOCK_S)):
            mode = MODES[block % 2]
            total: dict[str, Any] = totals[mode]
            until = time.monotonic() + BLOCK_S
            server, client, wall = cpu_seconds(server_pid), time.process_time(), time.perf_counter()

            async def caller(
                mode: str = mode, total: dict[str, Any] = total, until: float = until
            ) -> None:
                while time.monotonic() < until:
                    total["times"].append(await hop(mode))

            await asyncio.gather(*(caller() for _ in range(32)))
            total["wall"] += time.perf_counter() - wall
            total["server"] += cpu_seconds(server_pid) - server
            total["client"] += time.process_time() - client
        for mode, total in totals.items():
            times, hops = sorted(total["times"]), len(total["times"])
            found[mode]["32"] = {
                "requests": hops,
                "rps": hops / total["wall"],
                "p50_us": times[hops // 2] * 1e6,
                "p99_us": times[int(hops * 0.99)] * 1e6,
                "server_us": total["server"] * 1e6 / hops,
                "client_us": total["client"] * 1e6 / hops,
            }
        for client in clients.values():
            client.close()
        return found

    print(json.dumps(uvloop.run(run())), flush=True)


def one_round(seconds: float, port: int, server_pid: int) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtests.bench_hop_transport",
            "--load",
            str(seconds),
            str(port),
            str(server_pid),
        ],
        capture_output=True,
        text=True,
        timeout=4 * seconds + 60,
        cwd=ROOT,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def docs_section(saved: dict[str, Any]) -> str:
    rounds = saved["rounds"]

    def med(mode: str, callers: int, key: str) -> float:
        return statistics.median(r[mode][str(callers)][key] for r in rounds)

    def cpu(r: dict, mode: str) -> float:
        return r[mode]["32"]["server_us"] + r[mode]["32"]["client_us"]

    ratio_rows = {
        "p50 latency, 1 caller": [
            r["unix"]["1"]["p50_us"] / r["tcp"]["1"]["p50_us"] for r in rounds
        ],
        "p50 latency, 32 callers": [
            r["unix"]["32"]["p50_us"] / r["tcp"]["32"]["p50_us"] for r in rounds
        ],
        "hops/s, 32 callers": [r["unix"]["32"]["rps"] / r["tcp"]["32"]["rps"] for r in rounds],
        "CPU per hop at both ends, 32 callers": [cpu(r, "unix") / cpu(r, "tcp") for r in rounds],
    }
    names = {"tcp": "TCP", "unix": "Unix socket"}
    rows = [
        f"| 1 | {names[mode]} | {med(mode, 1, 'p50_us'):,.0f} | {med(mode, 1, 'p99_us'):,.0f} | | | |"
        for mode in MODES
    ]
    rows += [
        f"| 32 | {names[mode]} | {med(mode, 32, 'p50_us'):,.0f} | {med(mode, 32, 'p99_us'):,.0f} "
        f"| {med(mode, 32, 'rps'):,.0f} | {med(mode, 32, 'server_us'):.0f} | {med(mode, 32, 'client_us'):.0f} |"
        for mode in MODES
    ]
    lines = [
        "## Hops over a Unix socket",
        "",
        "The gateway's hop to a container replica on its own machine goes through the Unix socket beside the",
        "replica's data port (`serving/http/local_socket.py`; setting `hop_unix_socket`, on by default), not TCP.",
        "Measured on the two real pieces, each in its own process: a data port's `BackgroundServer` serving TCP and",
        "the Unix socket, answering a 256-number JSON row, and the gateway's `HopClient` with Unix sockets off and",
        "on, interleaved finely because this VM's speed drifts within seconds: one caller alternating the",
        "transports request by request, then 32 callers in 0.2 s blocks alternating them, CPU of both processes",
        f"summed per transport; {saved['seconds_per_case']:g} s of each per load, {len(rounds)} rounds, medians of",
        "the rounds (`loadtests/bench_hop_transport.py` has the method).",
        "",
        "| callers | transport | p50 µs | p99 µs | hops/s | server CPU µs/hop | client CPU µs/hop |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "| Unix socket / TCP | per round | median |",
        "|---|---|---|",
        *(
            f"| {label} | {', '.join(f'{v:.2f}' for v in values)} | {statistics.median(values):.2f} |"
            for label, values in ratio_rows.items()
        ),
        "",
        "A direct invocation makes one such hop, a Serial chain one per container; the hop is a small part of an",
        "invocation's CPU (bench_invoke: the gateway's and the container's HTTP work around the model, ~1,900 µs per",
        "request in all), so an endpoint gains at most what the last row saves on that part. A replica on another",
        "node, a streamed answer (aiohttp's TCP connector), and a replica whose socket is missing or refuses (a",
        "replica that died leaves its file; the gateway then uses TCP for it) go over TCP.",
        "",
        run_line(saved, RESULTS),
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return 0
    if args.load:
        seconds, port, server_pid = args.load
        load(float(seconds), int(port), int(server_pid))
        return 0
    started, clock = dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), time.perf_counter()
    machine = machine_facts()
    server = subprocess.Popen(
        [sys.executable, "-m", "loadtests.bench_hop_transport", "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    rounds = []
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        for index in range(args.rounds):
            found = one_round(args.seconds, port, server.pid)
            print(index, json.dumps(found), flush=True)
            rounds.append(found)
    finally:
        if server.stdin:
            server.stdin.close()
        server.wait(30)
    saved = {
        "started": started,
        "seconds": time.perf_counter() - clock,
        "command": command_line(__file__),
        "machine": machine,
        "seconds_per_case": args.seconds,
        "rounds": rounds,
    }
    write_results(RESULTS, saved)
    print(docs_section(saved))
    if args.write_docs:
        write_section(DOCS, "bench_hop_transport", docs_section(saved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
