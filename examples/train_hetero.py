"""Train the heterogeneous demo's models from scikit-learn's bundled datasets (no downloads).

One model per artifact layout the five stacks accept, written into examples/models/
(or the folder given), with `expected.json` holding a sample request and the answer
each container must give (computed here, in process, with the framework itself):

  sklearn     hetero-features       StandardScaler + PCA(3) on iris: the Serial chain's first step
              hetero-iris-sklearn   StandardScaler + LogisticRegression on iris (class ids)
              hetero-wine-sklearn   StandardScaler + LogisticRegression on wine (predict_proba)
  pytorch     hetero-iris-torchscript/model.pt   TorchScript MLP on iris (class probabilities)
              hetero-wine-export/model.pt2       torch.export MLP on wine (served only with SERVING_ALLOW_PICKLE)
              hetero-iris-state/                 state dict + code/inference.py model_fn (SageMaker convention)
  tensorflow  hetero-tf-features/1/              SavedModel (numbered version folder) on the 3 PCA features
              hetero-tf-iris/model.keras         Keras model on iris
              hetero-tf-wine.tar.gz              model.tar.gz holding wine/1/saved_model.pb (SageMaker layout)
  onnx        hetero-onnx-iris/model.onnx        the TorchScript iris MLP, exported with torch.onnx
              hetero-onnx-two/model.onnx         the same MLP taking two named inputs, sepal and petal
              hetero-onnx-features/model.onnx    an MLP on the 3 PCA features, exported with torch.onnx
  python      hetero-labels, hetero-wine-labels  probabilities or class ids -> names
              hetero-rules                       a hand-written iris rule, no framework

Needs the `torch`, `tensorflow` and `onnx` extras (`pip install -e '.[all]'`).
Run: python examples/train_hetero.py [OUT_DIR]
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import skops.io
from sklearn.datasets import load_iris, load_wine
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

IRIS_PROBES = [0, 50, 100]  # one row of each class: setosa, versicolor, virginica
WINE_PROBES = [0, 59, 130]

# The module the PyTorch models are built from. It is also shipped inside the state-dict
# artifact as code/tabular_net.py, as a SageMaker PyTorch model would ship its model class.
NET_SOURCE = '''\
import torch
from torch import nn


class TabularNet(nn.Module):
    """Standardize the features, one hidden layer, class probabilities."""

    def __init__(self, features: int, classes: int, hidden: int = 16):
        super().__init__()
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("std", torch.ones(features))
        self.layers = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers((x - self.mean) / self.std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits(x), dim=-1)


class SepalPetal(nn.Module):
    """The same network, fed as two named inputs."""

    def __init__(self, net: TabularNet):
        super().__init__()
        self.net = net

    def forward(self, sepal: torch.Tensor, petal: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([sepal, petal], dim=-1))
'''

STATE_DICT_HANDLER = '''\
"""SageMaker PyTorch convention: the artifact holds weights, this model_fn builds the module."""
import os

import torch

from tabular_net import TabularNet


def model_fn(model_dir):
    model = TabularNet(features=4, classes=3)
    state = torch.load(os.path.join(model_dir, "model.pth"), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()
'''

LABELS_HANDLER = '''\
"""Class probabilities (or ids, or a TensorFlow Serving {"predictions": ...}) -> class names."""
import io
import json
import os

import numpy as np


def model_fn(model_dir):
    with open(os.path.join(model_dir, "labels.json")) as f:
        return json.load(f)


def input_fn(body, content_type):
    kind = (content_type or "").split(";")[0].strip()
    if kind == "application/x-npy":
        return np.load(io.BytesIO(body), allow_pickle=False)
    if kind == "text/csv":
        text = body if isinstance(body, str) else body.decode()  # str for exactly text/csv, as on SageMaker
        return np.loadtxt(io.StringIO(text), delimiter=",", ndmin=2)
    data = json.loads(body)
    if isinstance(data, dict):
        data = data.get("predictions", data.get("outputs"))
    return np.asarray(data)


def predict_fn(data, labels):
    ids = data.argmax(axis=-1) if data.ndim == 2 else data.astype(int)
    return [labels[int(i)] for i in np.atleast_1d(ids)]


def output_fn(prediction, accept):
    return json.dumps({"labels": prediction}), "application/json"
'''

RULES_HANDLER = '''\
"""A hand-written iris classifier on petal length and width: no framework at all."""
import json

import numpy as np

NAMES = ["setosa", "versicolor", "virginica"]


def predict_fn(rows, model):
    rows = np.atleast_2d(np.asarray(rows, dtype=float))
    return [NAMES[0] if r[2] < 2.5 else NAMES[1] if r[3] < 1.75 else NAMES[2] for r in rows]


def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
'''


def _rules(rows: list[list[float]]) -> list[str]:
    names = ["setosa", "versicolor", "virginica"]
    return [names[0] if r[2] < 2.5 else names[1] if r[3] < 1.75 else names[2] for r in rows]


def _write(folder: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return folder


def _tar(archive: Path, source: Path) -> None:
    """A SageMaker-style model.tar.gz: the folder's contents at the archive root."""
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(source.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(source)), recursive=False)


