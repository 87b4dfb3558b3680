"""The driver side of `serving train` on Ray: read the rows with Ray Data, split them, run the
trainer.

Data-parallel recipes (PyTorch, TensorFlow, XGBoost, LightGBM) run under Ray Train's trainer for their
framework, the training split sharded across the workers (`get_dataset_shard`, equal shards, in a
fixed order so that a run is reproducible) and the validation split given whole to each.
Single-worker models (scikit-learn, and one per group of a `group_by` recipe) run as Ray tasks, in
parallel. Checkpoints and the final model go through Ray Train's storage (`storage`), which must be
a folder every node can reach on a multi-node cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
import ray.data
import ray.train

from serving.ray_wing.cluster import connect_cluster, start_local_ray, stop_local_ray
from serving.ray_wing.train_session import frame_shard, model_task, quiet_data
from serving.training.data import DataPlan, sklearn_frame
from serving.training.recipe import Recipe
from serving.training.run_records import ModelSetup, TrainResult
from serving.training.runner import TrainingRun, run


def train(
    recipe: Recipe | str | Path,
    store: str | Path | None = None,
    address: str | None = None,
    resume: bool = False,
    profile: bool = False,
    num_cpus: int | None = None,
    verbose: bool = False,
) -> TrainingRun:
    """`serving train`: one run of `recipe` on Ray (embedded unless `address`), published under
    `store` (`training.runner.run` with this module as its Ray); `verbose`: Ray's own output on the
    console too."""
    import sys

    return run(recipe, sys.modules[__name__], store, address, resume, profile, num_cpus, verbose)


__all__ = [
    "fit_data_parallel",
    "fit_per_model",
    "ray_for_training",
    "read_rows",
    "split_rows",
    "train",
]


@contextmanager
def ray_for_training(
    address: str | None,
    num_cpus: int | None = None,
    progress_file: str | None = None,
    verbose: bool = False,
) -> Iterator[None]:
    """The embedded local Ray, or a cluster, while the run's progress lines (`progress_file`) are
    printed as they come. Ray's own output (its workers', Ray Train's and Ray Data's notices)
    reaches the console only when `verbose`; it is in the session's log files either way."""
    global _state_api
    if address:
        connect_cluster(address)
        _state_api = True  # a cluster runs its dashboard, which serves the State API
    else:
        start_local_ray(num_cpus=num_cpus, log_to_driver=verbose)
        _state_api = False
    try:
        with _printed(progress_file):
            yield
    finally:
        if address:
            ray.shutdown()
        else:
            stop_local_ray()


@contextmanager
def _printed(progress_file: str | None) -> Iterator[None]:
    """Print the lines appended to `progress_file` while the block runs (polled twice a second),
    then the rest."""
    if progress_file is None:
        yield
        return
    done, offset = threading.Event(), [0]

    def show() -> None:
        try:
            with open(progress_file, encoding="utf-8") as lines:
                lines.seek(offset[0])
                for line in iter(lines.readline, ""):
                    if not line.endswith("\n"):
                        break  # a line still being written: the next look takes it whole
                    print(line, end="", flush=True)
                    offset[0] = lines.tell()
        except FileNotFoundError:
            pass

    def follow() -> None:
        while not done.wait(0.5):
            show()

    follower = threading.Thread(target=follow, name="training-progress", daemon=True)
    follower.start()
    try:
        yield
    finally:
        done.set()
        follower.join(5)
        show()


# Ray Train V2's PlacementGroupCleaner asks the State API whether the train controller lives; the
# embedded Ray runs no dashboard to serve it, and the cleaner, unable to tell, once removed the
# placement group under the running workers ("The actor died unexpectedly"; the run went on only
# through max_failures). Its job, freeing a crashed controller's workers, is the embedded Ray's
# shutdown here; on a cluster it stays.
_state_api = True


def _trainer(trainer_class: type) -> type:
    """`trainer_class` as is, or, without a State API, without its PlacementGroupCleaner."""
    if _state_api:
        return trainer_class

    class WithoutCleaner(trainer_class):  # a class chosen at run time
        def _create_default_callbacks(self) -> list[Any]:
            callbacks = super()._create_default_callbacks()
            return [c for c in callbacks if type(c).__name__ != "PlacementGroupCleanerCallback"]

    return WithoutCleaner


