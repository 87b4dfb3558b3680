"""The LightGBM recipe: gradient-boosted trees trained across workers (Ray Train's LightGBM
network).

Each worker builds a Dataset from its shard; with the network the driver's trainer set up (`network`:
LightGBM's `machines`, `local_listen_port`, `num_machines`), `lightgbm.train` runs its data-parallel
tree learner over sockets (histograms reduced every split), so every worker ends with the same
booster. The booster is saved as LightGBM's text model, `model.txt`, which the `lightgbm` stack
loads.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np

from serving.training import boosted_trees
from serving.training.run_records import Hyperparameters, ModelSetup
from serving.training.session import WorkerSession

__all__ = ["MODEL_FILE", "lightgbm_params", "train_lightgbm"]

MODEL_FILE = "model.txt"
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
        train.x, label=boosted_trees.labels(setup, train.y), feature_name=names, free_raw_data=False
    )
    dval = lightgbm.Dataset(
        validation.x, label=boosted_trees.labels(setup, validation.y), reference=dtrain
    )
    resumed = session.latest_checkpoint()
    start_from = None
    if resumed is not None:
        start_from = lightgbm.Booster(model_file=str(resumed / MODEL_FILE))
    done = start_from.current_iteration() if start_from is not None else 0
    bar = boosted_trees.progress(setup, session, rounds, done)

    def checkpoints(env: Any) -> None:
        if bar is not None:
            bar.update(1)
        boosted = env.iteration + 1  # counts the resumed rounds too
        if boosted % every == 0 and boosted < rounds:
            metrics = {name: value for _, name, value, *_ in env.evaluation_result_list}
            boosted_trees.report(
                session,
                MODEL_FILE,
                partial(_saved, env.model),
                {"round": boosted, **metrics},
                False,
            )

    history: boosted_trees.EvalsLog = {}
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
    boosted_trees.finish(
        setup,
        session,
        history=history,
        predicted=np.asarray(booster.predict(validation.x)),
        boosted=booster.current_iteration(),
        span=(rounds, done, wall),
        shards=(train, validation),
        dtype="float64",
        model_file=MODEL_FILE,
        saved=partial(_saved, booster),
    )


def _saved(booster: Any) -> bytes:
    """The text model, less the training workers' addresses."""
    return _without_addresses(booster.model_to_string()).encode()


def _without_addresses(model: str) -> str:
    """The text model less its `[machines: ip:port,...]` parameter line: the training workers'
    addresses are nothing a model needs, and an artifact travels further than the cluster."""
    return "".join(
        line for line in model.splitlines(keepends=True) if not line.startswith("[machines: ")
    )
