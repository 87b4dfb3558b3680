"""Batching over real HTTP: one MLP (TorchScript and ONNX) behind our endpoint and behind MLServer,
with and without batching, loaded by wrk at 64 connections with one-row requests.

Both systems get the same model files, the same batch limits (32 rows, 2 ms) and the same cores: our
containers reserve `Resources.Cpus: 2` (two model threads of one intra-op thread each), MLServer's
runtime sets two intra-op threads in its one default inference worker. Each system is measured alone
on the machine (MLServer first, then ours); every case after a warm-up at the same concurrency,
waiting for quiet as bench_invoke does. Before the servers start, `model_cost` measures the model
alone in this process (one row per call, and 32-row batches): what batching can save per request, to
set against what a request costs the server in all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from loadtests.harness.peers import mlserver_settings
from loadtests.harness.processes import BenchError, Processes, free_port, http, log, wait_until
from loadtests.harness.servers import CHILD_SCRIPT
from loadtests.harness.wrk import Case, Wrk

WIDTHS = [256, 1024, 1024, 10]  # 1.32 M parameters
MAX_BATCH, DELAY_MS, CONNECTIONS, CPUS = 32, 2.0, 64, 2
HERE = Path(__file__).resolve().parent
JSON = {"Content-Type": "application/json"}


def build_models(folder: Path) -> dict[str, Path]:
    """The MLP as TorchScript (model.pt) and ONNX (model.onnx, dynamic batch axis), same weights, no
    downloads."""
    import torch

    torch.manual_seed(0)
    layers: list[Any] = []
    for a, b in zip(WIDTHS, WIDTHS[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).eval()
    paths = {"torch": folder / "torch", "onnx": folder / "onnx"}
    for path in paths.values():
        path.mkdir(parents=True, exist_ok=True)
    torch.jit.script(model).save(str(paths["torch"] / "model.pt"))
    example = torch.zeros(1, WIDTHS[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notices about its own future
        torch.onnx.export(
            model,
            (example,),
            str(paths["onnx"] / "model.onnx"),
            input_names=["input"],
            output_names=["output"],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            dynamo=True,
            optimize=False,
            verbose=False,
            external_data=False,
        )
    return paths


def model_cost(models: dict[str, Path], seconds: float = 3.0) -> dict[str, dict[str, float]]:
    """CPU µs per row of the model alone, one intra-op thread (ours' setting): 1-row calls and
    32-row batches."""
    import time

    import numpy as np
    import onnxruntime
    import torch

    torch.set_num_threads(1)
    module = torch.jit.load(str(models["torch"] / "model.pt")).eval()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(
        str(models["onnx"] / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )

    def torch_call(rows: np.ndarray) -> None:
        with torch.inference_mode():
            module(torch.from_numpy(rows))

    calls = {"torch": torch_call, "onnx": lambda rows: session.run(None, {"input": rows})}
    out: dict[str, dict[str, float]] = {}
    for kind, call in calls.items():
        out[kind] = {}
        for size in (1, MAX_BATCH):
            rows = np.random.default_rng(1).standard_normal((size, WIDTHS[0])).astype(np.float32)
            for _ in range(50):
                call(rows)
            count, cpu0, deadline = 0, time.process_time(), time.monotonic() + seconds
            while time.monotonic() < deadline:
                call(rows)
                count += 1
            out[kind][f"rows_{size}"] = (time.process_time() - cpu0) / count / size * 1e6
    return out


def row() -> list[float]:
    import numpy as np

    return [round(float(x), 4) for x in np.random.default_rng(0).standard_normal(WIDTHS[0])]


def our_specs(models: dict[str, Path]) -> list[dict[str, Any]]:
    specs = []
    for kind, image in (("torch", "pytorch"), ("onnx", "onnx")):
        for batched in (False, True):
            container: dict[str, Any] = {
                "ContainerHostname": "mlp",
                "Image": image,
                "ModelDataUrl": str(models[kind]),
                "Resources": {"Cpus": CPUS},
            }
            if batched:
                container["Batching"] = {"MaxBatchSize": MAX_BATCH, "MaxDelayMs": DELAY_MS}
            specs.append(
                {
                    "EndpointName": f"bench-{kind}{'-batched' if batched else ''}",
                    "InferenceExecutionConfig": {"Mode": "Direct"},
                    "Containers": [container],
                }
            )
    return specs


def mlserver_ensure_frameworks(venv: Path) -> None:
    """torch and onnxruntime in MLServer's environment, at our versions (CPU wheels), for the custom
    runtimes."""
    import importlib.metadata as metadata

    wanted = [
        f"torch=={metadata.version('torch')}",
        f"onnxruntime=={metadata.version('onnxruntime')}",
    ]
    check = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import torch, onnxruntime; print(torch.__version__, onnxruntime.__version__)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    versions = check.stdout.split()
    if check.returncode == 0 and [v.split("+")[0] for v in versions] == [
        w.split("==")[1].split("+")[0] for w in wanted
    ]:  # torch reports 2.13.0+cpu in both; compare the release only
        return
    log(f"installing {' '.join(wanted)} into {venv} (first run only) ...")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *wanted], check=True, timeout=1800)


def start_mlserver(
    processes: Processes, binary: Path, models: dict[str, Path], root: Path, logs: Path
) -> tuple[subprocess.Popen, str]:
    """One MLServer (default settings, one inference worker, but `debug: false` as in production: no
    access-log line per request) with four models: each MLP with and without adaptive batching."""
    http_port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    (root / "settings.json").write_text(mlserver_settings(http_port))
    implementation = {
        "torch": ("TorchScriptModel", "model.pt"),
        "onnx": ("OnnxModel", "model.onnx"),
    }
    for kind, (cls, filename) in implementation.items():
        for batched in (False, True):
            name = f"bench-{kind}{'-batched' if batched else ''}"
            folder = root / name
            folder.mkdir(exist_ok=True)
            shutil.copy(models[kind] / filename, folder / filename)
            shutil.copy(HERE / "mlserver_runtime.py", folder / "mlserver_runtime.py")
            settings: dict[str, Any] = {
                "name": name,
                "implementation": f"mlserver_runtime.{cls}",
                "parameters": {"uri": f"./{filename}"},
            }
            if batched:
                settings |= {"max_batch_size": MAX_BATCH, "max_batch_time": DELAY_MS / 1000}
            (folder / "model-settings.json").write_text(json.dumps(settings))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env |= {
        "PATH": f"{binary.parent}:{env.get('PATH', '')}",
        "BENCH_NUM_THREADS": str(CPUS),
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    log_file = logs / "mlserver-batching.log"
    process = processes.start(
        [str(binary), "start", str(root)],
        cwd=root,
        env=env,
        stdout=open(log_file, "wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{http_port}"

    def ready() -> bool:
        if process.poll() is not None:
            raise BenchError(f"MLServer exited with {process.returncode}; see {log_file}")
        return all(
            http("GET", f"{url}/v2/models/bench-{kind}{suffix}/ready", timeout=2)[0] == 200
            for kind in implementation
            for suffix in ("", "-batched")
        )

    wait_until("MLServer models", ready, timeout=300, interval=0.5)
    return process, url


def start_ours(
    processes: Processes, models: dict[str, Path], logs: Path
) -> tuple[subprocess.Popen, str]:
    """Our endpoint server with the four endpoints, in a child process with its own embedded Ray."""
    options = json.dumps(
        {
            "specs": our_specs(models),
            "num_cpus": 4 * CPUS + 2,
            "ready_timeout_s": 300,
            "settings": {},
        }
    )
    process = processes.start(
        [sys.executable, "-c", CHILD_SCRIPT, options],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=open(logs / "ours.log", "wb"),
        text=True,
    )
    url = process.stdout.readline().strip()
    if not url.startswith("http"):
        raise BenchError(f"our endpoint server did not start; see {logs / 'ours.log'}")
    return process, url


def measure(
    wrk: Wrk, processes: Processes, mlserver_bin: Path, work: Path, duration: float, warmup: float
) -> dict[str, Any]:
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    models = build_models(work / "models")
    cost = model_cost(models)
    log(
        f"the model alone, CPU µs per row (1-row calls, {MAX_BATCH}-row batches): {json.dumps(cost)}"
    )
    values = row()
    ours_body = json.dumps([values], separators=(",", ":"))
    v2_body = json.dumps(
        {
            "inputs": [
                {"name": "input", "shape": [1, WIDTHS[0]], "datatype": "FP32", "data": values}
            ]
        },
        separators=(",", ":"),
    )
    cases: list[Case] = []
    samples: dict[str, Any] = {}

    def load(system: str, url: str, body: str) -> None:
        cases.append(
            wrk.case(
                system,
                f"c{CONNECTIONS}",
                CONNECTIONS,
                url,
                duration,
                warmup,
                body=body,
                headers=JSON,
            )
        )

    log("starting MLServer with the four MLP models ...")
    mlserver, url = start_mlserver(processes, mlserver_bin, models, work / "mlserver", logs)
    wrk.meter.roles[mlserver.pid] = "mlserver"
    for name in ("bench-torch", "bench-torch-batched", "bench-onnx", "bench-onnx-batched"):
        status, answer = http("POST", f"{url}/v2/models/{name}/infer", v2_body, JSON)
        if status != 200:
            raise BenchError(f"MLServer {name} answered {status}: {answer[:300]!r}")
        samples[f"MLServer {name}"] = json.loads(answer)["outputs"][0]["data"]
        load(f"MLServer {name}", f"{url}/v2/models/{name}/infer", v2_body)
    processes.stop(mlserver)

    log("starting our endpoint server with the four MLP endpoints ...")
    ours, url = start_ours(processes, models, logs)
    wrk.meter.roles[ours.pid] = "ours"
    try:
        for name in ("bench-torch", "bench-torch-batched", "bench-onnx", "bench-onnx-batched"):
            status, answer = http("POST", f"{url}/endpoints/{name}/invocations", ours_body, JSON)
            if status != 200:
                raise BenchError(f"our {name} answered {status}: {answer[:300]!r}")
            samples[f"ours {name}"] = json.loads(answer)[0]
            load(f"ours {name}", f"{url}/endpoints/{name}/invocations", ours_body)
    finally:
        ours.stdin.close()  # the child stops its server and Ray, then exits
        try:
            ours.wait(120)
        except subprocess.TimeoutExpired:
            processes.stop(ours)
    reference = samples["ours bench-torch"]
    for name, answer in samples.items():  # same weights, same row: the same ten numbers everywhere
        if max(abs(a - b) for a, b in zip(answer, reference)) > 1e-3:
            raise BenchError(f"{name} answered {answer}, not {reference}")
    return {"cases": cases, "sample": reference, "model_cost": cost}


def ratios(cases: list[Case]) -> dict[str, float]:
    rps = {case.system: case.rps for case in cases if not case.flagged}
    out: dict[str, float] = {}
    for system in ("ours", "MLServer"):
        for kind in ("torch", "onnx"):
            base, batched = (
                rps.get(f"{system} bench-{kind}"),
                rps.get(f"{system} bench-{kind}-batched"),
            )
            if base and batched:
                out[f"{system} {kind}: batched / unbatched"] = round(batched / base, 2)
    for kind in ("torch", "onnx"):
        for suffix in ("", "-batched"):
            ours, peer = (
                rps.get(f"ours bench-{kind}{suffix}"),
                rps.get(f"MLServer bench-{kind}{suffix}"),
            )
            if ours and peer:
                out[f"{kind}{suffix or ' unbatched'}: ours / MLServer"] = round(ours / peer, 2)
    return out
