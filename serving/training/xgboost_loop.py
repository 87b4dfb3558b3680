"""The XGBoost recipe: gradient-boosted trees trained across workers (Ray Train's XGBoost
collective).

Each worker builds a DMatrix from its shard; inside Ray Train's communicator context `xgboost.train`
is distributed (histograms all-reduced every round), so every worker ends with the same booster. The
booster is saved as SageMaker's built-in XGBoost algorithm names it, `xgboost-model`, which the
`xgboost` stack loads.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from serving.training.run_records import Hyperparameters, Metrics, ModelSetup, TrainResult
from serving.training.session import WorkerSession, label_indices

__all__ = ["MODEL_FILE", "booster_params", "train_xgboost"]

MODEL_FILE = "xgboost-model"
# xgboost.train's evals_result: each evaluation set's metrics, a float per round
EvalsLog = dict[str, dict[str, list[float]]]


def booster_params(setup: ModelSetup) -> Hyperparameters:
    """The objective for the task, the seed and thread count, then the recipe's own parameters (any
    booster parameter: the result is as open as they are)."""
    recipe = setup["recipe"]
    params: Hyperparameters = {
        "seed": recipe["seed"],
        "nthread": max(1, int(recipe["workers"]["cpus_per_worker"])),
    }
    if setup["task"] == "regression":
        params.update(objective="reg:squarederror", eval_metric="rmse")
    elif len(setup["classes"] or []) == 2:
        params.update(objective="binary:logistic", eval_metric=["logloss", "error"])
    else:
        params.update(
            objective="multi:softprob",
            num_class=len(setup["classes"] or []),
            eval_metric=["mlogloss", "merror"],
        )
    params.update(recipe["model"]["hyperparameters"])
    return params


def _labels(setup: ModelSetup, y: np.ndarray) -> np.ndarray:
    if setup["task"] == "classification":
        return label_indices(y, setup["classes"]).astype(np.float32)
    return y.astype(np.float32)


def train_xgboost(setup: ModelSetup, session: WorkerSession) -> None:
    """One worker's part; rank 0 reports the final booster and the validation metrics."""
    import xgboost

    recipe = setup["recipe"]
    rounds = int(recipe["training"]["boost_rounds"])
    every = int(recipe["training"]["checkpoint_every_steps"])
    train, validation = session.shard("train"), session.shard("validation")
    dtrain = xgboost.DMatrix(
        train.x, label=_labels(setup, train.y), feature_names=setup["features"]
    )
    dval = xgboost.DMatrix(
        validation.x, label=_labels(setup, validation.y), feature_names=setup["features"]
    )
    resumed = session.latest_checkpoint()
    start_from = None
    if resumed is not None:
        start_from = xgboost.Booster()
        start_from.load_model(str(resumed / MODEL_FILE))
    done = start_from.num_boosted_rounds() if start_from is not None else 0
    bar = (
        session.progress(rounds, f"{recipe['name']} (rank {session.rank})")
        if session.rank == 0
        else None
    )
    if bar is not None and done:
        bar.update(done)

    class Checkpoints(xgboost.callback.TrainingCallback):
        def after_iteration(self, model: Any, epoch: int, evals_log: dict) -> bool:
            if bar is not None:
                bar.update(1)
            boosted = model.num_boosted_rounds()
            if boosted % every == 0 and boosted < rounds:
                metrics = {
                    name: values[-1] for name, values in evals_log.get("validation", {}).items()
                }
                _report(session, model, {"round": boosted, **metrics}, final=False)
            return False

    history: EvalsLog = {}
    started = time.perf_counter()
    booster = xgboost.train(
        booster_params(setup),
        dtrain,
        num_boost_round=max(0, rounds - done),
        evals=[(dval, "validation")],
        evals_result=history,
        xgb_model=start_from,
        callbacks=[Checkpoints()],
        verbose_eval=False,
    )
    wall = time.perf_counter() - started
    if bar is not None:
        bar.close()
    metrics: Metrics = {
        f"val_{name}": float(values[-1]) for name, values in history.get("validation", {}).items()
    }
    predicted = booster.predict(dval)
    if setup["task"] == "classification":
        chosen = (
            (predicted > 0.5).astype(np.int64) if predicted.ndim == 1 else predicted.argmax(axis=1)
        )
        metrics["val_accuracy"] = float(
            np.mean(chosen == label_indices(validation.y, setup["classes"]))
        )
    if session.rank == 0:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        session.say(
            f"[serving train] {setup.get('group') or recipe['name']}: {booster.num_boosted_rounds()} rounds, {shown}"
        )
    classification = setup["task"] == "classification"
    classes = len(setup["classes"] or [])
    result: TrainResult = {
        "metrics": metrics,
        "timing": [
            {
                "steps": rounds - done,
                "wall": wall,
                "rows": len(train.x) * (rounds - done),
                "forward": wall,
            }
        ],
        "signature": {
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
                    "dtype": "float32",
                    "shape": [-1, classes] if classification and classes > 2 else [-1],
                    "meaning": "class probabilities (of classes[1] for two classes)"
                    if classification
                    else "the predicted value",
                }
            ],
            "classes": setup["classes"],
        },
    }
    _report(session, booster, {**metrics, "final": True}, final=True, result=result)


def _report(
    session: WorkerSession,
    booster: Any,
    metrics: Metrics,
    final: bool,
    result: TrainResult | None = None,
) -> None:
    if session.rank != 0:
        session.report(metrics)
        return
    with tempfile.TemporaryDirectory(prefix="serving-xgb-") as folder:
        root = Path(folder)
        # XGBoost's JSON model: the file name has no extension
        saved = bytes(booster.save_raw(raw_format="json"))
        (root / MODEL_FILE).write_bytes(saved)
        if final:
            (root / "export").mkdir()
            (root / "export" / MODEL_FILE).write_bytes(saved)
            (root / "result.json").write_text(json.dumps(result))
        session.report(metrics, root)
