"""One router hop, measured alone: sequential aiohttp POSTs on uvloop to a container's data port.

Run by loadtests/bench_invoke.py in a fresh process (not the Ray driver, whose threads
would compete for the GIL), with the client settings of serving/transport.py:

    python loadtests/hop_client.py URL BODY SECONDS [HEADERS_JSON]

Prints one JSON line: requests, p50_ms, p99_ms, mean_ms. Compared with wrk's latency
on the same port, it shows what the router's HTTP client adds to each hop.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

import aiohttp
import uvloop


async def measure(url: str, body: bytes, seconds: float, headers: dict[str, str]) -> list[float]:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
    samples: list[float] = []
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                     skip_auto_headers=("User-Agent",)) as session:
        timeout = aiohttp.ClientTimeout(total=10)
        warm_until = time.perf_counter() + min(1.0, seconds / 4)
        deadline = warm_until + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            async with session.post(url, data=body, headers=headers, timeout=timeout) as response:
                await response.read()
                if response.status != 200:
                    raise SystemExit(f"{url}: HTTP {response.status}")
            if start > warm_until:
                samples.append((time.perf_counter() - start) * 1000)
    return samples


def main() -> None:
    url, body, seconds = sys.argv[1], sys.argv[2].encode(), float(sys.argv[3])
    headers = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {"content-type": "application/json"}
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        samples = sorted(runner.run(measure(url, body, seconds, headers)))
    print(json.dumps({
        "requests": len(samples), "p50_ms": round(samples[len(samples) // 2], 3),
        "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 3),
        "mean_ms": round(statistics.fmean(samples), 3),
    }))


if __name__ == "__main__":
    main()
