"""The lightgbm stack against MLServer's LightGBM runtime, on the same booster (issue 58).

One embedded server with one Direct endpoint of one `lightgbm` container, and MLServer 1.7.1 with
`mlserver-lightgbm` serving the same text model (as its `model.bst`) in-process (`parallel_workers: 0`,
`debug: false`: its cheapest production configuration, as bench_open_inference runs it), twice: as
installed (LightGBM's OpenMP pool of one thread per core, spinning when idle) and with the OpenMP
settings our container process runs LightGBM with (one thread, idle threads asleep), the baseline of
every ratio. The booster: 100 rounds of 31 leaves on scikit-learn's breast-cancer table (30 features, binary).
Before anything is timed, each server's answer to the benchmark's rows is checked against
`Booster.predict` in this process. wrk drives, interleaved over `--rounds`, for one row and for 32
rows per request: V2 JSON (FP64) at both MLServers and here, and InvokeEndpoint JSON here. Latency at one
connection (p50), throughput and server CPU per request at 32 connections (here: the gateway and
the container process; MLServer: its one process), from /proc.

    python -m loadtests.bench_lightgbm [--seconds 5] [--rounds 3] [--venv DIR] [--write-docs]

MLServer runs from its own virtual environment (`--venv`, default .bench/mlserver-lightgbm-venv,
created on first use from PyPI: mlserver, mlserver-lightgbm 1.7.1, lightgbm at our version).
Results: loadtests/results/bench_lightgbm.json; with --write-docs, docs/benchmarks/bench_lightgbm.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.harness import versus
from loadtests.harness.cpu import CpuMeter
from loadtests.harness.peers import MLSERVER_MODEL, MLSERVER_VERSION, start_mlserver
from loadtests.harness.processes import BenchError, Processes, log
from loadtests.harness.proctree import gateway_and_container
from loadtests.harness.results import ROOT, run_line, run_meta, write_results, write_section
from loadtests.harness.wrk import Wrk, ensure_wrk

DOCS = ROOT / "docs" / "benchmarks" / "bench_lightgbm.md"
RESULTS = ROOT / "loadtests" / "results" / "bench_lightgbm.json"
VENV = ROOT / ".bench" / "mlserver-lightgbm-venv"
ENDPOINT = "lgb-cancer"
DEFAULT = "MLServer, V2 JSON"
BASE = "MLServer, V2 JSON, 1 OpenMP thread"
# What our container process runs LightGBM with (container_config, concurrency): one OpenMP thread
# per prediction for a container of less than two CPUs, whose idle threads sleep instead of spinning.
OPENMP = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def ensure_venv(venv: Path) -> Path:
    """MLServer with its LightGBM runtime, in `venv` (created on first use); its `mlserver`."""
    import lightgbm

    return versus.ensure_venv(
        venv,
        [
            f"mlserver=={MLSERVER_VERSION}",
            f"mlserver-lightgbm=={MLSERVER_VERSION}",
            f"lightgbm=={lightgbm.__version__}",
            "uvloop<0.22",  # as harness/peers: MLServer 1.7.1's workers fail to start on 0.22
        ],
    )


def versions(venv: Path) -> dict[str, str]:
    return versus.venv_versions(venv, ("mlserver", "mlserver-lightgbm", "lightgbm", "numpy"))


def train(work: Path) -> tuple[Any, np.ndarray, dict[str, Path]]:
    """The booster, saved as a text model for both servers; the table's rows."""
    import lightgbm
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    params = {"objective": "binary", "num_leaves": 31, "seed": 0, "verbose": -1}
    booster = lightgbm.train(params, lightgbm.Dataset(x, label=y), num_boost_round=100)
    ours, peer = work / "ours", work / "mlserver" / MLSERVER_MODEL
    ours.mkdir()
    peer.mkdir(parents=True)
    booster.save_model(str(ours / "model.txt"))
    # mlserver-lightgbm's well-known name in its model folder (`uri: "."`)
    shutil.copy(ours / "model.txt", peer / "model.bst")
    return booster, x, {"ours": ours, "mlserver_root": work / "mlserver"}


def v2_body(rows: np.ndarray) -> str:
    tensor = {"name": "input-0", "datatype": "FP64", "shape": list(rows.shape)}
    return json.dumps({"inputs": [{**tensor, "data": rows.reshape(-1).tolist()}]})


