"""The worker side of `serving train` on Ray Train: `WorkerSession` over Ray Train's per-worker API.

Ray Train starts one of these entry functions per worker (`torch_worker` inside TorchTrainer's
process group, `tensorflow_worker` with TF_CONFIG set, `xgboost_worker` inside XGBoost's
collective, `lightgbm_worker` with the network LightGBMTrainer set up); each wraps Ray Train's calls in a `RaySession` and runs the framework's loop from
serving/training/, which knows nothing of Ray. `model_task` trains one model in one Ray task
(scikit-learn, and each group of a MultiModel recipe).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.data
import ray.train
from ray.experimental import tqdm_ray

from serving.training.run_records import ModelSetup, RunSetup, TrainResult
from serving.training.session import LocalSession, Progress, Shard, say

__all__ = [
    "RaySession",
    "lightgbm_worker",
    "model_task",
    "tensorflow_worker",
    "torch_worker",
    "xgboost_worker",
]


class RaySession:
    """This worker's rank, shards, reports and checkpoints, from Ray Train."""

    def __init__(self, setup: ModelSetup) -> None:
        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self._setup = setup
        self._shards: dict[str, Shard] = {}
        self._restored: Path | None = None

    def shard(self, name: str) -> Shard:
        if name not in self._shards:
            quiet_data()
            iterator = ray.train.get_dataset_shard(name)
            frames = list(iterator.iter_batches(batch_size=4096, batch_format="pandas"))
            self._shards[name] = frame_shard(frames, self._setup)
        return self._shards[name]

    def report(self, metrics: Mapping[str, float], checkpoint: Path | None = None) -> None:
        saved = (
            ray.train.Checkpoint.from_directory(str(checkpoint)) if checkpoint is not None else None
        )
        ray.train.report(metrics, checkpoint=saved)

    def latest_checkpoint(self) -> Path | None:
        if self._restored is None:
            checkpoint = ray.train.get_checkpoint()
            if checkpoint is None:
                return None
            self._restored = Path(
                checkpoint.to_directory(tempfile.mkdtemp(prefix="serving-restore-"))
            )
        return self._restored

    def progress(self, total: int, desc: str) -> Progress:
        return tqdm_ray.tqdm(total=total, desc=desc)

    def say(self, line: str) -> None:
        say(line, self._setup.get("progress_file"))


def quiet_data() -> None:
    """No Ray Data progress bars or notices on the console: the trainer's own bar and metric lines
    are shown."""
    import logging

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)


def frame_shard(frames: list[Any], setup: RunSetup) -> Shard:
    """Rows of pandas frames as (float32 features in the recipe's order, raw labels)."""
    import pandas as pd

    features, label = setup["features"], setup["label"]
    frame = (
        pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*features, label])
    )
    return Shard(frame[features].to_numpy(dtype=np.float32), frame[label].to_numpy())


def torch_worker(setup: ModelSetup) -> None:
    from serving.training.torch_loop import train_torch

    train_torch(setup, RaySession(setup))


def tensorflow_worker(setup: ModelSetup) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from serving.training.tf_loop import train_tensorflow

    train_tensorflow(setup, RaySession(setup))


def xgboost_worker(setup: ModelSetup) -> None:
    from serving.training.xgboost_loop import train_xgboost

    train_xgboost(setup, RaySession(setup))


def lightgbm_worker(setup: ModelSetup) -> None:
    from ray.train.lightgbm import get_network_params

    from serving.training.lightgbm_loop import train_lightgbm

    train_lightgbm(setup, RaySession(setup), network=get_network_params())


LOOPS = {
    "pytorch": "serving.training.torch_loop:train_torch",
    "tensorflow": "serving.training.tf_loop:train_tensorflow",
    "xgboost": "serving.training.xgboost_loop:train_xgboost",
    "lightgbm": "serving.training.lightgbm_loop:train_lightgbm",
    "sklearn": "serving.training.sklearn_fit:train_sklearn",
}


def run_local(setup: ModelSetup, shards: dict[str, Shard], out: Path) -> TrainResult:
    """One model trained in this process with one worker's loop; its final folder copied to
    `out`."""
    import importlib
    import json
    import shutil

    module, function = LOOPS[setup["recipe"]["framework"]].split(":")
    loop = getattr(importlib.import_module(module), function)
    with tempfile.TemporaryDirectory(prefix="serving-model-") as scratch:
        session = LocalSession(
            shards, checkpoint_root=Path(scratch), progress_file=setup.get("progress_file")
        )
        loop(setup, session)
        final = session.latest_checkpoint()
        if final is None:
            raise RuntimeError("the training loop reported no final model")
        shutil.copytree(final, out, dirs_exist_ok=True)
    result: TrainResult = json.loads((out / "result.json").read_text())
    return result


@ray.remote
def model_task(setup: ModelSetup, shards: dict[str, Shard], out: str) -> TrainResult:
    """`run_local` as a Ray task (one CPU share, placed by Ray; `out` must be reachable from its
    node)."""
    return run_local(setup, shards, Path(out))
