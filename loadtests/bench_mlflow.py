"""The mlflow stack against MLServer's MLflow runtime, on the same MLflow model (issue 58).

One embedded server with one Direct endpoint of one `mlflow` container, and MLServer 1.7.1 with
`mlserver-mlflow` serving the same model directory in-process (`parallel_workers: 0`, `debug:
false`: its cheapest production configuration, as bench_open_inference runs it). The model: a
scikit-learn pipeline (StandardScaler, LogisticRegression) on scikit-learn's breast-cancer table as a
DataFrame (30 double columns), saved by `mlflow.sklearn.save_model` in its default skops format
with an inferred signature. Before anything is timed, each server's answer to the benchmark's rows is
checked against `mlflow.pyfunc.load_model(...).predict` in this process. wrk drives, interleaved
over `--rounds`, for one row and for 32 rows per request, each protocol at both servers: V2 JSON
(one FP64 tensor per column: `/v2/models/<model>/infer` there, `<endpoint>.<container>` here) and
MLflow's scoring JSON (`dataframe_split`: MLServer's `/invocations`, mlserver-mlflow's copy of
`mlflow models serve`; InvokeEndpoint here). Latency at one connection (p50), throughput and server
CPU per request at 32 connections (here: the gateway and the container process; MLServer: its one
process), from /proc; every ratio is against MLServer speaking the same protocol in the same round.

    python -m loadtests.bench_mlflow [--seconds 5] [--rounds 3] [--venv DIR] [--write-docs]

MLServer runs from its own virtual environment (`--venv`, default .bench/mlserver-mlflow-venv,
created on first use from PyPI: mlserver and mlserver-mlflow 1.7.1, mlflow, scikit-learn and skops
at our versions, which read the skops file). From a git worktree other than the installed
checkout, set PYTHONPATH to its root (Ray's workers import `serving` from it) and pass it as
`--sandbox-read` (the container process lists it to import `serving`).
Results: loadtests/results/bench_mlflow.json; with --write-docs, docs/benchmarks/bench_mlflow.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.harness import versus
from loadtests.harness.cpu import CpuMeter
from loadtests.harness.peers import MLSERVER_MODEL, MLSERVER_VERSION, start_mlserver
from loadtests.harness.processes import BenchError, Processes, log
from loadtests.harness.proctree import gateway_and_container
from loadtests.harness.results import ROOT, run_line, run_meta, write_results, write_section
from loadtests.harness.wrk import Wrk, ensure_wrk

DOCS = ROOT / "docs" / "benchmarks" / "bench_mlflow.md"
RESULTS = ROOT / "loadtests" / "results" / "bench_mlflow.json"
VENV = ROOT / ".bench" / "mlserver-mlflow-venv"
ENDPOINT = "mlflow-cancer"
CONTAINER = "cancer"
THEIRS_V2 = "MLServer, V2 JSON"
THEIRS_SCORING = "MLServer, /invocations dataframe_split"
OURS_V2 = "serving, V2 JSON"
OURS_SCORING = "serving, InvokeEndpoint dataframe_split"
SAME_PROTOCOL = {
    THEIRS_V2: THEIRS_V2,
    OURS_V2: THEIRS_V2,
    THEIRS_SCORING: THEIRS_SCORING,
    OURS_SCORING: THEIRS_SCORING,
}
PEER_PACKAGES = (
    "mlserver",
    "mlserver-mlflow",
    "mlflow",
    "scikit-learn",
    "skops",
    "pandas",
    "numpy",
)


def ensure_venv(venv: Path) -> Path:
    """MLServer with its MLflow runtime, in `venv` (created on first use); its `mlserver`."""
    return versus.ensure_venv(
        venv,
        [
            f"mlserver=={MLSERVER_VERSION}",
            f"mlserver-mlflow=={MLSERVER_VERSION}",
            # the model's mlflow and the versions that wrote its skops file
            f"mlflow=={metadata.version('mlflow-skinny')}",
            f"scikit-learn=={metadata.version('scikit-learn')}",
            f"skops=={metadata.version('skops')}",
            "uvloop<0.22",  # as harness/peers: MLServer 1.7.1's workers fail to start on 0.22
        ],
    )


def save(work: Path) -> tuple[Any, Any, dict[str, Path]]:
    """The pipeline saved by mlflow for both servers; the model as mlflow.pyfunc loads it here, and
    the rows to ask for (every 17th of the table: both classes)."""
    import mlflow.pyfunc
    import mlflow.sklearn
    from mlflow.models import infer_signature
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    frame, target = load_breast_cancer(return_X_y=True, as_frame=True)
    pipeline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    pipeline.fit(frame, target)
    ours, peer = work / "ours", work / "mlserver" / MLSERVER_MODEL
    mlflow.sklearn.save_model(
        pipeline,
        str(ours),
        signature=infer_signature(frame, pipeline.predict(frame)),
        pip_requirements=[],
    )
    # mlserver-mlflow loads its model folder (`uri: "."`), where MLServer also finds its settings
    shutil.copytree(ours, peer)
    model = mlflow.pyfunc.load_model(str(ours))
    rows = frame.iloc[::17].iloc[:32].reset_index(drop=True)
    return model, rows, {"ours": ours, "mlserver_root": work / "mlserver"}


def v2_body(frame: Any) -> str:
    """A V2 request of one FP64 tensor per column, as the signature's metadata lists them."""
    inputs = [
        {"name": column, "datatype": "FP64", "shape": [len(frame)], "data": frame[column].tolist()}
        for column in frame.columns
    ]
    return json.dumps({"inputs": inputs})


