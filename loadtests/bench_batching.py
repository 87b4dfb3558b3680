"""Batching and model threads: one MLP under concurrent single-row requests, in process and over
HTTP.

    .venv/bin/python -m loadtests.bench_batching http --out DIR [--duration 15] [--wait-quiet 60]
    [--write-docs] .venv/bin/python -m loadtests.bench_batching run --out DIR [--seconds 5]
    [--clients 32] [--cpus 2] .venv/bin/python -m loadtests.bench_batching docs
    DIR/bench_batching.json # its part of docs/benchmarks/bench_batching.md

`http` (the issue's benchmark, loadtests/batching/over_http.py): an MLP of 1.3 M parameters as
TorchScript and ONNX, served by our endpoint (pytorch and onnx stacks, through the gateway) and by
MLServer 1.7.1 (a custom runtime for each, as a user would write; in .bench/mlserver-venv), each
with and without batching at the same limits (32 rows, 2 ms), loaded by wrk with 64 connections of
one-row JSON requests. Reports requests/s, latency and CPU per request, and the ratios
batched/unbatched and ours/MLServer from the same run.

`run`: builds the same TorchScript MLP, loads it through the pytorch stack as a replica does
(`SERVING_CPUS` = --cpus), and drives `ContainerApp` in this process over httpx's ASGI transport (no
network, no Ray) with --clients concurrent callers, each sending one NPY row at a time, for
--seconds per case. Cases differ only in the app's model threads and Batching; each reports
requests/s and p50/p99 latency, and its throughput as a ratio against the first case (one thread, no
batching) of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.batching.over_http import WIDTHS, build_models
from loadtests.harness.cpu import OTHER
from loadtests.harness.results import ROOT, machine_facts, write_results, write_section

CASES = [  # (label, threads, max batch size or None, max delay ms)
    ("1 thread, no batching", 1, None, 0.0),
    ("2 threads, no batching", 2, None, 0.0),
    ("1 thread, MaxBatchSize 32, MaxDelayMs 0", 1, 32, 0.0),
    ("1 thread, MaxBatchSize 32, MaxDelayMs 2", 1, 32, 2.0),
    ("2 threads, MaxBatchSize 32, MaxDelayMs 2", 2, 32, 2.0),
]


async def drive(app: Any, body: bytes, clients: int, seconds: float) -> list[float]:
    import httpx

    latencies: list[float] = []
    stop = time.monotonic() + seconds
    headers = {"content-type": "application/x-npy", "accept": "application/json"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://bench"
    ) as client:

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

    from serving.model_server.app import build_container_app
    from serving.runtimes import runtime_for
    from serving.runtimes.concurrency import BatchSettings

    with tempfile.TemporaryDirectory() as scratch:
        runtime = runtime_for(
            "pytorch",
            build_models(Path(scratch) / "mlp")["torch"],
            {"SERVING_CPUS": str(args.cpus)},
        )
        runtime.load()
        buffer = io.BytesIO()
        np.save(buffer, np.random.default_rng(0).standard_normal((1, WIDTHS[0])).astype(np.float32))
        body = buffer.getvalue()
        rows = []
        for label, threads, size, delay_ms in CASES:
            batching = BatchSettings(size, delay_ms / 1000) if size else None
            asyncio.run(
                drive(
                    build_container_app(runtime, "bench", threads=threads, batching=batching),
                    body,
                    4,
                    0.5,
                )
            )
            app = build_container_app(runtime, "bench", threads=threads, batching=batching)
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


def run_http(args: argparse.Namespace) -> int:
    """The issue's benchmark: ours vs MLServer, batched vs not, over HTTP at 64 connections (see
    over_http)."""
    from dataclasses import asdict

    from loadtests.batching import over_http
    from loadtests.harness.cpu import CpuMeter
    from loadtests.harness.peers import ensure_mlserver, mlserver_versions
    from loadtests.harness.processes import Processes, install_interrupts, log
    from loadtests.harness.results import command_line, our_versions
    from loadtests.harness.wrk import Wrk, ensure_wrk

    install_interrupts()
    work = Path(tempfile.mkdtemp(prefix="bench-batching-"))
    machine = machine_facts()  # the load average before the run
    processes = Processes()
    try:
        wrk = Wrk(ensure_wrk(), work, CpuMeter(), quiet_wait=args.wait_quiet, retries=args.retries)
        mlserver = ensure_mlserver(args.mlserver_venv)
        over_http.mlserver_ensure_frameworks(args.mlserver_venv)
        measured = over_http.measure(wrk, processes, mlserver, work, args.duration, args.warmup)
    finally:
        processes.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    import torch

    report = {
        "command": command_line(__file__),
        "machine": machine,
        "versions": our_versions() | {"torch": torch.__version__},
        "mlserver_versions": mlserver_versions(args.mlserver_venv),
        "widths": over_http.WIDTHS,
        "connections": over_http.CONNECTIONS,
        "max_batch_size": over_http.MAX_BATCH,
        "max_delay_ms": over_http.DELAY_MS,
        "cpus": over_http.CPUS,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "cases": [asdict(case) for case in measured["cases"]],
        "ratios": over_http.ratios(measured["cases"]),
        "model_cost": measured["model_cost"],
        "load_average_at_end": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
    }
    write_results(Path(args.out) / "bench_batching.json", report)
    log(f"ratios: {json.dumps(report['ratios'])}")
    if args.write_docs:
        write_section(
            ROOT / "docs" / "benchmarks" / "bench_batching.md", "bench_batching", render(report)
        )
    return 0


def server_cpu_us(per_request: dict[str, float]) -> float:
    """CPU per request of the server's processes (all of them, Ray's included): not wrk, this driver
    or others."""
    skip = (OTHER, "wrk (load generator)", "bench driver (also the Ray driver)")
    return sum(value for name, value in per_request.items() if name not in skip)


def model_cpu_us(case: dict[str, Any]) -> float:
    """CPU per request of the process that runs the model: our container process, MLServer's
    inference worker."""
    system, model = case["system"].split(" ", 1)
    if system == "MLServer":
        return case["cpu_us_per_request"].get("mlserver: inference worker", 0.0)
    # "container mlp (APP)", APP being the endpoint's Serve application: "bench-torch.mlp.<hash>"
    return sum(
        value
        for name, value in case["cpu_us_per_request"].items()
        if name.startswith(f"container mlp ({model}.") and name.endswith(")")
    )


def render_http(report: dict[str, Any]) -> str:
    machine, versions, peer = report["machine"], report["versions"], report["mlserver_versions"]
    lines = [
        "### Measured: batching over HTTP, ours vs MLServer",
        "",
        f"Generated by `{report['command']}`: an MLP {' -> '.join(map(str, report['widths']))} "
        f"(ReLU between layers, 1.3 M parameters) saved once as TorchScript and as ONNX, wrk with "
        f"{report['connections']} connections of one-row JSON requests (ours: `[[256 numbers]]` through the gateway; "
        f"MLServer: the same row as a V2 FP32 tensor), {report['duration_s']:g} s per case after a "
        f"{report['warmup_s']:g} s warm-up. Batched = `Batching: {{MaxBatchSize: {report['max_batch_size']}, "
        f"MaxDelayMs: {report['max_delay_ms']:g}}}` (ours) and `max_batch_size: {report['max_batch_size']}, "
        f"max_batch_time: {report['max_delay_ms'] / 1000:g}` (MLServer's adaptive batching). Ours: each endpoint one "
        f"container with `Resources.Cpus: {report['cpus']}` ({report['cpus']} model threads of one intra-op thread "
        f"each; ONNX Runtime not spinning, `OMP_WAIT_POLICY=PASSIVE`); MLServer {peer.get('mlserver')}: default settings (one inference worker process), a custom "
        f"runtime per framework (`loadtests/batching/mlserver_runtime.py`) with {report['cpus']} intra-op threads, the "
        f"same spinning and OpenMP settings. "
        f"Machine: {machine['nproc']} cores ({machine['cpu_model']}), torch {versions['torch']}; load average at the "
        f"start {machine['loadavg_at_start']}, at the end {report['load_average_at_end']}.",
        "",
        "| system | model | req/s | p50 ms | p99 ms | server CPU µs/request | of it, the model's process | errors "
        "| other cores |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in report["cases"]:
        system, model = case["system"].split(" ", 1)
        server = server_cpu_us(case["cpu_us_per_request"])
        errors = sum(case["errors"].values()) if case["errors"] else 0
        lines.append(
            f"| {system} | {model} | {case['rps']:,.0f} | {case['p50_ms']:.2f} | {case['p99_ms']:.2f} | "
            f"{server:,.0f} | {model_cpu_us(case):,.0f} | {errors} | {case['other_cores']:.2f} |"
        )
    lines += ["", "| ratio (same run, req/s) | value |", "|---|---|"]
    lines += [f"| {name} | {value:.2f}× |" for name, value in report["ratios"].items()]
    cost = report.get("model_cost")
    if cost:
        lines += [
            "",
            "Why batching gains what it gains here, from the same run: on a CPU-bound machine req/s is cores / "
            "CPU per request, so 3× the unbatched req/s needs a batched request to cost at most a third of an "
            "unbatched one's CPU, all processes together. Batching shrinks only the model process's share "
            "(the model alone, in the benchmark's process with one intra-op thread, is the last column); the "
            "gateway's per-request work (HTTP in and out, routing, the signed hop) stays.",
            "",
            "| model | server CPU µs/request, unbatched | batched | of it the gateway, batched | 3× needs at most "
            f"| the model alone, µs/row: 1-row calls / {report['max_batch_size']}-row batches |",
            "|---|---|---|---|---|---|",
        ]
        for kind, per_row in cost.items():
            plain = next((c for c in report["cases"] if c["system"] == f"ours bench-{kind}"), None)
            batched = next(
                (c for c in report["cases"] if c["system"] == f"ours bench-{kind}-batched"), None
            )
            if plain is None or batched is None:
                continue
            whole, merged = (
                server_cpu_us(plain["cpu_us_per_request"]),
                server_cpu_us(batched["cpu_us_per_request"]),
            )
            gateway = batched["cpu_us_per_request"].get("gateway replica", 0.0)
            in_batch = per_row[f"rows_{report['max_batch_size']}"]
            lines.append(
                f"| {kind} | {whole:,.0f} | {merged:,.0f} | {gateway:,.0f} | {whole / 3:,.0f} | "
                f"{per_row['rows_1']:,.0f} / {in_batch:,.0f} |"
            )
    return "\n".join(lines)


def render(report: dict[str, Any]) -> str:
    if "cases" in report:
        return render_http(report)
    base = report["rows"][0]["requests_per_s"]
    machine = report["machine"]
    lines = [
        "### Measured: one pytorch replica under concurrent single-row requests",
        "",
        f"`python -m loadtests.bench_batching run` on {machine['nproc']} cores ({machine['cpu_model']}), torch {report['torch']}, "
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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser("run")
    measure.add_argument("--out", required=True)
    measure.add_argument("--seconds", type=float, default=5.0)
    measure.add_argument("--clients", type=int, default=32)
    measure.add_argument("--cpus", type=float, default=2.0)
    over = commands.add_parser("http")
    over.add_argument("--out", required=True)
    over.add_argument("--duration", type=float, default=15.0)
    over.add_argument("--warmup", type=float, default=3.0)
    over.add_argument(
        "--wait-quiet",
        type=float,
        default=60.0,
        help="seconds to wait for a quiet machine per case",
    )
    over.add_argument(
        "--retries",
        type=int,
        default=2,
        help="measure a disturbed case again up to this many times",
    )
    over.add_argument("--mlserver-venv", type=Path, default=ROOT / ".bench" / "mlserver-venv")
    over.add_argument("--write-docs", action="store_true")
    docs = commands.add_parser("docs")
    docs.add_argument("results")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args)
    if args.command == "http":
        return run_http(args)
    text = render(json.loads(Path(args.results).read_text()))
    write_section(ROOT / "docs" / "benchmarks" / "bench_batching.md", "bench_batching", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
