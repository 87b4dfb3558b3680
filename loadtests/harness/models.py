"""Models the benchmarks serve, trained from scikit-learn's bundled data into a temporary folder (no
downloads)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from pathlib import Path

from loadtests.harness.peers import MLSERVER_MODEL

ROOT = Path(__file__).resolve().parents[2]
# One request per container of the demo's Direct endpoint (examples/direct.yaml), as files for
# `--payload`.
DEMO_PAYLOADS = {
    "iris": [[5.1, 3.5, 1.4, 0.2]],
    "wine": [[13.2, 1.78, 2.14, 11.2, 100, 2.65, 2.76, 0.26, 1.28, 4.38, 1.05, 3.4, 1050]],
    "labels": [0, 2],
}


def example(name: str):
    """A script of examples/ as a module (train_demo, train_hetero)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def demo_models(work: Path) -> dict[str, Path]:
    """examples/train_demo.py's models in work/models, and one payload file per demo container
    (`--payload HOST=FILE`): hostname -> file."""
    with contextlib.redirect_stdout(sys.stderr):
        example("train_demo").train(work / "models")
    payloads = {}
    for host, body in DEMO_PAYLOADS.items():
        payloads[host] = work / f"{host}.json"
        payloads[host].write_text(json.dumps(body))
    return payloads


def hetero_models(models: Path) -> None:
    """examples/train_hetero.py's fifteen models (three per stack) and their expected.json, into
    `models`."""
    example("train_hetero").train(models)


# --- models ---------------------------------------------------------------------------
def iris_models(work: Path) -> dict[str, Path]:
    """The iris pipeline (skops + joblib, one fitted object) and the Serial demo's models."""
    import joblib
    import skops.io
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    iris = load_iris()
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(
        iris.data, iris.target
    )
    ours = work / "iris"
    ours.mkdir()
    skops.io.dump(model, ours / "model.skops")
    peer = work / "mlserver" / MLSERVER_MODEL
    peer.mkdir(parents=True)
    joblib.dump(model, peer / "model.joblib")

    with contextlib.redirect_stdout(sys.stderr):
        # examples/serial.yaml's layout: models/iris-preprocess, ...
        example("train_demo").train(work / "models")
    return {
        "skops_dir": ours,
        "joblib": peer / "model.joblib",
        "mlserver_root": work / "mlserver",
        "models": work,
    }
