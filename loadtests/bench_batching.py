"""Batching and model threads: one container's data port under concurrent single-row requests.

    .venv/bin/python loadtests/bench_batching.py run --out DIR [--seconds 5] [--clients 32] [--cpus 2]
    .venv/bin/python loadtests/bench_batching.py docs DIR/bench_batching.json   # its part of docs/performance.md

Builds a TorchScript MLP with torch (no downloads), loads it through the pytorch stack as a replica does
(`SERVING_CPUS` = --cpus), and drives `ContainerApp` in this process over httpx's ASGI transport (no network,
no Ray) with --clients concurrent callers, each sending one NPY row at a time, for --seconds per case. Cases
differ only in the app's model threads and Batching; each reports requests/s and p50/p99 latency, and its
throughput as a ratio against the first case (one thread, no batching) of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from loadtests.harness.results import machine_facts, write_results, write_section  # noqa: E402

WIDTHS = [256, 1024, 1024, 10]
CASES = [  # (label, threads, max batch size or None, max delay ms)
    ("1 thread, no batching", 1, None, 0.0),
    ("2 threads, no batching", 2, None, 0.0),
    ("1 thread, MaxBatchSize 32, MaxDelayMs 0", 1, 32, 0.0),
    ("1 thread, MaxBatchSize 32, MaxDelayMs 2", 1, 32, 2.0),
    ("2 threads, MaxBatchSize 32, MaxDelayMs 2", 2, 32, 2.0),
]


def build_model(folder: Path) -> Path:
    import torch

    torch.manual_seed(0)
    layers: list[Any] = []
    for a, b in zip(WIDTHS, WIDTHS[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    folder.mkdir(parents=True, exist_ok=True)
    torch.jit.script(torch.nn.Sequential(*layers[:-1]).eval()).save(str(folder / "model.pt"))
    return folder


async def drive(app: Any, body: bytes, clients: int, seconds: float) -> list[float]:
    import httpx

    latencies: list[float] = []
    stop = time.monotonic() + seconds
    headers = {"content-type": "application/x-npy", "accept": "application/json"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as client:

        async def caller() -> None:
            while time.monotonic() < stop:
                started = time.perf_counter()
                response = await client.post("/invocations", content=body, headers=headers)
                response.raise_for_status()
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(caller() for _ in range(clients)))
    return latencies


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from serving.model_server.app import ContainerApp
    from serving.runtimes import runtime_for
    from serving.runtimes.concurrency import BatchSettings

    with tempfile.TemporaryDirectory() as scratch:
        runtime = runtime_for("pytorch", build_model(Path(scratch) / "mlp"), {"SERVING_CPUS": str(args.cpus)})
        runtime.load()
        buffer = io.BytesIO()
        np.save(buffer, np.random.default_rng(0).standard_normal((1, WIDTHS[0])).astype(np.float32))
        body = buffer.getvalue()
        rows = []
        for label, threads, size, delay_ms in CASES:
            batching = BatchSettings(size, delay_ms / 1000) if size else None
            asyncio.run(drive(ContainerApp(runtime, "bench", threads=threads, batching=batching), body, 4, 0.5))
            app = ContainerApp(runtime, "bench", threads=threads, batching=batching)
            latencies = asyncio.run(drive(app, body, args.clients, args.seconds))
            latencies.sort()
            rows.append(
                {
                    "case": label,
                    "requests_per_s": len(latencies) / args.seconds,
                    "p50_ms": statistics.median(latencies) * 1000,
                    "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    import torch

    report = {
        "machine": machine_facts(),
        "torch": torch.__version__,
        "clients": args.clients,
        "seconds": args.seconds,
        "cpus": args.cpus,
        "widths": WIDTHS,
        "rows": rows,
        "load_average": Path("/proc/loadavg").read_text().split()[:3],
    }
    write_results(Path(args.out) / "bench_batching.json", report)
    return 0


def render(report: dict[str, Any]) -> str:
    base = report["rows"][0]["requests_per_s"]
    machine = report["machine"]
    lines = [
        "### Measured: one pytorch replica under concurrent single-row requests",
        "",
        f"`loadtests/bench_batching.py` on {machine['nproc']} cores ({machine['cpu_model']}), torch {report['torch']}, "
        f"`SERVING_CPUS` {report['cpus']}: an MLP {' -> '.join(map(str, report['widths']))}, "
        f"{report['clients']} concurrent callers over httpx's ASGI transport (in process, no network, no Ray), "
        f"{report['seconds']:g} s per case; load average at the end {' '.join(report['load_average'])}.",
        "",
        "| case | requests/s | vs 1 thread, no batching | p50 ms | p99 ms |",
        "|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['case']} | {row['requests_per_s']:,.0f} | {row['requests_per_s'] / base:.2f} | "
            f"{row['p50_ms']:.1f} | {row['p99_ms']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser("run")
    measure.add_argument("--out", required=True)
    measure.add_argument("--seconds", type=float, default=5.0)
    measure.add_argument("--clients", type=int, default=32)
    measure.add_argument("--cpus", type=float, default=2.0)
    docs = commands.add_parser("docs")
    docs.add_argument("results")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args)
    text = render(json.loads(Path(args.results).read_text()))
    write_section(ROOT / "docs" / "performance.md", "bench_batching", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
