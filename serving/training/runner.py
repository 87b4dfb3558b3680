"""One training run, end to end: check the recipe, read and split the rows, train on Ray, publish
the version.

Everything that can be refused (the recipe, its data, a missing framework) is refused before Ray
starts. Ray itself is the caller's to pass in (`on_ray`: `serving.ray_wing.training`, whose `train`
is the entry point), so this package never imports the Ray wing.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from serving.training import versions
from serving.training.data import DataPlan, plan_data
from serving.training.recipe import Recipe, RecipeError, load_recipe
from serving.training.run_records import (
    Metrics,
    ModelSetup,
    RunSetup,
    Stats,
    StepSplit,
    Task,
    TimingSummary,
    TrainingRecord,
    TrainResult,
    WorkerTiming,
)

__all__ = ["TrainingRun", "run"]

# What each framework's loop imports, and the serving stacks that load what it writes.
NEEDS = {
    "pytorch": "torch",
    "tensorflow": "tensorflow",
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
    "sklearn": "sklearn",
}
STACKS = {
    "pytorch": ["pytorch", "onnx"],
    "tensorflow": ["tensorflow"],
    "xgboost": ["xgboost"],
    "lightgbm": ["lightgbm"],
    "sklearn": ["sklearn"],
}


def stacks_of(recipe: Recipe) -> list[str]:
    """The serving stacks that load what the recipe writes."""
    return STACKS[recipe.framework.value] + (["mlflow"] if recipe.output.mlflow else [])


# STORE/NAME/VERSION/checkpoint/: the final training state (state.pt) and result.json
CHECKPOINT = "checkpoint"
_GROUP_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class TrainingRun:
    """What a run produced: where the version is, what the model scored, how the time went."""

    name: str
    version: int
    path: Path
    model_data_url: str
    metrics: Metrics | dict[str, Metrics]  # per group, for a `group_by` recipe
    wall_s: float
    workers: int
    timing: TimingSummary = field(default_factory=TimingSummary)
    groups: list[str] = field(default_factory=list)
    stacks: list[str] = field(default_factory=list)


def run(
    recipe: Recipe | str | Path,
    on_ray: Any,
    store: str | Path | None = None,
    address: str | None = None,
    resume: bool = False,
    profile: bool = False,
    num_cpus: int | None = None,
    verbose: bool = False,
) -> TrainingRun:
    """Train a recipe on Ray (embedded local Ray unless `address`) and publish STORE/NAME/VERSION.
    `on_ray`: what reads, splits and fits on Ray (`ray_for_training`, `read_rows`, `split_rows`,
    `fit_data_parallel`, `fit_per_model`). The console shows the run's own progress (a line per
    epoch, from the workers' `say`); `verbose` adds Ray's own output."""
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe)
    plan = plan_data(recipe.data)
    framework = recipe.framework.value
    if importlib.util.find_spec(NEEDS[framework]) is None:
        raise RecipeError(
            f"framework: {framework} is not installed here (pip install 'serving[{framework}]')"
        )
    if (
        framework == "pytorch"
        and "onnx" in recipe.output.formats
        and importlib.util.find_spec("onnxscript") is None
    ):
        raise RecipeError(
            "output.formats: onnx export needs onnx and onnxscript (pip install 'serving[onnx]'), "
            "or list only torchscript"
        )
    if recipe.output.mlflow and importlib.util.find_spec("mlflow") is None:
        raise RecipeError(
            "output.mlflow: the MLflow copy needs mlflow (pip install 'serving[mlflow]')"
        )
    root = Path(store) if store is not None else Path(recipe.output.store)
    version = versions.open_version(root, recipe.name, resume)
    setup: RunSetup = {
        "recipe": recipe.to_record(),
        "features": list(plan.features),
        "label": plan.label,
        "profile_dir": str(version.staging / "timeline") if profile else None,
        # the workers' progress lines, which the driver prints as they come (in the store: every
        # node reaches it)
        "progress_file": str(version.runs / f"{version.run_name}.progress"),
    }
    # the progress file's folder, before any worker writes it
    version.runs.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with on_ray.ray_for_training(
        address, num_cpus=num_cpus, progress_file=setup["progress_file"], verbose=verbose
    ):
        rows = on_ray.read_rows(plan)
        # a `group_by` recipe's models by group, else the one model's result
        groups: dict[str, TrainResult] | None = None
        single: TrainResult | None = None
        if plan.group_by is not None:
            groups = _train_groups(recipe, plan, setup, rows.to_pandas(), version, on_ray)
        else:
            single = _train_one(recipe, plan, setup, rows, version, on_ray)
    wall = time.time() - started
    first = single if single is not None else next(iter((groups or {}).values()))
    record = _record(recipe, plan, version, first, groups, wall)
    path = versions.publish(version, record)
    # checkpoints of a finished run
    shutil.rmtree(version.runs / version.run_name, ignore_errors=True)
    Path(setup["progress_file"]).unlink(missing_ok=True)
    names = list(groups or {})
    return TrainingRun(
        name=recipe.name,
        version=version.number,
        path=path,
        model_data_url=str(path.parent / versions.LATEST) + ("/" if names else ""),
        metrics=record["metrics"],
        wall_s=wall,
        workers=recipe.workers.count,
        timing=summarize(first.get("timing") or []),
        groups=names,
        stacks=stacks_of(recipe),
    )


def _model_setup(setup: RunSetup, recipe: Recipe, labels: np.ndarray, features: Any) -> ModelSetup:
    """The run's setup for one model: the task and classes its training labels make, the statistics
    of its training rows' `features` (a pandas frame)."""
    values = sorted({_plain(v) for v in labels}, key=lambda v: (isinstance(v, str), v))
    kind = np.asarray(labels).dtype.kind
    task: Task = recipe.data.task or ("regression" if kind == "f" else "classification")
    if task == "classification" and len(values) < 2:
        raise RecipeError(
            f"data.label: {recipe.data.label!r} has one value in the training rows; nothing to learn"
        )
    classes = values if task == "classification" else None
    x = features.to_numpy(dtype=np.float64)
    return {**setup, "task": task, "classes": classes, "stats": _stats(recipe, x)}


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _stats(recipe: Recipe, x: np.ndarray) -> Stats:
    return {
        "mean": x.mean(axis=0).tolist(),
        "std": x.std(axis=0).tolist(),
        "image_shape": recipe.data.image_shape,
    }


