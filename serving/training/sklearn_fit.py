"""The scikit-learn recipe: one estimator from the recipe's fixed list, fitted on one worker, saved
with skops."""

from __future__ import annotations

import importlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from serving.training.recipe import SKLEARN_ESTIMATORS
from serving.training.run_records import (
    Hyperparameters,
    Metrics,
    ModelSetup,
    Signature,
    WorkerTiming,
)
from serving.training.session import WorkerSession

__all__ = ["MLFLOW_FOLDER", "build_estimator", "save_mlflow", "train_sklearn"]

MLFLOW_FOLDER = "mlflow"  # in model.tar.gz: the `mlflow` stack finds MLmodel in its one subfolder


def build_estimator(family: str, hyperparameters: Hyperparameters, seed: int) -> Any:
    """StandardScaler → the named estimator; unknown constructor arguments are refused by name."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    module, name = SKLEARN_ESTIMATORS[family].split(":")
    estimator_class = getattr(importlib.import_module(module), name)
    accepted = set(estimator_class().get_params())
    unknown = sorted(set(hyperparameters) - accepted)
    if unknown:
        raise ValueError(f"model.hyperparameters: {', '.join(unknown)} not an argument of {name}")
    arguments = dict(hyperparameters)
    if "random_state" in accepted:
        arguments.setdefault("random_state", seed)
    return make_pipeline(StandardScaler(), estimator_class(**arguments))


def train_sklearn(setup: ModelSetup, session: WorkerSession) -> None:
    """Fit, score on the validation rows, and report the model (`export/model.skops`) and its
    result."""
    import skops.io

    recipe = setup["recipe"]
    train, validation = session.shard("train"), session.shard("validation")
    classification = setup["task"] == "classification"
    y_train = train.y if classification else train.y.astype(np.float64)
    model = build_estimator(
        recipe["model"]["family"], recipe["model"]["hyperparameters"], recipe["seed"]
    )
    started = time.perf_counter()
    model.fit(train.x, y_train)
    wall = time.perf_counter() - started
    predicted = model.predict(validation.x)
    metrics: Metrics
    if classification:
        metrics = {"val_accuracy": float(np.mean(predicted == validation.y))}
    else:
        metrics = {"val_mse": float(np.mean((predicted - validation.y.astype(np.float64)) ** 2))}
    session.say(
        f"[serving train] {setup.get('group') or recipe['name']}: "
        + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
    )
    signature: Signature = {
        "inputs": [
            {
                "name": "input",
                "dtype": "float32",
                "shape": [-1, train.x.shape[1]],
                "columns": setup["features"],
            }
        ],
        "outputs": [
            {
                "name": "output",
                "dtype": str(np.asarray(predicted).dtype),
                "shape": [-1],
                "meaning": "the predicted label" if classification else "the predicted value",
            }
        ],
        "classes": setup["classes"],
    }
    timing: list[WorkerTiming] = [{"steps": 1, "wall": wall, "rows": len(train.x), "forward": wall}]
    with tempfile.TemporaryDirectory(prefix="serving-final-") as folder:
        root = Path(folder)
        (root / "export").mkdir()
        skops.io.dump(model, root / "export" / "model.skops")
        if recipe["output"].get("mlflow"):
            save_mlflow(model, root / "export" / MLFLOW_FOLDER, setup["features"], validation.x)
        (root / "result.json").write_text(
            json.dumps({"metrics": metrics, "timing": timing, "signature": signature})
        )
        session.report({**metrics, "final": True}, root)


def save_mlflow(model: Any, folder: Path, features: list[str], rows: np.ndarray) -> None:
    """The fitted pipeline as an MLflow model (mlflow.sklearn, skops): a signature of one double
    column per feature, inferred from `rows` and their predictions."""
    import mlflow.sklearn
    import pandas as pd
    import sklearn
    import skops
    from mlflow.models import infer_signature

    # doubles: JSON numbers are float64, which mlflow will not narrow to a float32 column
    frame = pd.DataFrame(np.asarray(rows, dtype=np.float64), columns=features)
    mlflow.sklearn.save_model(
        model,
        str(folder),
        serialization_format="skops",
        signature=infer_signature(frame, model.predict(frame)),
        # named, not inferred (mlflow would load the model in a subprocess to find them)
        pip_requirements=[f"scikit-learn=={sklearn.__version__}", f"skops=={skops.__version__}"],
    )
