"""Train the demo models from scikit-learn's bundled datasets (no downloads).

Writes into examples/models/ (or the folder given):
  iris-classifier/model.skops   StandardScaler + LogisticRegression on iris
  wine-classifier/model.skops   RandomForest on wine
  iris-preprocess/model.skops   StandardScaler + PCA(3): the Serial chain's first step
  iris-on-features/model.skops  LogisticRegression on those 3 features: the second step
  iris-labels.tar.gz            a Python container (code/inference.py) mapping class ids to names
  customers/customer-N.tar.gz   ten iris classifiers (one per "customer", each its own regularization):
                                the prefix of examples/multimodel.yaml's MultiModel container
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import skops.io
from sklearn.datasets import load_iris, load_wine
from sklearn.decomposition import PCA
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

LABELS_HANDLER = '''\
"""Maps class ids from the previous container to species names (SageMaker handler hooks)."""
import json
import os


def model_fn(model_dir):
    with open(os.path.join(model_dir, "labels.json")) as f:
        return json.load(f)


def input_fn(request_body, request_content_type):
    if request_content_type.split(";")[0].strip() != "application/json":
        raise ValueError(f"expected application/json, got {request_content_type}")
    return json.loads(request_body)


def predict_fn(class_ids, labels):
    return [labels[int(i)] for i in class_ids]


def output_fn(prediction, accept, context):
    # Echo the caller's custom attributes with a count, to show they pass both ways.
    if context.custom_attributes:
        context.response_custom_attributes = f"{context.custom_attributes};labelled={len(prediction)}"
    return json.dumps({"labels": prediction}), "application/json"
'''


def _save(model, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    skops.io.dump(model, folder / "model.skops")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def train(out: Path) -> None:
    iris = load_iris()
    wine = load_wine()
    _save(
        make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(
            iris.data, iris.target
        ),
        out / "iris-classifier",
    )
    _save(
        RandomForestClassifier(n_estimators=50, random_state=0).fit(wine.data, wine.target),
        out / "wine-classifier",
    )
    preprocess = make_pipeline(StandardScaler(), PCA(n_components=3, random_state=0)).fit(iris.data)
    _save(preprocess, out / "iris-preprocess")
    _save(
        LogisticRegression(max_iter=1000).fit(preprocess.transform(iris.data), iris.target),
        out / "iris-on-features",
    )
    with tarfile.open(out / "iris-labels.tar.gz", "w:gz") as tar:
        _add(tar, "labels.json", json.dumps(list(iris.target_names)).encode())
        _add(tar, "code/inference.py", LABELS_HANDLER.encode())
    customers = out / "customers"
    customers.mkdir(parents=True, exist_ok=True)
    # SageMaker multi-model layout: one model.tar.gz per model under one prefix
    for index in range(10):
        model = make_pipeline(
            StandardScaler(), LogisticRegression(C=0.01 * 3**index, max_iter=1000)
        )
        buffer = io.BytesIO()
        skops.io.dump(model.fit(iris.data, iris.target), buffer)
        with tarfile.open(customers / f"customer-{index}.tar.gz", "w:gz") as tar:
            _add(tar, "model.skops", buffer.getvalue())
    print(f"demo models written to {out}")


if __name__ == "__main__":
    train(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "models")
