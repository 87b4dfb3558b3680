"""A SageMaker inference script against the stack, for the same model (issue 60, item 1).

One embedded server, three Direct endpoints of one container each, all serving the same fitted
scikit-learn pipeline (the iris one, 1 row a request):

- **stack**: the `sklearn` stack loading it from `model.skops` (no script);
- **hooks**: a `python` container whose `code/inference.py` defines `model_fn` (joblib),
  `input_fn`, `predict_fn` and `output_fn`, as a SageMaker user writes them;
- **hooks, on the thread**: the same script with `SERVING_INLINE_BUDGET_MS=0`, which hands every
  prediction to the model thread: the path a script took until this change.

Before anything is timed, each endpoint's answer is checked against the pipeline's own `predict`.
wrk drives each at `--connections`, interleaved over `--rounds`: throughput, p50/p99, and the
server's CPU per request (the gateway and the container's processes, from /proc). Target: the hooks
container's CPU per request ≤ 1.1× the stack's, same run.

    python -m loadtests.bench_hooks [--rounds 3] [--seconds 6] [--write-docs]

Results: loadtests/results/bench_hooks.json; with --write-docs, docs/benchmarks/bench_hooks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx

from loadtests.harness.cpu import CpuMeter
from loadtests.harness.processes import log
from loadtests.harness.results import ROOT, run_line, run_meta, write_results, write_section
from loadtests.harness.servers import in_process
from loadtests.harness.wrk import Wrk, ensure_wrk

DOCS = ROOT / "docs" / "benchmarks" / "bench_hooks.md"
RESULTS = ROOT / "loadtests" / "results" / "bench_hooks.json"
ROW = [[5.1, 3.5, 1.4, 0.2]]
SCRIPT = """
import json
import os

import joblib
import numpy as np


def model_fn(model_dir):
    return joblib.load(os.path.join(model_dir, "model.joblib"))


def input_fn(request_body, request_content_type):
    return np.asarray(json.loads(request_body), dtype=np.float64)


def predict_fn(input_data, model):
    return model.predict(input_data)


def output_fn(prediction, content_type):
    return json.dumps(prediction.tolist())
"""
CASES = {"stack": "stack", "hooks": "hooks", "hooks, on the thread": "hooks-thread"}


def models(work: Path) -> tuple[Any, Path, Path]:
    """The pipeline, saved for the stack (skops) and for the script (joblib + code/)."""
    import joblib
    import skops.io
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    iris = load_iris()
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    model.fit(iris.data, iris.target)
    stack, hooks = work / "stack", work / "hooks"
    stack.mkdir()
    (hooks / "code").mkdir(parents=True)
    skops.io.dump(model, stack / "model.skops")
    joblib.dump(model, hooks / "model.joblib")
    (hooks / "code" / "inference.py").write_text(textwrap.dedent(SCRIPT))
    return model, stack, hooks


def spec(name: str, image: str, folder: Path, environment: dict[str, str]) -> dict[str, Any]:
    container = {"ContainerHostname": "iris", "Image": image, "ModelDataUrl": str(folder)}
    return {"EndpointName": name, "Containers": [{**container, "Environment": environment}]}


def docs_section(result: dict[str, Any]) -> str:
    meta, medians = result["meta"], result["medians"]
    base = medians["stack"]["server_cpu_us"]
    lines = [
        "## Measured",
        "",
        f"{meta['rounds']} interleaved rounds of {meta['case_seconds']:.0f} s per case at "
        f"{meta['connections']} connections, 1 row; medians. Every endpoint's answer was checked "
        "against the pipeline's own `predict` first.",
        "",
        "| endpoint | req/s | p50 ms | p99 ms | server CPU µs / request | vs the stack |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case in CASES:
        row = medians[case]
        lines.append(
            f"| {case} | {row['rps']:.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
            f"{row['server_cpu_us']:.0f} | {row['server_cpu_us'] / base:.2f}× |"
        )
    lines += ["", run_line(meta, RESULTS)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument(
        "--sandbox-read",
        default="",
        help="SERVING_SANDBOX_READ for the containers: a git worktree other than the installed "
        "checkout needs its root here (its container process lists that folder to import `serving`)",
    )
    args = parser.parse_args()
    started = time.monotonic()
    meta = run_meta(
        __file__, rounds=args.rounds, case_seconds=args.seconds, connections=args.connections
    )
    work = Path(tempfile.mkdtemp(prefix="bench-hooks-"))
    model, stack, hooks = models(work)
    extra = {"SERVING_SANDBOX_READ": args.sandbox_read} if args.sandbox_read else {}
    specs = [
        spec("stack", "sklearn", stack, extra),
        spec("hooks", "python", hooks, extra),
        spec("hooks-thread", "python", hooks, {**extra, "SERVING_INLINE_BUDGET_MS": "0"}),
    ]
    expected = model.predict(ROW).tolist()
    wrk = Wrk(ensure_wrk(), work, CpuMeter(), quiet_wait=20.0, retries=1)
    runs: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    with in_process(*specs) as server:
        time.sleep(5)  # Ray's start-up work winds down
        for case, endpoint in CASES.items():
            answer = httpx.post(f"{server.url}/endpoints/{endpoint}/invocations", json=ROW)
            if answer.status_code != 200 or json.loads(answer.content) != expected:
                raise SystemExit(f"{case} answered {answer.status_code} {answer.text!r}")
        for round_number in range(1, args.rounds + 1):
            log(f"round {round_number}")
            for case, endpoint in CASES.items():
                measured = wrk.case(
                    case,
                    f"{args.connections} conn",
                    args.connections,
                    f"{server.url}/endpoints/{endpoint}/invocations",
                    args.seconds,
                    2.0,
                    body=json.dumps(ROW),
                    headers={"content-type": "application/json"},
                )
                cpu = measured.cpu_us_per_request
                runs[case].append(
                    {
                        "rps": measured.rps,
                        "p50_ms": measured.p50_ms,
                        "p99_ms": measured.p99_ms,
                        "server_cpu_us": sum(
                            value
                            for label, value in cpu.items()
                            if label.startswith(("gateway replica", "container "))
                        ),
                        "cpu_us_by_process": cpu,
                    }
                )
    medians = {
        case: {
            key: statistics.median(run[key] for run in rows)
            for key in ("rps", "p50_ms", "p99_ms", "server_cpu_us")
        }
        for case, rows in runs.items()
    }
    meta["seconds"] = time.monotonic() - started
    result = {"meta": meta, "runs": runs, "medians": medians}
    write_results(RESULTS, result)
    log(docs_section(result))
    if args.write_docs:
        write_section(DOCS, "bench_hooks", docs_section(result), "# bench_hooks")


if __name__ == "__main__":
    main()