def scoring_body(frame: Any) -> str:
    """MLflow's scoring JSON, `dataframe_split`."""
    split = {"columns": list(frame.columns), "data": frame.to_numpy().tolist()}
    return json.dumps({"dataframe_split": split})


def docs_section(result: dict[str, Any]) -> str:
    meta = result["meta"]
    peer = result["mlserver_versions"]
    lines = [
        "## Measured",
        "",
        f"{meta['rounds']} interleaved rounds of {meta['case_seconds']:.0f} s per case; medians. MLServer "
        f"{peer.get('mlserver', '?')} with mlserver-mlflow {peer.get('mlserver-mlflow', '?')} (mlflow "
        f"{peer.get('mlflow', '?')}, scikit-learn {peer.get('scikit-learn', '?')}), in-process "
        "(`parallel_workers: 0`), `debug: false`; each ratio is against MLServer speaking the same protocol, "
        "per round. Every server's answer was checked against `mlflow.pyfunc` `predict` first.",
        "",
        *versus.table(result["rows"], "MLServer, same protocol"),
        "",
        run_line(meta, RESULTS),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--venv", type=Path, default=VENV)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument(
        "--sandbox-read",
        default="",
        help="SERVING_SANDBOX_READ for the container: a git worktree other than the installed "
        "checkout needs its root here (its container process lists that folder to import `serving`)",
    )
    args = parser.parse_args()
    started = time.monotonic()
    meta = run_meta(__file__, case_seconds=args.seconds, rounds=args.rounds)
    meta["versions"]["mlflow-skinny"] = metadata.version("mlflow-skinny")
    from serving.config.spec import parse_spec
    from serving.ray_wing import EmbeddedServer, EndpointsNotReady
    from serving.settings import ServerSettings

    work = Path(tempfile.mkdtemp(prefix="bench-mlflow-"))
    model, frame, paths = save(work)
    environment = {"SERVING_SANDBOX_READ": args.sandbox_read} if args.sandbox_read else {}
    spec = parse_spec(
        {
            "EndpointName": ENDPOINT,
            "Containers": [
                {
                    "ContainerHostname": CONTAINER,
                    "Image": "mlflow",
                    "ModelDataUrl": str(paths["ours"]),
                    "Environment": environment,
                }
            ],
        }
    )
    binary = ensure_venv(args.venv)
    processes = Processes()
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    log("starting MLServer (in-process, mlserver-mlflow) and the embedded server ...")
    mlserver, mlserver_url = start_mlserver(
        processes,
        binary,
        paths,
        work,
        {"parallel_workers": 0},
        {
            "implementation": "mlserver_mlflow.MLflowRuntime",
            "parameters": {"uri": ".", "version": "v1"},
        },
    )
    server = EmbeddedServer([spec], ServerSettings(host="127.0.0.1", port=0), ready_timeout_s=300)
    try:
        server.__enter__()
    except EndpointsNotReady as error:
        processes.stop(mlserver)
        raise BenchError(str(error)) from None
    time.sleep(10)  # Ray's start-up work winds down before anything is timed
    urls = {
        THEIRS_V2: f"{mlserver_url}/v2/models/{MLSERVER_MODEL}/infer",
        THEIRS_SCORING: f"{mlserver_url}/invocations",
        OURS_V2: f"{server.url}/v2/models/{ENDPOINT}.{CONTAINER}/infer",
        OURS_SCORING: f"{server.url}/endpoints/{ENDPOINT}/invocations",
    }
    cases: dict[versus.Key, versus.Case] = {}
    try:
        for count in (1, 32):
            rows = frame.iloc[:count]
            expected = model.predict(rows)
            for case, url in urls.items():
                body = v2_body(rows) if "V2" in case else scoring_body(rows)
                versus.check_answer(case, url, body, expected, "mlflow.pyfunc predict")
                cases[(count, case)] = versus.Case(url, body, case.split(",")[0])
        pids = {"serving": gateway_and_container(ENDPOINT), "MLServer": {"mlserver": mlserver.pid}}
        wrk = Wrk(ensure_wrk(), work, CpuMeter(), timeout_s=30.0)
        runs = versus.interleaved(wrk, cases, pids, args.rounds, args.seconds)
    finally:
        server.__exit__(None, None, None)
        processes.stop(mlserver)
    rows_out = versus.summary(runs, lambda key: (key[0], SAME_PROTOCOL[key[1]]))
    meta["seconds"] = round(time.monotonic() - started, 1)
    result = {
        "meta": meta,
        "mlserver_versions": versus.venv_versions(args.venv, PEER_PACKAGES),
        "rows": rows_out,
        "runs": {f"{k[0]} rows, {k[1]}": v for k, v in runs.items()},
    }
    write_results(args.out, result)
    for row in rows_out:
        print(row)
    if args.write_docs:
        write_section(DOCS, "bench_mlflow", docs_section(result), title="# bench_mlflow")


if __name__ == "__main__":
    main()
