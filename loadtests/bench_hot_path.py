"""What serving the invocation route ahead of Starlette's middleware (serving.http.hot_path) saves
per request.

Both apps that every invocation crosses are driven in this process through ASGI (no sockets, so HTTP
parsing, which is the same either way, is left out), with the hot path (`HotPath`) and without it
(the same Starlette app, `HotPath.app`, whose first route is the invocation route: the shortest
route walk it can have):

- **container**: a container's data port (`ContainerApp`) with the scikit-learn stack on the iris
  pipeline of bench_invoke (skops), answering signed hops as behind the gateway, its prediction on
  the event loop;
- **gateway**: the gateway's `Router` for one Direct endpoint without AccessControl, its hop going
  over TCP to the floor server (loadtests/harness/floor_server.py) in another process, so that only
  the gateway's own work is timed.

Modes alternate between blocks of `--requests` sequential requests, in the order without, with,
with, without, ... (`--pairs` of each), so that this VM's speed, which drifts by up to 2x within
minutes, falls on both alike. A block's figure is the driving thread's CPU time per request
(`time.thread_time`).

    python -m loadtests.bench_hot_path [--requests 500] [--pairs 30] [--write-docs]

Results: loadtests/results/bench_hot_path.json; with --write-docs, its section of
docs/benchmarks/bench_hot_path.md.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

from loadtests.harness.models import iris_models
from loadtests.harness.peers import start_floor
from loadtests.harness.processes import Processes
from loadtests.harness.results import (
    ROOT,
    command_line,
    machine_facts,
    package_versions,
    write_results,
    write_section,
)
from serving import protocol
from serving.gateway.router import EndpointRoute, Router
from serving.gateway.transport import ContainerTransport
from serving.http.hot_path import HotPath
from serving.http.responses import serving_app
from serving.model_server.app import build_container_app
from serving.runtimes import runtime_for
from serving.runtimes.concurrency import inline_budget_s
from serving.settings import ServerSettings
from serving.trust import hops

BODY = b"[[5.1, 3.5, 1.4, 0.2]]"
ANSWER = b"[0]"
HOP_KEY = b"bench-hot-path-key-of-32-bytes!!"
ENDPOINT, CONTAINER = "bench", "iris"

Call = Callable[[], Awaitable[None]]


def asgi_call(app: Any, path: str, headers: Callable[[], dict[str, str]]) -> Call:
    """One POST of BODY to `app` through ASGI, checked to answer 200 with ANSWER."""

    async def call() -> None:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": BODY, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(k.encode(), v.encode()) for k, v in headers().items()],
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8080),
        }
        await app(scope, receive, send)
        if sent[0]["status"] != 200 or sent[-1]["body"] != ANSWER:
            raise SystemExit(
                f"unexpected answer from {path}: {sent[0]['status']} {sent[-1].get('body')!r}"
            )

    return call


async def block(call: Call, requests: int) -> float:
    """The driving thread's CPU per request (µs) over `requests` sequential calls."""
    started = time.thread_time()
    for _ in range(requests):
        await call()
    return (time.thread_time() - started) / requests * 1e6


