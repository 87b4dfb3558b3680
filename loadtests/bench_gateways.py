"""Gateway capacity: the gateway's CPU per request, what one gateway process sustains, and 1 against
2 gateway processes sharing the port (`--gateways-per-node`), on a near-free model.

One Direct endpoint with one `python` container whose handler returns the request body as it came
(the least a container can do), two replicas of it, on an embedded Ray with `gateways_per_node` 1
and then 2 (a fresh server each). wrk on loopback at 1, 32 and 64 connections; every case records
req/s, p50/p99 and the CPU each process group spent per request (/proc). A gateway process saturates
at 1 / (its CPU per request); the page's capacity model starts from that figure.

    python -m loadtests.bench_gateways [--duration 10] [--write-docs]

Results: loadtests/results/bench_gateways.json; with --write-docs, its section of
docs/benchmarks/bench_gateways.md.
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadtests.harness.cpu import OTHER, CpuMeter
from loadtests.harness.processes import BenchError, http, log
from loadtests.harness.results import (
    ROOT,
    command_line,
    machine_facts,
    our_versions,
    write_results,
    write_section,
)
from loadtests.harness.servers import embedded_endpoint
from loadtests.harness.wrk import Case, Wrk, ensure_wrk

ECHO = """
def input_fn(body, content_type):
    return body

def predict_fn(data, model):
    return data

def output_fn(prediction, accept):
    return prediction, "application/json"
