"""One router hop, measured alone: sequential POSTs with the gateway's own hop client
(`serving.gateway.hop_client`) on uvloop to a container's data port.

Run by bench_invoke in a fresh process (not the Ray driver, whose threads
would compete for the GIL):

    python -m loadtests.harness.hop_client URL BODY SECONDS [HEADERS_JSON]

Prints one JSON line: requests, p50_ms, p99_ms, mean_ms, cpu_us (this process's CPU per request).
Compared with wrk's latency on the same port, it shows what the router's HTTP client adds to each
hop.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import urllib.parse

import uvloop

from serving.gateway.hop_client import HopClient


async def measure(
    url: str, body: bytes, seconds: float, headers: dict[str, str]
) -> tuple[list[float], float]:
    parts = urllib.parse.urlsplit(url)
    client = HopClient()
    samples: list[float] = []
    warm_until = time.perf_counter() + min(1.0, seconds / 4)
    deadline = warm_until + seconds
    cpu_at_warm = None
    try:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            if start > warm_until and cpu_at_warm is None:
                cpu_at_warm = time.process_time()
            answer = await client.post(
                parts.hostname or "", parts.port or 80, parts.path, body, headers, 10
            )
            if answer.status != 200:
                raise SystemExit(f"{url}: HTTP {answer.status}")
            if start > warm_until:
                samples.append((time.perf_counter() - start) * 1000)
    finally:
        client.close()
    cpu = time.process_time() - (cpu_at_warm or 0.0)
    return samples, cpu


def main() -> None:
    url, body, seconds = sys.argv[1], sys.argv[2].encode(), float(sys.argv[3])
    headers = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {"content-type": "application/json"}
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        samples, cpu = runner.run(measure(url, body, seconds, headers))
    samples.sort()
    print(
        json.dumps(
            {
                "requests": len(samples),
                "p50_ms": round(samples[len(samples) // 2], 3),
                "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 3),
                "mean_ms": round(statistics.fmean(samples), 3),
                "cpu_us": round(cpu / len(samples) * 1e6, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
