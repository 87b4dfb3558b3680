"""Load one of examples/train_hetero.py's artifacts with its own framework and answer a sample
request: what a user's plain Python does, shared by the floor process and the MLServer runtimes.

Each loader returns `predict(request) -> answer`, the request and answer in expected.json's shapes
with their wrappers (`{"instances": ...}`, `{"predictions": ...}`) left to the caller (`bare`). No
import of this project: the MLServer runtimes run it in MLServer's own environment.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

WRAPPERS = ("instances", "inputs", "predictions", "outputs", "labels")


def bare(value: Any) -> Any:
    """The rows inside a wrapper (TensorFlow Serving's `{"instances": rows}`, the label handler's
    `{"labels": names}`), else the value."""
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in WRAPPERS:
        return next(iter(value.values()))
    return value


def _module(path: Path, name: str):
    """A user's script (code/inference.py), imported under a name of its own, its folder on the
    path (for the modules it ships)."""
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torch(folder: Path) -> Callable[[Any], Any]:
    import torch

    torch.set_num_threads(1)
    if (folder / "model.pt").exists():
        model = torch.jit.load(str(folder / "model.pt")).eval()
    elif (folder / "model.pt2").exists():
        model = torch.export.load(str(folder / "model.pt2")).module()
    else:  # a state dict and the user's model_fn
        model = _module(folder / "code" / "inference.py", f"handler_{folder.name}").model_fn(
            str(folder)
        )

    def predict(rows: Any) -> Any:
        with torch.inference_mode():
            return model(torch.tensor(rows, dtype=torch.float32)).numpy().tolist()

    return predict


def _tensorflow(path: Path) -> Callable[[Any], Any]:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if path.name.endswith(".tar.gz"):  # SageMaker's model.tar.gz: unpack, then a SavedModel
        target = Path(tempfile.mkdtemp(prefix="density-tf-"))
        with tarfile.open(path) as archive:
            archive.extractall(target, filter="data")
        path = target
    keras_files = list(path.glob("*.keras"))
    if keras_files:
        import keras

        model = keras.models.load_model(keras_files[0])
        return lambda rows: model(tf.constant(rows, tf.float32), training=False).numpy().tolist()
    saved = next(path.rglob("saved_model.pb")).parent
    loaded = tf.saved_model.load(str(saved))
    return lambda rows: loaded.serve(tf.constant(rows, tf.float32)).numpy().tolist()


def _onnx(folder: Path) -> Callable[[Any], Any]:
    import numpy as np
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(
        str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]

    def predict(request: Any) -> Any:
        named = request if isinstance(request, dict) else {names[0]: request}
        feeds = {name: np.asarray(named[name], dtype=np.float32) for name in names}
        return session.run(None, feeds)[0].tolist()

    return predict


def _sklearn(folder: Path) -> Callable[[Any], Any]:
    import numpy as np
    import skops.io

    file = folder / "model.skops"
    model = skops.io.load(file, trusted=skops.io.get_untrusted_types(file=file))
    # the method each container names (examples/fifteen.yaml: SERVING_SKLEARN_METHOD; a
    # transformer has only `transform`)
    name = {"hetero-wine-sklearn": "predict_proba", "hetero-features": "transform"}
    method = getattr(model, name.get(folder.name, "predict"))
    return lambda rows: method(np.asarray(rows, dtype=float)).tolist()


def _python(folder: Path) -> Callable[[Any], Any]:
    """SageMaker's four hooks, each optional: model_fn, input_fn, predict_fn, output_fn."""
    import numpy as np

    handler = _module(folder / "code" / "inference.py", f"handler_{folder.name}")
    model = handler.model_fn(str(folder)) if hasattr(handler, "model_fn") else None

    def predict(request: Any) -> Any:
        body = json.dumps(request)
        if hasattr(handler, "input_fn"):
            data = handler.input_fn(body, "application/json")
        else:
            data = np.asarray(json.loads(body))
        answer, _ = handler.output_fn(handler.predict_fn(data, model), "application/json")
        return json.loads(answer)

    return predict


LOADERS = {
    "sklearn": _sklearn,
    "pytorch": _torch,
    "tensorflow": _tensorflow,
    "onnx": _onnx,
    "python": _python,
}


def load(stack: str, path: Path) -> Callable[[Any], Any]:
    """`predict(request)` for the artifact at `path`, of `stack`: the request without its wrapper,
    the answer as the framework gives it (lists)."""
    return LOADERS[stack](path)