"""
BODY = '{"x": [1, 2, 3]}'
HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
LOADS = (("sequential", 1), ("c32", 32), ("c64", 64))
GATEWAY = "gateway replica"  # the CPU meter's label of every gateway process together


def spec(model: Path, replicas: int) -> dict[str, Any]:
    return {
        "EndpointName": "gw",
        "Containers": [
            {
                "ContainerHostname": "echo",
                "Image": "python",
                "ModelDataUrl": str(model),
                "AutoScaling": {"MinCapacity": replicas, "MaxCapacity": replicas},
            }
        ],
    }


def share(case: Case, label: str) -> float:
    return case.cpu_us_per_request.get(label, 0.0)


def container_us(case: Case) -> float:
    """CPU per request of the container's processes (its replicas' supervisors and model
    processes)."""
    return sum(v for k, v in case.cpu_us_per_request.items() if k.startswith("container echo "))


def summary(case: Case) -> dict[str, Any]:
    gateway = share(case, GATEWAY)
    return {
        "rps": round(case.rps),
        "p50_ms": round(case.p50_ms, 3),
        "p99_ms": round(case.p99_ms, 3),
        "gateway_us": gateway,
        "container_us": round(container_us(case), 1),
        "all_us": round(sum(v for k, v in case.cpu_us_per_request.items() if k != OTHER), 1),
        "gateway_cores": round(gateway * case.rps / 1e6, 2),
        "one_gateway_sustains_rps": round(1e6 / gateway) if gateway else None,
        "busy_cores": round(case.busy_cores, 2),
        "disturbance_cores": round(case.disturbance, 2),
        "flagged": case.flagged,
    }


def reading(one: dict[str, Any], cores: int) -> str:
    """Whether one gateway was the bottleneck at 64 connections, which decides what a second one can
    add."""
    if one["gateway_cores"] >= 0.9:
        return (
            f"One gateway was saturated ({one['gateway_cores']:.2f} of its core busy at 64 connections): routing was "
            "the bottleneck, which more gateway processes remove while the node has cores for them."
        )
    return (
        f"One gateway was not saturated ({one['gateway_cores']:.2f} of its core busy at 64 connections) while the "
        f"machine's {cores} cores were {one['busy_cores']:.2f} busy, most of it the container replicas, wrk and Ray: "
        "here the machine is the bottleneck, not routing, so a second gateway can add little, and a difference of "
        "this size between the two servers is within this VM's drift (compare the CPU per request of the whole "
        "path). The figure this run does give is the last column: what one gateway process sustains on a core of "
        "its own, where the capacity model above starts."
    )


def docs_section(result: dict[str, Any]) -> str:
    meta = result["meta"]
    rows = [
        "| gateways | load | req/s | p50 ms | p99 ms | gateway CPU µs/request | container CPU µs/request "
        "| gateways' cores busy | one gateway sustains (1 / its CPU) | machine's cores busy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for gateways, cases in result["summary"].items():
        for load, s in cases.items():
            flag = f" (flagged: {s['flagged']})" if s["flagged"] else ""
            rows.append(
                f"| {gateways} | {load} | {s['rps']:,} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | {s['gateway_us']:.0f} "
                f"| {s['container_us']:.0f} | {s['gateway_cores']:.2f} | {s['one_gateway_sustains_rps'] or 0:,} req/s "
                f"| {s['busy_cores']:.2f}{flag} |"
            )
    gains = [
        f"{load}: {s2['rps']:,} against {s1['rps']:,} req/s ({s2['rps'] / max(s1['rps'], 1):.2f}×, the machine's "
        f"cores {s2['busy_cores']:.2f} and {s1['busy_cores']:.2f} busy)"
        for load, s1, s2 in (
            (k, result["summary"]["1"][k], result["summary"]["2"][k]) for k in ("c32", "c64")
        )
    ]
    return "\n".join(
        [
            "## Measured",
            "",
            f"One Direct endpoint, one `python` container echoing the body ({meta['replicas']} replicas), on an",
            "embedded Ray with one and then two gateway processes sharing the port; wrk on loopback, one thread,",
            f"{meta['duration_s']:.0f} s per case after a {meta['warmup_s']:.0f} s warm-up.",
            "",
            *rows,
            "",
            f"Two gateway processes against one, {meta['machine']['nproc']} cores: "
            + "; ".join(gains)
            + ".",
            "",
            reading(result["summary"]["1"]["c64"], meta["machine"]["nproc"]),
            "",
            f"Run: `{meta['command']}` at {meta['started']} ({meta['seconds']:.0f} s); {meta['machine']['nproc']} CPUs "
            f"({meta['machine']['cpu_model']}), load average before {meta['machine']['loadavg_at_start']}. "
            "Results: `loadtests/results/bench_gateways.json`.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per case")
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="seconds of warm-up before each case"
    )
    parser.add_argument("--replicas", type=int, default=2, help="replicas of the echo container")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "loadtests" / "results" / "bench_gateways.json"
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    meta: dict[str, Any] = {
        "command": command_line(__file__),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "versions": our_versions(),
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "replicas": args.replicas,
    }
    cases: dict[str, dict[str, Case]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-gateways-") as work:
        model = Path(work) / "echo"
        (model / "code").mkdir(parents=True)
        (model / "code" / "inference.py").write_text(ECHO)
        meter = CpuMeter()
        wrk = Wrk(ensure_wrk(), Path(work), meter)
        for gateways in (1, 2):
            log(f"starting an embedded server with {gateways} gateway process(es) per node ...")
            with embedded_endpoint(spec(model, args.replicas), gateways_per_node=gateways) as base:
                url = f"{base}/endpoints/gw/invocations"
                status, body = http("POST", url, BODY.encode(), HEADERS)
                if status != 200 or body.decode() != BODY:
                    raise BenchError(f"the echo endpoint answered {status} {body[:200]!r}")
                cases[str(gateways)] = {
                    load: wrk.case(
                        f"{gateways} gateway(s)",
                        load,
                        connections,
                        url,
                        args.duration,
                        args.warmup,
                        body=BODY,
                        headers=HEADERS,
                    )
                    for load, connections in LOADS
                }
    meta["seconds"] = time.monotonic() - started
    result = {
        "meta": meta,
        "summary": {
            g: {load: summary(case) for load, case in by_load.items()}
            for g, by_load in cases.items()
        },
        "cases": {
            g: {load: asdict(case) for load, case in by_load.items()}
            for g, by_load in cases.items()
        },
    }
    write_results(args.out, result)
    for gateways, by_load in result["summary"].items():
        for load, s in by_load.items():
            print(f"{gateways} gateway(s) {load}: {s}", flush=True)
    if args.write_docs:
        write_section(
            ROOT / "docs" / "benchmarks" / "bench_gateways.md",
            "bench_gateways",
            docs_section(result),
            title="# Gateways: CPU per request, one process's capacity, 1 against 2 per node",
        )


if __name__ == "__main__":
    main()
