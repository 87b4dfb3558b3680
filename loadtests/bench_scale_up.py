"""More throughput when one container process is the bottleneck: replicas and model threads (issue
44, item 5).

One embedded server, six Direct endpoints of one `python` container each. Two models, each about a
millisecond or two of CPU per request, so that the container process, not the gateway, is what
limits throughput:

- *holds the GIL*: a pure-Python loop (as most `code/inference.py` pre- and post-processing, and
  scikit-learn's own Python, do);
- *releases the GIL*: SHA-256 over 1 MiB (hashlib lets go of the GIL for large buffers, as PyTorch,
  ONNX Runtime, TensorFlow and XGBoost do while they compute).

Each model is served three ways: one replica with one model thread (the default for a `python`
container with a `predict_fn`); one replica with two model threads (`SERVING_MODEL_THREADS: "2"`,
which declares the script thread-safe); two replicas (`AutoScaling: {MinCapacity: 2, MaxCapacity:
2}`, two processes, which the gateway's router balances by requests in flight). wrk sends
`--connections` at a time to each endpoint for `--seconds`, interleaved over `--rounds`; the table
gives the median req/s and p50 and the ratio to one replica, one thread.

    python -m loadtests.bench_scale_up [--seconds 10] [--rounds 3] [--connections 8] [--write-docs]

Results: loadtests/results/bench_scale_up.json; with --write-docs, its section of
docs/benchmarks/bench_scale_up.md.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.harness.cpu import CpuMeter
from loadtests.harness.processes import BenchError, log
from loadtests.harness.results import ROOT, run_line, run_meta, write_results, write_section
from loadtests.harness.wrk import Wrk, ensure_wrk

DOCS = ROOT / "docs" / "benchmarks" / "bench_scale_up.md"
RESULTS = ROOT / "loadtests" / "results" / "bench_scale_up.json"
BODY = "[1]"
HEADERS = {"content-type": "application/json"}
MODELS = {
    "holds the GIL": """
def predict_fn(data, model):
    total = 0
    for i in range(20000):
        total += i * i
    return [total % 7]
""",
    "releases the GIL": """
import hashlib

BUFFER = bytes(1 << 20)


def predict_fn(data, model):
    return [hashlib.sha256(BUFFER).digest()[0]]
""",
}
WAYS: dict[str, dict[str, Any]] = {
    "1 replica, 1 thread": {},
    "1 replica, 2 model threads": {"Environment": {"SERVING_MODEL_THREADS": "2"}},
    "2 replicas, 1 thread each": {"AutoScaling": {"MinCapacity": 2, "MaxCapacity": 2}},
}


def specs(folder: Path) -> dict[tuple[str, str], Any]:
    from serving.config.spec import parse_spec

    found = {}
    for m, (model, code) in enumerate(MODELS.items()):
        (folder / f"model{m}" / "code").mkdir(parents=True)
        (folder / f"model{m}" / "code" / "inference.py").write_text(code)
        for w, (way, fields) in enumerate(WAYS.items()):
            container = {
                "ContainerHostname": "model",
                "Image": "python",
                "ModelDataUrl": str(folder / f"model{m}"),
            }
            found[(model, way)] = parse_spec(
                {
                    "EndpointName": f"scale-m{m}-w{w}",
                    "InferenceExecutionConfig": {"Mode": "Direct"},
                    "Containers": [container | fields],
                }
            )
    return found


def docs_section(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        "## Measured",
        "",
        f"wrk, {meta['connections']} connections, {meta['case_seconds']:.0f} s per case, median of {meta['rounds']} "
        "interleaved rounds. Ratio: req/s against one replica with one thread, same model, same run.",
        "",
        "| model | served as | req/s | ratio | p50 ms | busy cores |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['model']} | {row['way']} | {row['rps']:,.0f} | {row['ratio']:.2f}× | {row['p50_ms']:.2f} | "
            f"{row['busy']:.2f} |"
        )
    lines += [
        "",
        run_line(meta, RESULTS),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    meta = run_meta(
        __file__, case_seconds=args.seconds, rounds=args.rounds, connections=args.connections
    )
    from serving.ray_wing import EmbeddedServer, EndpointsNotReady
    from serving.settings import ServerSettings

    work = Path(tempfile.mkdtemp(prefix="bench-scale-up-"))
    endpoints = specs(work)
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    log(f"starting the embedded server with {len(endpoints)} endpoints ...")
    server = EmbeddedServer(
        list(endpoints.values()), ServerSettings(host="127.0.0.1", port=0), ready_timeout_s=300
    )
    try:
        server.__enter__()
    except EndpointsNotReady as error:
        raise BenchError(str(error)) from None
    try:
        meter = CpuMeter()
        wrk = Wrk(ensure_wrk(), work, meter)
        url = {
            key: f"{server.url}/endpoints/{spec.EndpointName}/invocations"
            for key, spec in endpoints.items()
        }
        for key in endpoints:  # every replica warm, every model thread started
            wrk.case("warm-up", "", args.connections, url[key], 2, 0, body=BODY, headers=HEADERS)
        runs: dict[tuple[str, str], list[Any]] = {key: [] for key in endpoints}
        for round_ in range(args.rounds):
            for key in endpoints:
                case = wrk.case(
                    f"{key[0]}: {key[1]}",
                    f"c{args.connections}",
                    args.connections,
                    url[key],
                    args.seconds,
                    1.0,
                    body=BODY,
                    headers=HEADERS,
                )
                if case.errors:
                    raise BenchError(f"{key}: errors {case.errors}")
                runs[key].append(case)
                log(
                    f"round {round_ + 1} {key[0]:>16} | {key[1]:<26} {case.rps:8.0f} req/s  p50 {case.p50_ms:.2f} ms"
                )
    finally:
        server.__exit__(None, None, None)
    rows = []
    for (model, way), cases in runs.items():
        rps = statistics.median(c.rps for c in cases)
        base = statistics.median(c.rps for c in runs[(model, "1 replica, 1 thread")])
        rows.append(
            {
                "model": model,
                "way": way,
                "rps": round(rps, 1),
                "ratio": round(rps / base, 3),
                "p50_ms": round(statistics.median(c.p50_ms for c in cases), 3),
                "busy": round(statistics.median(c.busy_cores for c in cases), 2),
            }
        )
    meta["seconds"] = round(time.monotonic() - started, 1)
    result = {"meta": meta, "rows": rows}
    write_results(args.out, result)
    for row in rows:
        print(row)
    if args.write_docs:
        write_section(DOCS, "bench_scale_up", docs_section(result), title="# bench_scale_up")


if __name__ == "__main__":
    main()
