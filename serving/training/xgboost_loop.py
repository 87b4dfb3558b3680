"""The XGBoost recipe: gradient-boosted trees trained across workers (Ray Train's XGBoost
collective).

Each worker builds a DMatrix from its shard; inside Ray Train's communicator context `xgboost.train`
is distributed (histograms all-reduced every round), so every worker ends with the same booster. The
booster is saved as SageMaker's built-in XGBoost algorithm names it, `xgboost-model`, which the
`xgboost` stack loads.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from serving.training import boosted_trees
from serving.training.run_records import Hyperparameters, ModelSetup
from serving.training.session import WorkerSession

__all__ = ["MODEL_FILE", "booster_params", "train_xgboost"]

MODEL_FILE = "xgboost-model"


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


def train_xgboost(setup: ModelSetup, session: WorkerSession) -> None:
    """One worker's part; rank 0 reports the final booster and the validation metrics."""
    import xgboost

    recipe = setup["recipe"]
    rounds = int(recipe["training"]["boost_rounds"])
    every = int(recipe["training"]["checkpoint_every_steps"])
    train, validation = session.shard("train"), session.shard("validation")
    dtrain = xgboost.DMatrix(
        train.x, label=boosted_trees.labels(setup, train.y), feature_names=setup["features"]
    )
    dval = xgboost.DMatrix(
        validation.x,
        label=boosted_trees.labels(setup, validation.y),
        feature_names=setup["features"],
    )
    resumed = session.latest_checkpoint()
    start_from = None
    if resumed is not None:
        start_from = xgboost.Booster()
        start_from.load_model(str(resumed / MODEL_FILE))
    done = start_from.num_boosted_rounds() if start_from is not None else 0
    bar = boosted_trees.progress(setup, session, rounds, done)

    class Checkpoints(xgboost.callback.TrainingCallback):
        def after_iteration(self, model: Any, epoch: int, evals_log: dict) -> bool:
            if bar is not None:
                bar.update(1)
            boosted = model.num_boosted_rounds()
            if boosted % every == 0 and boosted < rounds:
                metrics = {
                    name: values[-1] for name, values in evals_log.get("validation", {}).items()
                }
                boosted_trees.report(
                    session,
                    MODEL_FILE,
                    partial(_saved, model),
                    {"round": boosted, **metrics},
                    False,
                )
            return False

    history: boosted_trees.EvalsLog = {}
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
    boosted_trees.finish(
        setup,
        session,
        history=history,
        predicted=booster.predict(dval),
        boosted=booster.num_boosted_rounds(),
        span=(rounds, done, wall),
        shards=(train, validation),
        dtype="float32",
        model_file=MODEL_FILE,
        saved=partial(_saved, booster),
    )


def _saved(booster: Any) -> bytes:
    """XGBoost's JSON model (the file name has no extension)."""
    return bytes(booster.save_raw(raw_format="json"))
