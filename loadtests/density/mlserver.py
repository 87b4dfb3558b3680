"""MLServer 1.7.1 with the fifteen models of examples/fifteen.yaml as models of one server: its model
repository, its V2 requests and their answers.

The scikit-learn models use MLServer's own runtime (`mlserver-sklearn`, which loads joblib files:
the skops files are converted here, as a user moving to MLServer would); the other stacks a small
runtime a user would write (`mlserver_runtime.FrameworkModel`, loading each artifact as the floor
does, `loaders`). Settings are MLServer's defaults (one inference worker) but `debug: false`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from loadtests.density.loaders import bare
from loadtests.harness.peers import mlserver_settings
from loadtests.harness.processes import Processes, free_port

HERE = Path(__file__).resolve().parent
# the sklearn method each container names in examples/fifteen.yaml (mlserver-sklearn: `outputs`)
SKLEARN_OUTPUT = {"hetero-wine-sklearn": "predict_proba", "hetero-features": "transform"}
FLOAT32_STACKS = ("pytorch", "tensorflow", "onnx")


def repository(root: Path, containers: list[dict[str, Any]]) -> None:
    """One model folder per container under `root`, each with its model-settings.json."""
    root.mkdir(parents=True, exist_ok=True)
    for container in containers:
        stack, artifact = container["Image"], Path(container["ModelDataUrl"])
        folder = root / container["ContainerHostname"]
        folder.mkdir()
        if stack == "sklearn":
            import joblib
            import skops.io

            file = artifact / "model.skops"
            joblib.dump(
                skops.io.load(file, trusted=skops.io.get_untrusted_types(file=file)),
                folder / "model.joblib",
            )
            settings = {
                "implementation": "mlserver_sklearn.SKLearnModel",
                "parameters": {"uri": "./model.joblib"},
            }
        else:
            copy = shutil.copytree if artifact.is_dir() else shutil.copy
            copy(artifact, folder / artifact.name)
            shutil.copy(HERE / "loaders.py", folder / "density_loaders.py")
            shutil.copy(HERE / "mlserver_runtime.py", folder / "density_runtime.py")
            settings = {
                "implementation": "density_runtime.FrameworkModel",
                "parameters": {"uri": f"./{artifact.name}", "extra": {"stack": stack}},
            }
        settings["name"] = container["ContainerHostname"]
        (folder / "model-settings.json").write_text(json.dumps(settings))


def _shape(value: Any) -> list[int]:
    if not isinstance(value, list):
        return []
    return [len(value), *(_shape(value[0]) if value else [])]


def _flat(value: Any) -> list[Any]:
    return [v for item in value for v in _flat(item)] if isinstance(value, list) else [value]


def _reshape(flat: list[Any], shape: list[int]) -> Any:
    if len(shape) <= 1:
        return list(flat)
    step = len(flat) // shape[0]
    return [_reshape(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


# Plain lists, not NumPy: the benchmark's own process maps no framework's files (`prepare`).
def _tensor(name: str, rows: Any, stack: str) -> dict[str, Any]:
    flat = _flat(rows)
    if any(isinstance(v, float) for v in flat):
        datatype = "FP32" if stack in FLOAT32_STACKS else "FP64"
    else:
        datatype = "INT64"
    return {"name": name, "shape": _shape(rows), "datatype": datatype, "data": flat}


def v2_request(container: dict[str, Any], request: Any) -> dict[str, Any]:
    """expected.json's sample request as a V2 inference request for this container's model."""
    stack, rows = container["Image"], bare(request)
    if isinstance(rows, dict):  # named inputs (the two-input ONNX model)
        inputs = [_tensor(name, value, stack) for name, value in rows.items()]
    else:
        inputs = [_tensor("input-0", rows, stack)]
    body: dict[str, Any] = {"inputs": inputs}
    output = SKLEARN_OUTPUT.get(Path(container["ModelDataUrl"]).name)
    if stack == "sklearn" and output:
        body["outputs"] = [{"name": output}]
    return body


def v2_answer(response: dict[str, Any], want: Any) -> Any:
    """A V2 response's first output, shaped as the expected answer `want` (MLServer gives a 1-D
    answer a trailing axis)."""
    output = response["outputs"][0]
    data = _flat(output["data"])
    if output["datatype"] == "BYTES":
        return data
    shape = _shape(bare(want))
    size = 1
    for length in shape:
        size *= length
    return _reshape(data, shape) if size == len(data) else _reshape(data, output["shape"])


def start(binary: Path, root: Path, log_file: Path, processes: Processes) -> tuple[Any, str]:
    """`mlserver start` on `root` (settings.json written here), its URL; readiness is the caller's
    to wait for."""
    http_port = free_port()
    (root / "settings.json").write_text(mlserver_settings(http_port))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env |= {
        "PATH": f"{binary.parent}:{env.get('PATH', '')}",
        "OMP_WAIT_POLICY": "PASSIVE",  # as the floor and our containers
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    process = processes.start(
        [str(binary), "start", str(root)],
        cwd=root,
        env=env,
        stdout=open(log_file, "wb"),
        stderr=subprocess.STDOUT,
    )
    return process, f"http://127.0.0.1:{http_port}"


def ensure_tensorflow(venv: Path) -> None:
    """tensorflow-cpu and keras in MLServer's environment, at our versions (the custom runtime's
    TensorFlow models); torch and onnxruntime come from `mlserver_ensure_frameworks`."""
    import importlib.metadata as metadata

    wanted = [f"{name}=={metadata.version(name)}" for name in ("tensorflow-cpu", "keras")]
    code = (
        "import importlib.metadata as m; "
        "print(' '.join(f'{n}=={m.version(n)}' for n in ('tensorflow-cpu', 'keras')))"
    )
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=120
    )
    if check.returncode == 0 and check.stdout.split() == wanted:
        return
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *wanted], check=True, timeout=1800)