def read_rows(plan: DataPlan) -> ray.data.Dataset:
    """The recipe's rows as a Ray Dataset, with only the columns the model uses."""
    columns = [*plan.features, plan.label] + ([plan.group_by] if plan.group_by else [])
    if plan.kind == "sklearn":
        dataset: ray.data.Dataset = ray.data.from_pandas(sklearn_frame(plan.extra["dataset"]))
    elif plan.kind == "csv":
        dataset = ray.data.read_csv(list(plan.files))
    else:
        dataset = ray.data.read_parquet(list(plan.files))
    return dataset.select_columns(columns)


def split_rows(
    dataset: ray.data.Dataset, fraction: float, seed: int
) -> tuple[ray.data.Dataset, ray.data.Dataset]:
    """Training and validation splits, chosen by the seed, materialized once (every epoch reads the
    same rows)."""
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    quiet_data()
    train, validation = dataset.train_test_split(test_size=fraction, shuffle=True, seed=seed)
    return train.materialize(), validation.materialize()


def fit_data_parallel(
    setup: ModelSetup, train: Any, validation: Any, storage: Path, run_name: str
) -> Path:
    """Run the recipe's Ray Train trainer; the folder of its final checkpoint (rank 0's model and
    result)."""
    from ray.data import ExecutionOptions

    recipe = setup["recipe"]
    workers = recipe["workers"]
    gpus = float(workers["gpus_per_worker"])
    scaling = ray.train.ScalingConfig(
        num_workers=int(workers["count"]),
        use_gpu=gpus > 0,
        resources_per_worker={
            "CPU": float(workers["cpus_per_worker"]),
            **({"GPU": gpus} if gpus else {}),
        },
    )
    run_config = ray.train.RunConfig(
        name=run_name,
        storage_path=str(storage),
        failure_config=ray.train.FailureConfig(
            max_failures=int(recipe["training"]["max_failures"])
        ),
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
    )
    framework = recipe["framework"]
    trainer_class: type  # Ray Train's trainer for the framework
    worker: Callable[[ModelSetup], None]
    if framework == "pytorch":
        from ray.train.torch import TorchTrainer as trainer_class

        from serving.ray_wing.train_session import torch_worker as worker
    elif framework == "tensorflow":
        from ray.train.tensorflow import TensorflowTrainer as trainer_class

        from serving.ray_wing.train_session import tensorflow_worker as worker
    elif framework == "lightgbm":
        from ray.train.lightgbm import LightGBMTrainer as trainer_class

        from serving.ray_wing.train_session import lightgbm_worker as worker
    else:
        from ray.train.xgboost import XGBoostTrainer as trainer_class

        from serving.ray_wing.train_session import xgboost_worker as worker
    trainer = _trainer(trainer_class)(
        worker,
        train_loop_config=setup,
        scaling_config=scaling,
        run_config=run_config,
        datasets={"train": train, "validation": validation},
        dataset_config=ray.train.DataConfig(
            datasets_to_split=["train"], execution_options=ExecutionOptions(preserve_order=True)
        ),
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(
            f"the {framework} trainer finished without a final model (run {run_name} in {storage})"
        )
    return Path(result.checkpoint.path)


def fit_per_model(
    jobs: dict[str, tuple[ModelSetup, Any, Any]], out: Path
) -> dict[str, TrainResult]:
    """One single-worker model per job (its setup, pandas training and validation rows), as parallel
    Ray tasks; each writes its folder under `out` and returns its result."""
    pending = {}
    for name, (setup, train, validation) in jobs.items():
        cpus = float(setup["recipe"]["workers"]["cpus_per_worker"])
        shards = {
            "train": frame_shard([train], setup),
            "validation": frame_shard([validation], setup),
        }
        pending[name] = model_task.options(num_cpus=cpus).remote(setup, shards, str(out / name))
    return {name: ray.get(ref) for name, ref in pending.items()}
