"""A closed-loop gRPC load driver, wrk's counterpart for unary calls: `concurrency` calls kept in
flight for a while.

It runs as its own process (`run`), so that its CPU is not the benchmark's, and sends one serialized
message over and over without parsing answers beyond their status: what it costs is the same for
every server it drives. One HTTP/2 channel carries the calls, as a gRPC client does (wrk's 32
connections are 32 streams here).

    python -m loadtests.harness.grpc_load TARGET METHOD MESSAGE_FILE CONCURRENCY SECONDS
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadtests.harness.processes import BenchError


async def _drive(
    target: str, method: str, message: bytes, concurrency: int, seconds: float
) -> dict[str, Any]:
    import grpc

    latencies: list[float] = []
    errors = 0
    async with grpc.aio.insecure_channel(
        target, options=[("grpc.max_receive_message_length", -1)]
    ) as channel:
        call = channel.unary_unary(method)
        await call(message, timeout=30)  # the channel open, the path warm
        started = time.perf_counter()
        deadline = started + seconds

        async def loop() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                sent = time.perf_counter()
                try:
                    await call(message, timeout=30)
                    latencies.append(time.perf_counter() - sent)
                except grpc.RpcError:
                    errors += 1

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        duration = time.perf_counter() - started
    latencies.sort()
    pick = lambda q: (
        latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e6 if latencies else 0.0
    )  # noqa: E731
    return {
        "requests": len(latencies),
        "errors": errors,
        "duration_us": duration * 1e6,
        "p50": pick(0.5),
        "p99": pick(0.99),
    }


def run(
    target: str, method: str, message: Path, concurrency: int, seconds: float
) -> dict[str, Any]:
    """One run in a child process: requests, errors, duration_us, p50 and p99 (µs), as wrk's runs
    report them."""
    command = [
        sys.executable,
        "-m",
        "loadtests.harness.grpc_load",
        target,
        method,
        str(message),
        str(concurrency),
        str(seconds),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        raise BenchError(f"gRPC load on {target}{method} failed: {done.stderr[-800:]}")
    return json.loads(done.stdout)


if __name__ == "__main__":
    target, method, message, concurrency, seconds = sys.argv[1:6]
    print(
        json.dumps(
            asyncio.run(
                _drive(target, method, Path(message).read_bytes(), int(concurrency), float(seconds))
            )
        )
    )