def _train_one(
    recipe: Recipe,
    plan: DataPlan,
    run_setup: RunSetup,
    rows: Any,
    version: versions.Version,
    on_ray: Any,
) -> TrainResult:
    train, validation = on_ray.split_rows(rows, recipe.data.validation_fraction, recipe.seed)
    frame = train.to_pandas()
    if len(frame) < recipe.workers.count:
        raise RecipeError(
            f"data.source: {len(frame)} training rows for {recipe.workers.count} workers"
        )
    setup = _model_setup(
        run_setup, recipe, frame[plan.label].to_numpy(), frame[list(plan.features)]
    )
    folder = version.staging / CHECKPOINT
    result: TrainResult
    if recipe.framework.value == "sklearn":
        jobs = {CHECKPOINT: (setup, frame, validation.to_pandas())}
        result = on_ray.fit_per_model(jobs, version.staging)[CHECKPOINT]
    else:
        final = on_ray.fit_data_parallel(setup, train, validation, version.runs, version.run_name)
        shutil.copytree(final, folder, dirs_exist_ok=True)
        result = json.loads((folder / "result.json").read_text())
    versions.pack(folder / "export", versions.archive_path(version))
    # in the archive; what stays is the training state, to fine-tune from
    shutil.rmtree(folder / "export")
    return result