def _net_module(path: Path) -> Any:
    """Import NET_SOURCE from the file it is shipped in (TorchScript compiles from the source
    file)."""
    import importlib.util

    _write(path.parent, {path.name: NET_SOURCE})
    spec = importlib.util.spec_from_file_location("tabular_net", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train_torch(net: Any, x: np.ndarray, y: np.ndarray, epochs: int = 300) -> Any:
    import torch

    torch.manual_seed(0)
    features = torch.tensor(x, dtype=torch.float32)
    with torch.no_grad():
        net.mean.copy_(features.mean(0))
        net.std.copy_(features.std(0))
    target = torch.tensor(y, dtype=torch.long)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(epochs):  # full batch: these datasets have under 200 rows
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net.logits(features), target).backward()
        optimizer.step()
    return net.eval()


def _train_keras(x: np.ndarray, y: np.ndarray, classes: int, input_name: str = "features") -> Any:
    import keras

    keras.utils.set_random_seed(0)
    normalize = keras.layers.Normalization()
    normalize.adapt(x.astype("float32"))
    inputs = keras.Input((x.shape[1],), name=input_name)
    hidden = keras.layers.Dense(16, activation="relu")(normalize(inputs))
    model = keras.Model(inputs, keras.layers.Dense(classes, activation="softmax")(hidden))
    # 150 full-batch steps run as one graph call (steps_per_execution): Keras' per-epoch overhead
    # would dominate.
    steps = 150
    model.compile(
        keras.optimizers.Adam(0.05), "sparse_categorical_crossentropy", steps_per_execution=steps
    )
    model.fit(
        np.tile(x.astype("float32"), (steps, 1)),
        np.tile(y, steps),
        epochs=1,
        batch_size=len(x),
        shuffle=False,
        verbose=0,
    )
    return model


def _export_onnx(module: Any, example: tuple[Any, ...], names: list[str], path: Path) -> None:
    import torch

    batch = torch.export.Dim("batch")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        module,
        example,
        str(path),
        input_names=names,
        output_names=["probabilities"],
        dynamic_shapes={name: {0: batch} for name in names},
        dynamo=True,
        optimize=False,
        verbose=False,
    )


def train(out: Path) -> dict[str, Any]:
    """Write every model under `out`; returns (and writes to out/expected.json) each one's sample
    request and answer."""
    with warnings.catch_warnings():
        # TorchScript and the exporters warn about their own deprecations; the artifacts are what we
        # want.
        warnings.simplefilter("ignore")
        return _train(out)


