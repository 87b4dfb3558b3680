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
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.bench_open_inference import lua_bytes
from loadtests.harness.cpu import CpuMeter
from loadtests.harness.peers import MLSERVER_MODEL, MLSERVER_VERSION, start_mlserver
from loadtests.harness.processes import BenchError, Processes, http, log
from loadtests.harness.proctree import gateway_and_container, process_cpu_seconds
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

    binary = venv / "bin" / "mlserver"
    if binary.exists():
        return binary
    log(
        f"creating {venv} with mlserver-lightgbm {MLSERVER_VERSION} (first run only; needs PyPI) ..."
    )
    python3 = shutil.which("python3")
    requirements = [
        f"mlserver=={MLSERVER_VERSION}",
        f"mlserver-lightgbm=={MLSERVER_VERSION}",
        f"lightgbm=={lightgbm.__version__}",
        "uvloop<0.22",  # as harness/peers: MLServer 1.7.1's workers fail to start on 0.22
    ]
    try:
        subprocess.run([python3 or "python3", "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *requirements], check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        raise BenchError(f"could not prepare {venv}: {error}; delete it and run again") from None
    return binary


def versions(venv: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
        "('mlserver', 'mlserver-lightgbm', 'lightgbm', 'numpy')}))"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=60
    )
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-300:]}


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


def check_answer(case: str, url: str, body: str, expected: np.ndarray) -> None:
    status, answer = http("POST", url, body.encode(), {"Content-Type": "application/json"})[:2]
    if status != 200:
        raise BenchError(f"{case}: {status} {answer[:300]!r}")
    decoded = json.loads(answer)
    got = decoded["outputs"][0]["data"] if isinstance(decoded, dict) else decoded
    if not np.array_equal(np.asarray(got, dtype=np.float64).reshape(-1), expected.reshape(-1)):
        raise BenchError(f"{case}: the answer is not Booster.predict's: {answer[:300]!r}")


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
        "| rows per request | system, protocol | p50 ms (c1) | req/s (c32) | server CPU µs/request (c32) | "
        "CPU vs MLServer, 1 thread | req/s vs MLServer, 1 thread |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['rows']} | {row['case']} | {row['p50_ms']:.3f} | {row['rps']:,.0f} | {row['cpu_us']:.0f} | "
            f"{row['cpu_ratio']:.2f}× | {row['rps_ratio']:.2f}× |"
        )
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
    # (rows per request, case) -> (url, body, whose processes)
    cases: dict[tuple[int, str], tuple[str, str, str]] = {}
    for count in (1, 32):
        rows = x[:count]
        expected = booster.predict(rows)
        for case, url, body, whose in (
            (DEFAULT, theirs_v2, v2_body(rows), "mlserver"),
            (BASE, tuned_v2, v2_body(rows), "tuned"),
            ("serving, V2 JSON", ours_v2, v2_body(rows), "ours"),
            ("serving, InvokeEndpoint JSON", invoke, json.dumps(rows.tolist()), "ours"),
        ):
            check_answer(case, url, body, expected)
            cases[(count, case)] = (url, body, whose)
    runs: dict[tuple[int, str], list[dict[str, float]]] = {key: [] for key in cases}
    try:
        pids = {
            "ours": gateway_and_container(ENDPOINT),
            "mlserver": {"mlserver": mlserver.pid},
            "tuned": {"mlserver": tuned.pid},
        }
        wrk = Wrk(ensure_wrk(), work, CpuMeter(), timeout_s=30.0)
        scripts = {}
        for key, (url, body, _) in cases.items():
            path = wrk._script("POST", "", {"Content-Type": "application/json"})
            path.write_text(
                path.read_text().replace('wrk.body = ""', f"wrk.body = {lua_bytes(body)}", 1)
            )
            scripts[key] = path
            warm, _ = wrk._run(path, url, 8, 2)
            if warm["status"] or not warm["requests"]:
                raise BenchError(f"{key}: {warm['status']} error answers while warming up")
        for round_ in range(args.rounds):
            for key, (url, _, whose) in cases.items():
                c1, _ = wrk._run(scripts[key], url, 1, args.seconds)
                before = {name: process_cpu_seconds(pid) for name, pid in pids[whose].items()}
                c32, _ = wrk._run(scripts[key], url, 32, args.seconds)
                used = sum(
                    process_cpu_seconds(pid) - before[name] for name, pid in pids[whose].items()
                )
                if any(run[k] for run in (c1, c32) for k in ("status", "timeout", "connect")):
                    raise BenchError(f"{key}: errors under load")
                row = {
                    "p50_ms": c1["p50"] / 1000,
                    "rps": c32["requests"] / (c32["duration_us"] / 1e6),
                    "cpu_us": used / c32["requests"] * 1e6,
                }
                runs[key].append(row)
                log(
                    f"round {round_ + 1} {key[0]:>2} rows {key[1]:<30} p50 {row['p50_ms']:.3f} ms  "
                    f"{row['rps']:6.0f} req/s  {row['cpu_us']:.0f} µs CPU/request"
                )
    finally:
        server.__exit__(None, None, None)
        processes.stop(mlserver)
        processes.stop(tuned)

    def ratio(key: tuple[int, str], field: str) -> float:
        pairs = zip(runs[key], runs[(key[0], BASE)], strict=True)
        return round(statistics.median(s[field] / b[field] for s, b in pairs), 3)

    rows_out = [
        {
            "rows": key[0],
            "case": key[1],
            **{
                field: round(statistics.median(s[field] for s in samples), 3)
                for field in ("p50_ms", "rps", "cpu_us")
            },
            "cpu_ratio": ratio(key, "cpu_us"),
            "rps_ratio": ratio(key, "rps"),
        }
        for key, samples in runs.items()
    ]
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