def _train_groups(
    recipe: Recipe,
    plan: DataPlan,
    setup: RunSetup,
    frame: Any,
    version: versions.Version,
    on_ray: Any,
) -> dict[str, TrainResult]:
    jobs: dict[str, tuple[ModelSetup, Any, Any]] = {}
    names: dict[str, object] = {}  # a group's file name: the column's value it holds
    for value, rows in sorted(frame.groupby(plan.group_by), key=lambda item: str(item[0])):
        name = _GROUP_NAME.sub("-", str(value)).strip("-.") or "group"
        if name in names:
            raise RecipeError(
                f"data.group_by: groups {names[name]!r} and {value!r} both map to file name {name}"
            )
        names[name] = value
        order = np.random.default_rng(recipe.seed).permutation(len(rows))
        held = max(1, int(round(recipe.data.validation_fraction * len(rows))))
        if len(rows) - held < 2:
            raise RecipeError(
                f"data.group_by: group {value!r} has {len(rows)} rows, too few to train and validate"
            )
        train, validation = rows.iloc[order[held:]], rows.iloc[order[:held]]
        group_setup = _model_setup(
            setup, recipe, train[plan.label].to_numpy(), train[list(plan.features)]
        )
        group_setup["profile_dir"] = None
        group_setup["group"] = name
        jobs[name] = (group_setup, train, validation)
    results: dict[str, TrainResult] = on_ray.fit_per_model(jobs, version.staging / "groups")
    for name in results:
        versions.pack(
            version.staging / "groups" / name / "export", versions.archive_path(version, name)
        )
    shutil.rmtree(version.staging / "groups", ignore_errors=True)
    return results


def _record(
    recipe: Recipe,
    plan: DataPlan,
    version: versions.Version,
    first: TrainResult,
    groups: dict[str, TrainResult] | None,
    wall: float,
) -> TrainingRecord:
    """model.json; `first`: the model's result, or the first group's."""
    grouped = groups is not None
    return {
        "name": recipe.name,
        "version": version.number,
        "framework": recipe.framework.value,
        "stacks": stacks_of(recipe),
        "artifact": "<group>.tar.gz per group (a MultiModel prefix)" if grouped else "model.tar.gz",
        "signature": first.get("signature"),
        "metrics": {name: r["metrics"] for name, r in groups.items()}
        if groups is not None
        else first["metrics"],
        "groups": sorted(groups) if groups is not None else None,
        "recipe": recipe.to_record(),
        "data": plan.record(),
        "code_version": versions.code_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_time_s": round(wall, 3),
        "workers": recipe.workers.count,
        "timing": summarize(first.get("timing") or []),
    }


def summarize(timing: list[WorkerTiming]) -> TimingSummary:
    """Per-step means over the workers: data, compute (forward+backward+optimizer), gradient sync;
    samples/s."""
    if not timing or not timing[0].get("steps"):
        return {}
    steps = max(t["steps"] for t in timing)
    mean = lambda key: sum(t.get(key, 0.0) for t in timing) / len(timing) / steps * 1000
    wall = max(t["wall"] for t in timing)
    split: StepSplit = {
        "data_ms": round(mean("data"), 3),
        # PyTorch times forward and backward apart; TensorFlow's tape gives one `compute` (forward +
        # gradients).
        "compute_ms": round(
            mean("compute") + mean("forward") + mean("backward") + mean("optimizer"), 3
        ),
        "sync_wait_ms": round(mean("sync_wait"), 3),
        "allreduce_busy_ms": round(mean("sync_busy"), 3),
    }
    return {
        "steps": steps,
        "samples_per_s": sum(t["rows"] for t in timing) / wall if wall else None,
        # the loop's wall time per step (slowest worker): the split above plus per-epoch validation
        # and bookkeeping
        "step_ms": round(wall / steps * 1000, 3),
        "per_step": split,
        "forward_ms": round(mean("forward"), 3),
        "backward_ms": round(mean("backward"), 3),
        "optimizer_ms": round(mean("optimizer"), 3),
    }