async def alternate(calls: dict[str, Call], requests: int, pairs: int) -> dict[str, list[float]]:
    blocks: dict[str, list[float]] = {"without": [], "with": []}
    for mode in calls:  # settle both
        await block(calls[mode], requests // 5 or 1)
    for i in range(2 * pairs):
        mode = "with" if i % 4 in (1, 2) else "without"
        blocks[mode].append(await block(calls[mode], requests))
    return blocks


def container_calls(model_dir: Path) -> dict[str, Call]:
    runtime = runtime_for("sklearn", model_dir, {})
    runtime.load()
    app = build_container_app(
        runtime, CONTAINER, hop_key=HOP_KEY, inline_budget_s=inline_budget_s({})
    )
    assert isinstance(app.app, HotPath)

    def signed() -> dict[str, str]:
        plain = {
            "content-type": "application/json",
            "accept": "application/json",
            "content-length": str(len(BODY)),
        }
        return plain | hops.sign(HOP_KEY, "POST", protocol.INVOCATIONS_PATH, BODY, plain)

    return {
        "without": asgi_call(app.app.app, protocol.INVOCATIONS_PATH, signed),
        "with": asgi_call(app.app, protocol.INVOCATIONS_PATH, signed),
    }


def gateway_calls(router: Router) -> dict[str, Call]:
    app = serving_app(router.routes(), hot=router.hot_route())
    assert isinstance(app, HotPath)
    path = f"/endpoints/{ENDPOINT}/invocations"

    def plain() -> dict[str, str]:
        return {
            "content-type": "application/json",
            "accept": "application/json",
            "content-length": str(len(BODY)),
        }

    return {"without": asgi_call(app.app, path, plain), "with": asgi_call(app, path, plain)}


def summary(blocks: dict[str, list[float]]) -> dict[str, float]:
    """Means of each mode's blocks, and the saving per pair of neighbouring blocks (its quartiles:
    the spread)."""
    without, with_ = statistics.mean(blocks["without"]), statistics.mean(blocks["with"])
    q1, _, q3 = statistics.quantiles(
        [a - b for a, b in zip(blocks["without"], blocks["with"], strict=True)], n=4
    )
    return {
        "cpu_us_without": without,
        "cpu_us_with": with_,
        "saved_us": without - with_,
        "ratio": with_ / without,
        "saved_us_q1": q1,
        "saved_us_q3": q3,
    }


async def measure(
    model_dir: Path, floor_url: str, requests: int, pairs: int
) -> dict[str, dict[str, list[float]]]:
    transport = ContainerTransport(default_limit=64)
    router = Router(ServerSettings(host="127.0.0.1"), transport)
    router.endpoints = {ENDPOINT: EndpointRoute(ENDPOINT, "Direct", (CONTAINER,))}
    transport.update({(ENDPOINT, CONTAINER): [floor_url]})
    await transport.start()
    try:
        return {
            "container": await alternate(container_calls(model_dir), requests, pairs),
            "gateway": await alternate(gateway_calls(router), requests, pairs),
        }
    finally:
        await transport.close()


def docs_section(result: dict) -> str:
    meta = result["meta"]
    rows = [
        "| app | CPU per request without → with the hot path | saved | saved per pair of blocks, quartiles | ratio |",
        "|---|---|---|---|---|",
    ]
    for app, s in result["cases"].items():
        rows.append(
            f"| {app} | {s['cpu_us_without']:.0f} → {s['cpu_us_with']:.0f} µs | {s['saved_us']:.0f} µs "
            f"| {s['saved_us_q1']:.0f} to {s['saved_us_q3']:.0f} µs | {s['ratio']:.3f}× |"
        )
    return "\n".join(
        [
            "## The invocation route ahead of Starlette's middleware: measured",
            "",
            "The route that carries invocations skips Starlette's two exception middlewares, its route walk and the",
            "route's exception wrapper (`serving/http/hot_path.py`; the same exception handlers answer its errors).",
            "Both apps every invocation crosses, driven in one process through ASGI, with and without it, in alternating",
            f"blocks of {meta['requests']} requests ({meta['pairs']} blocks of each): the container's data port (the",
            "scikit-learn iris pipeline, signed hops, prediction included) and the gateway's router (its hop to the floor",
            "server in another process, not counted). CPU of the driving thread per request; HTTP parsing, the same",
            'either way, is not in it. "Without" has the invocation route first, the shortest route walk there is (in',
            "the gateway it came after five other routes), so the gateway's saving is, if anything, larger in service:",
            "",
            *rows,
            "",
            f"Run: `{meta['command']}` at {meta['started']} ({meta['seconds']:.0f} s); {meta['machine']['nproc']} CPUs "
            f"({meta['machine']['cpu_model']}), load average before {meta['machine']['loadavg_at_start']}. "
            "Results: `loadtests/results/bench_hot_path.json`.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=500, help="requests per block")
    parser.add_argument("--pairs", type=int, default=30, help="blocks per mode and app")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "loadtests" / "results" / "bench_hot_path.json"
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    meta = {
        "command": command_line(__file__),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "versions": package_versions(("starlette", "uvloop", "scikit-learn")),
        "requests": args.requests,
        "pairs": args.pairs,
    }
    processes = Processes()
    with tempfile.TemporaryDirectory(prefix="bench-hot-path-") as work:
        paths = iris_models(Path(work))
        logs = Path(work) / "logs"
        logs.mkdir()
        try:
            floor, floor_url = start_floor(processes, paths, logs)
            blocks = uvloop.run(measure(paths["skops_dir"], floor_url, args.requests, args.pairs))
        finally:
            processes.stop_all()
    cases = {app: summary(b) for app, b in blocks.items()}
    for app, s in cases.items():
        print(
            f"{app}: CPU/request {s['cpu_us_without']:.0f} -> {s['cpu_us_with']:.0f} us "
            f"(saved {s['saved_us']:.0f} us, {s['ratio']:.3f}x)",
            flush=True,
        )
    meta["seconds"] = time.monotonic() - started
    result = {"meta": meta, "cases": cases, "blocks": blocks}
    write_results(args.out, result)
    if args.write_docs:
        write_section(
            ROOT / "docs" / "benchmarks" / "bench_hot_path.md",
            "bench_hot_path",
            docs_section(result),
        )


if __name__ == "__main__":
    main()