def _train(out: Path) -> dict[str, Any]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import torch

    # One thread each: these models are tiny, and spinning thread pools on a busy machine cost
    # seconds.
    torch.set_num_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    iris, wine = load_iris(), load_wine()
    iris_rows = iris.data[IRIS_PROBES].tolist()
    wine_rows = wine.data[WINE_PROBES].tolist()
    names = [str(n) for n in iris.target_names]
    wine_names = [str(n) for n in wine.target_names]
    expected: dict[str, Any] = {}

    def record(name: str, request: Any, response: Any, classes: list[int] | None = None) -> None:
        expected[name] = {
            "request": _plain(request),
            "response": _plain(response),
            "classes": classes,
        }

    # scikit-learn
    features = make_pipeline(StandardScaler(), PCA(n_components=3, random_state=0)).fit(iris.data)
    iris_features = features.transform(iris.data).astype(np.float32)
    skops.io.dump(features, _dir(out / "hetero-features") / "model.skops")
    record("hetero-features", iris_rows, features.transform(iris.data[IRIS_PROBES]))
    iris_sk = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(
        iris.data, iris.target
    )
    skops.io.dump(iris_sk, _dir(out / "hetero-iris-sklearn") / "model.skops")
    record("hetero-iris-sklearn", iris_rows, iris_sk.predict(iris.data[IRIS_PROBES]), [0, 1, 2])
    wine_sk = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(
        wine.data, wine.target
    )
    skops.io.dump(wine_sk, _dir(out / "hetero-wine-sklearn") / "model.skops")
    record(
        "hetero-wine-sklearn", wine_rows, wine_sk.predict_proba(wine.data[WINE_PROBES]), [0, 1, 2]
    )

    # PyTorch: TorchScript, torch.export, and a state dict with the user's model_fn
    state_dir = _write(out / "hetero-iris-state", {"code/inference.py": STATE_DICT_HANDLER})
    net = _net_module(state_dir / "code" / "tabular_net.py")
    iris_net = _train_torch(net.TabularNet(4, 3), iris.data, iris.target)
    iris_probe = torch.tensor(iris_rows, dtype=torch.float32)
    with torch.no_grad():
        iris_probs = iris_net(iris_probe).numpy()
    torch.jit.script(iris_net).save(str(_dir(out / "hetero-iris-torchscript") / "model.pt"))
    record("hetero-iris-torchscript", iris_rows, iris_probs, [0, 1, 2])
    wine_net = _train_torch(net.TabularNet(13, 3), wine.data, wine.target)
    wine_probe = torch.tensor(wine_rows, dtype=torch.float32)
    program = torch.export.export(
        wine_net, (wine_probe,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}}
    )
    torch.export.save(program, str(_dir(out / "hetero-wine-export") / "model.pt2"))
    with torch.no_grad():
        record("hetero-wine-export", wine_rows, wine_net(wine_probe).numpy(), [0, 1, 2])
    torch.save(iris_net.state_dict(), state_dir / "model.pth")
    record("hetero-iris-state", {"instances": iris_rows}, {"predictions": iris_probs}, [0, 1, 2])

    # ONNX, exported from PyTorch
    _export_onnx(iris_net, (iris_probe,), ["x"], out / "hetero-onnx-iris" / "model.onnx")
    record("hetero-onnx-iris", iris_rows, iris_probs, [0, 1, 2])
    two = net.SepalPetal(iris_net).eval()
    _export_onnx(
        two,
        (iris_probe[:, :2], iris_probe[:, 2:]),
        ["sepal", "petal"],
        out / "hetero-onnx-two" / "model.onnx",
    )
    record(
        "hetero-onnx-two",
        {"sepal": [r[:2] for r in iris_rows], "petal": [r[2:] for r in iris_rows]},
        iris_probs,
        [0, 1, 2],
    )
    features_net = _train_torch(net.TabularNet(3, 3), iris_features, iris.target)
    features_probe = torch.tensor(iris_features[IRIS_PROBES])
    _export_onnx(
        features_net, (features_probe,), ["x"], out / "hetero-onnx-features" / "model.onnx"
    )
    with torch.no_grad():
        record(
            "hetero-onnx-features",
            iris_features[IRIS_PROBES].tolist(),
            features_net(features_probe).numpy(),
            [0, 1, 2],
        )

    # TensorFlow: SavedModel in a version folder, a .keras file, and a SageMaker-layout model.tar.gz
    tf_features = _train_keras(iris_features, iris.target, 3)
    tf_features.export(str(out / "hetero-tf-features" / "1"), verbose=False)
    record(
        "hetero-tf-features",
        iris_features[IRIS_PROBES].tolist(),
        tf_features.predict_on_batch(iris_features[IRIS_PROBES]),
        [0, 1, 2],
    )
    tf_iris = _train_keras(iris.data, iris.target, 3)
    tf_iris.save(_dir(out / "hetero-tf-iris") / "model.keras")
    record(
        "hetero-tf-iris",
        {"instances": iris_rows},
        {"predictions": tf_iris.predict_on_batch(np.float32(iris_rows))},
        [0, 1, 2],
    )
    tf_wine = _train_keras(wine.data, wine.target, 3)
    with tempfile.TemporaryDirectory() as staging:
        tf_wine.export(str(Path(staging) / "wine" / "1"), verbose=False)
        _tar(out / "hetero-tf-wine.tar.gz", Path(staging))
    record(
        "hetero-tf-wine.tar.gz",
        {"inputs": wine_rows},
        {"outputs": tf_wine.predict_on_batch(np.float32(wine_rows))},
        [0, 1, 2],
    )

    # Python: names for class probabilities, and a rule with no framework at all
    _write(
        out / "hetero-labels",
        {"labels.json": json.dumps(names), "code/inference.py": LABELS_HANDLER},
    )
    record("hetero-labels", iris_probs, {"labels": [names[i] for i in iris_probs.argmax(axis=1)]})
    _write(
        out / "hetero-wine-labels",
        {"labels.json": json.dumps(wine_names), "code/inference.py": LABELS_HANDLER},
    )
    record("hetero-wine-labels", [0, 2, 1], {"labels": [wine_names[i] for i in (0, 2, 1)]})
    _write(out / "hetero-rules", {"code/inference.py": RULES_HANDLER})
    record("hetero-rules", iris_rows, _rules(iris_rows))

    (out / "expected.json").write_text(json.dumps(expected, indent=1))
    print(f"heterogeneous demo models written to {out} in {time.monotonic() - started:.1f} s")
    return expected


def _dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


if __name__ == "__main__":
    train(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "models")