def docs_section(result: dict[str, Any]) -> str:
    meta = result["meta"]
    mlserver = result["mlserver_versions"]
    lines = [
        "## Measured",
        "",
        f"{meta['rounds']} interleaved rounds of {meta['case_seconds']:.0f} s per case; medians. MLServer "
        f"{mlserver.get('mlserver', '?')} with mlserver-lightgbm {mlserver.get('mlserver-lightgbm', '?')} "
        f"(LightGBM {mlserver.get('lightgbm', '?')}), in-process (`parallel_workers: 0`), `debug: false`, "
        "as installed and with our container's OpenMP settings (`OMP_NUM_THREADS=1`, `OMP_WAIT_POLICY=PASSIVE`), "
        "the baseline of the ratios. Every server's answer was checked against `Booster.predict` first.",
        "",
        *versus.table(result["rows"], "MLServer, 1 thread"),
    ]
    lines += ["", run_line(meta, RESULTS)]
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
    from serving.config.spec import parse_spec
    from serving.ray_wing import EmbeddedServer, EndpointsNotReady
    from serving.settings import ServerSettings

    work = Path(tempfile.mkdtemp(prefix="bench-lgb-"))
    booster, x, paths = train(work)
    spec = parse_spec(
        {
            "EndpointName": ENDPOINT,
            "Containers": [
                {
                    "ContainerHostname": "cancer",
                    "Image": "lightgbm",
                    "ModelDataUrl": str(paths["ours"]),
                    "Environment": (
                        {"SERVING_SANDBOX_READ": args.sandbox_read} if args.sandbox_read else {}
                    ),
                }
            ],
        }
    )
    binary = ensure_venv(args.venv)
    processes = Processes()
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    log("starting MLServer (in-process, mlserver-lightgbm) and the embedded server ...")

    def start(name: str, environment: dict[str, str]) -> tuple[Any, str]:
        saved = {key: os.environ.get(key) for key in environment}
        os.environ.update(environment)  # start_mlserver passes this process's environment on
        try:
            return start_mlserver(
                processes,
                binary,
                paths,
                work,
                {"parallel_workers": 0, "server_name": name},
                {
                    "implementation": "mlserver_lightgbm.LightGBMModel",
                    "parameters": {"uri": ".", "version": "v1"},
                },
            )
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    mlserver, mlserver_url = start("mlserver", {})
    tuned, tuned_url = start("mlserver-omp1", OPENMP)
    server = EmbeddedServer([spec], ServerSettings(host="127.0.0.1", port=0), ready_timeout_s=300)
    try:
        server.__enter__()
    except EndpointsNotReady as error:
        processes.stop(mlserver)
        processes.stop(tuned)
        raise BenchError(str(error)) from None
    time.sleep(10)  # Ray's start-up work winds down before anything is timed
    theirs_v2 = f"{mlserver_url}/v2/models/{MLSERVER_MODEL}/infer"
    tuned_v2 = f"{tuned_url}/v2/models/{MLSERVER_MODEL}/infer"
    ours_v2 = f"{server.url}/v2/models/{ENDPOINT}/infer"
    invoke = f"{server.url}/endpoints/{ENDPOINT}/invocations"
    cases: dict[versus.Key, versus.Case] = {}
    try:
        for count in (1, 32):
            rows = x[:count]
            expected = booster.predict(rows)
            for case, url, body, whose in (
                (DEFAULT, theirs_v2, v2_body(rows), "mlserver"),
                (BASE, tuned_v2, v2_body(rows), "tuned"),
                ("serving, V2 JSON", ours_v2, v2_body(rows), "ours"),
                ("serving, InvokeEndpoint JSON", invoke, json.dumps(rows.tolist()), "ours"),
            ):
                versus.check_answer(case, url, body, expected, "Booster.predict")
                cases[(count, case)] = versus.Case(url, body, whose)
        pids = {
            "ours": gateway_and_container(ENDPOINT),
            "mlserver": {"mlserver": mlserver.pid},
            "tuned": {"mlserver": tuned.pid},
        }
        wrk = Wrk(ensure_wrk(), work, CpuMeter(), timeout_s=30.0)
        runs = versus.interleaved(wrk, cases, pids, args.rounds, args.seconds)
    finally:
        server.__exit__(None, None, None)
        processes.stop(mlserver)
        processes.stop(tuned)
    rows_out = versus.summary(runs, lambda key: (key[0], BASE))
    meta["seconds"] = round(time.monotonic() - started, 1)
    result = {
        "meta": meta,
        "mlserver_versions": versions(args.venv),
        "rows": rows_out,
        "runs": {f"{k[0]} rows, {k[1]}": v for k, v in runs.items()},
    }
    write_results(args.out, result)
    for row in rows_out:
        print(row)
    if args.write_docs:
        write_section(DOCS, "bench_lightgbm", docs_section(result), title="# bench_lightgbm")


if __name__ == "__main__":
    main()
