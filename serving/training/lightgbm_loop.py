"""The LightGBM recipe: gradient-boosted trees trained across workers (Ray Train's LightGBM
network).

Each worker builds a Dataset from its shard; with the network the driver's trainer set up (`network`:
LightGBM's `machines`, `local_listen_port`, `num_machines`), `lightgbm.train` runs its data-parallel
tree learner over sockets (histograms reduced every split), so every worker ends with the same
booster. The booster is saved as LightGBM's text model, `model.txt`, which the `lightgbm` stack
loads.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from serving.training.run_records import Hyperparameters, Metrics, ModelSetup, TrainResult
from serving.training.session import WorkerSession, label_indices

__all__ = ["MODEL_FILE", "lightgbm_params", "train_lightgbm"]

MODEL_FILE = "model.txt"
# lightgbm.record_evaluation's log: each evaluation set's metrics, a float per round
EvalsLog = dict[str, dict[str, list[float]]]
_NAME = re.compile(r"[^A-Za-z0-9_]+")


def lightgbm_params(setup: ModelSetup, network: Mapping[str, Any] | None = None) -> Hyperparameters:
    """The objective for the task, the seed and thread count, the network of a data-parallel run,
    then the recipe's own parameters (any LightGBM parameter: the result is as open as they are)."""
    recipe = setup["recipe"]
    params: Hyperparameters = {
        "seed": recipe["seed"],
        "num_threads": max(1, int(recipe["workers"]["cpus_per_worker"])),
        "deterministic": True,
        "force_row_wise": True,  # what `deterministic` needs, and no start-up timing of both ways
        "verbose": -1,
    }
    if setup["task"] == "regression":
        params.update(objective="regression", metric="rmse")
    elif len(setup["classes"] or []) == 2:
        params.update(objective="binary", metric=["binary_logloss", "binary_error"])
    else:
        params.update(
            objective="multiclass",
            num_class=len(setup["classes"] or []),
            metric=["multi_logloss", "multi_error"],
        )
    if network and int(network.get("num_machines", 1)) > 1:
        # each worker holds its own shard: LightGBM's data-parallel learner, no re-partitioning
        params.update(network, tree_learner="data", pre_partition=True)
    params.update(recipe["model"]["hyperparameters"])
    return params


def _labels(setup: ModelSetup, y: np.ndarray) -> np.ndarray:
    if setup["task"] == "classification":
        return label_indices(y, setup["classes"]).astype(np.float32)
    return y.astype(np.float32)


def train_lightgbm(
    setup: ModelSetup, session: WorkerSession, network: Mapping[str, Any] | None = None
) -> None:
    """One worker's part; rank 0 reports the final booster and the validation metrics."""
    import lightgbm

    recipe = setup["recipe"]
    rounds = int(recipe["training"]["boost_rounds"])
    every = int(recipe["training"]["checkpoint_every_steps"])
    train, validation = session.shard("train"), session.shard("validation")
    # LightGBM refuses JSON's special characters in feature names; requests carry none anyway
    names = [_NAME.sub("_", name) for name in setup["features"]]
    params = lightgbm_params(setup, network)
    dtrain = lightgbm.Dataset(
        train.x, label=_labels(setup, train.y), feature_name=names, free_raw_data=False
    )
    dval = lightgbm.Dataset(validation.x, label=_labels(setup, validation.y), reference=dtrain)
    resumed = session.latest_checkpoint()
    start_from = None
    if resumed is not None:
        start_from = lightgbm.Booster(model_file=str(resumed / MODEL_FILE))
    done = start_from.current_iteration() if start_from is not None else 0
    bar = (
        session.progress(rounds, f"{recipe['name']} (rank {session.rank})")
        if session.rank == 0
        else None
    )
    if bar is not None and done:
        bar.update(done)

    def checkpoints(env: Any) -> None:
        if bar is not None:
            bar.update(1)
        boosted = env.iteration + 1  # counts the resumed rounds too
        if boosted % every == 0 and boosted < rounds:
            metrics = {name: value for _, name, value, *_ in env.evaluation_result_list}
            _report(session, env.model, {"round": boosted, **metrics}, final=False)

    history: EvalsLog = {}
    started = time.perf_counter()
    booster = lightgbm.train(
        params,
        dtrain,
        num_boost_round=max(0, rounds - done),
        valid_sets=[dval],
        valid_names=["validation"],
        init_model=start_from,
        callbacks=[lightgbm.record_evaluation(history), checkpoints],
    )
    wall = time.perf_counter() - started
    if bar is not None:
        bar.close()
    metrics: Metrics = {
        f"val_{name}": float(values[-1]) for name, values in history.get("validation", {}).items()
    }
    predicted = np.asarray(booster.predict(validation.x))
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
            f"[serving train] {setup.get('group') or recipe['name']}: {booster.current_iteration()} rounds, {shown}"
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
                    "dtype": "float64",
                    "shape": [-1, train.x.shape[1]],
                    "columns": setup["features"],
                }
            ],
            "outputs": [
                {
                    "name": "output",
                    "dtype": "float64",
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


def _without_addresses(model: str) -> str:
    """The text model less its `[machines: ip:port,...]` parameter line: the training workers'
    addresses are nothing a model needs, and an artifact travels further than the cluster."""
    return "".join(
        line for line in model.splitlines(keepends=True) if not line.startswith("[machines: ")
    )


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
    with tempfile.TemporaryDirectory(prefix="serving-lgb-") as folder:
        root = Path(folder)
        saved = _without_addresses(booster.model_to_string())
        (root / MODEL_FILE).write_text(saved)
        if final:
            (root / "export").mkdir()
            (root / "export" / MODEL_FILE).write_text(saved)
            (root / "result.json").write_text(json.dumps(result))
        session.report(metrics, root)
