"""A training recipe: what `serving train RECIPE.yaml` trains, on how many workers, and where the
model goes.

One strict pydantic document (unknown fields refused, every field described: `serving train --help`
and docs/training.md print these descriptions), checked whole before Ray starts. Model families and
scikit-learn estimators come from fixed lists: a recipe names them, it never names code to import.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Literal, cast

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from serving.documents import BASE_DIR, Document, describe, document_path, folder_of
from serving.training.run_records import Hyperparameters, RecipeRecord, Task

__all__ = [
    "FAMILIES",
    "SKLEARN_ESTIMATORS",
    "Recipe",
    "RecipeError",
    "field_lines",
    "load_recipe",
    "parse_recipe",
]

SKLEARN_DATASETS = ("iris", "wine", "digits", "breast_cancer")
SKLEARN_PREFIX = "sklearn:"

# scikit-learn estimators a recipe may name, by the module that holds each (no other import is ever
# made).
SKLEARN_ESTIMATORS = {
    "logistic_regression": "sklearn.linear_model:LogisticRegression",
    "ridge": "sklearn.linear_model:Ridge",
    "random_forest_classifier": "sklearn.ensemble:RandomForestClassifier",
    "random_forest_regressor": "sklearn.ensemble:RandomForestRegressor",
    "gradient_boosting_classifier": "sklearn.ensemble:GradientBoostingClassifier",
    "gradient_boosting_regressor": "sklearn.ensemble:GradientBoostingRegressor",
    "mlp_classifier": "sklearn.neural_network:MLPClassifier",
    "mlp_regressor": "sklearn.neural_network:MLPRegressor",
}

FAMILIES = {
    "pytorch": ("mlp", "cnn"),
    "tensorflow": ("mlp",),
    "xgboost": ("gbtree",),
    "lightgbm": ("gbdt",),
    "sklearn": tuple(SKLEARN_ESTIMATORS),
}


class Framework(str, Enum):
    pytorch = "pytorch"
    tensorflow = "tensorflow"
    xgboost = "xgboost"
    lightgbm = "lightgbm"
    sklearn = "sklearn"


class RecipeError(ValueError):
    """A recipe that cannot be trained; the message names the recipe file and every field at
    fault."""


class DataSection(Document):
    """Where the rows come from and which column is the label."""

    source: str = Field(
        description="a CSV or Parquet file, or a folder of them (relative to the recipe's folder), "
        "or `sklearn:NAME` for a dataset scikit-learn ships: " + ", ".join(SKLEARN_DATASETS)
    )
    label: str = Field(
        "target", description="the label column (`target` for the sklearn: datasets)"
    )
    features: list[str] | None = Field(
        None,
        description="the feature columns, in the order the model takes them (default: every other column)",
    )
    task: Task | None = Field(
        None,
        description="default: classification for an integer or text label, regression for a float one",
    )
    validation_fraction: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="share of the rows held out for validation, chosen with the recipe's seed",
    )
    group_by: str | None = Field(
        None,
        description="train one model per value of this column, in parallel (one worker each), into one "
        "MultiModel prefix: STORE/NAME/VERSION/<value>.tar.gz",
    )
    image_shape: list[int] | None = Field(
        None,
        description="channels, height, width of an image row (the cnn family); default [1, 8, 8] for "
        "64 features (the digits dataset)",
    )

    @field_validator("source")
    @classmethod
    def _source(cls, value: str, info: ValidationInfo) -> str:
        if value.startswith(SKLEARN_PREFIX):
            name = value.removeprefix(SKLEARN_PREFIX)
            if name not in SKLEARN_DATASETS:
                raise ValueError(
                    f"unknown scikit-learn dataset {name!r}; one of {', '.join(SKLEARN_DATASETS)}"
                )
            return value
        return str(document_path(value, folder_of(info)))


class ModelSection(Document):
    """The model family and its hyperparameters."""

    family: str = Field(
        description="pytorch: mlp, cnn; tensorflow: mlp; xgboost: gbtree; lightgbm: gbdt; sklearn: "
        + ", ".join(SKLEARN_ESTIMATORS)
    )
    hyperparameters: Hyperparameters = Field(
        default_factory=dict,
        description="the family's own: mlp `hidden` (list of widths), `dropout`; cnn `channels` (list), "
        "`hidden`, `dropout`; gbtree any XGBoost booster parameter (`max_depth`, `eta`, ...); gbdt any "
        "LightGBM parameter (`num_leaves`, `learning_rate`, ...); an sklearn "
        "estimator's constructor arguments",
    )


class WorkersSection(Document):
    """How many data-parallel workers, and what each one holds."""

    count: int = Field(1, ge=1, le=256, description="data-parallel workers (sklearn: 1)")
    cpus_per_worker: float = Field(1, gt=0, description="CPUs Ray reserves for each worker")
    gpus_per_worker: float = Field(
        0, ge=0, description="GPUs per worker (pytorch: NCCL and mixed precision)"
    )


class TrainingSection(Document):
    """The optimisation: epochs or steps, batch, learning rate schedule, gradient fusion,
    checkpoints."""

    epochs: int = Field(10, ge=1, description="passes over the training rows")
    max_steps: int | None = Field(
        None, ge=1, description="stop after this many optimizer steps (default: none)"
    )
    batch_size: int = Field(
        32, ge=1, description="rows per worker per step; the global batch is this × workers"
    )
    learning_rate: float = Field(
        0.01, gt=0, description="the rate for one worker (scaled by lr_scaling)"
    )
    lr_scaling: Literal["linear", "none"] = Field(
        "linear",
        description="linear: the rate × workers, as the global batch grows (Goyal et al.; Horovod)",
    )
    warmup_epochs: float = Field(
        1,
        ge=0,
        description="epochs over which the rate ramps linearly from the one-worker rate to the scaled one",
    )
    optimizer: Literal["sgd", "adam"] = Field("sgd", description="sgd (with momentum) or adam")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum")
    weight_decay: float = Field(0.0, ge=0, description="L2 weight decay")
    bucket_cap_mb: float = Field(
        25,
        gt=0,
        description="DDP gradient bucket size in MB: gradients are all-reduced in buckets of this size "
        "(Horovod's tensor-fusion threshold)",
    )
    mixed_precision: Literal["auto", "on", "off"] = Field(
        "auto",
        description="autocast to bfloat16/float16 on GPU (auto: on when the workers have GPUs)",
    )
    checkpoint_every_steps: int = Field(
        50, ge=1, description="write a checkpoint (model, optimizer, schedule, step) every N steps"
    )
    max_failures: int = Field(
        0,
        ge=-1,
        description="times Ray Train replaces a failed worker group and resumes from the last "
        "checkpoint (-1: without limit)",
    )
    boost_rounds: int = Field(50, ge=1, description="xgboost, lightgbm: boosting rounds")


class OutputSection(Document):
    """Where the model goes."""

    store: str = Field(
        "model-store",
        description="the model store folder (relative to the recipe's folder; --store overrides)",
    )
    formats: list[Literal["torchscript", "onnx"]] = Field(
        default_factory=lambda: ["torchscript", "onnx"],  # type: ignore[arg-type]
        description="pytorch: the formats written into model.tar.gz (TorchScript model.pt, ONNX model.onnx)",
    )
    mlflow: bool = Field(
        False,
        description="sklearn: also write the model as an MLflow model (skops) in model.tar.gz's mlflow/ (Image: mlflow)",
    )

    @field_validator("store")
    @classmethod
    def _store(cls, value: str, info: ValidationInfo) -> str:
        return str(document_path(value, folder_of(info)))


class Recipe(Document):
    """A training recipe (docs/training.md)."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
        description="the model's name: STORE/NAME/VERSION/",
    )
    framework: Framework = Field(description="pytorch, tensorflow, xgboost, lightgbm or sklearn")
    seed: int = Field(
        0, ge=0, description="seeds the split, the initial weights and the batch order"
    )
    data: DataSection
    model: ModelSection
    workers: WorkersSection = Field(default_factory=WorkersSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    output: OutputSection = Field(default_factory=OutputSection)

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        framework = self.framework.value
        if self.model.family not in FAMILIES[framework]:
            raise ValueError(
                f"model.family: {self.model.family!r} is not a {framework} family; one of "
                + ", ".join(FAMILIES[framework])
            )
        if self.output.mlflow and framework != "sklearn":
            raise ValueError(
                f"output.mlflow: only sklearn recipes write an MLflow copy (this one is {framework})"
            )
        if framework == "sklearn" and self.workers.count != 1:
            raise ValueError(
                "workers.count: scikit-learn trains on one worker (use group_by for parallel models)"
            )
        if self.data.group_by is not None and self.workers.count != 1:
            raise ValueError(
                "workers.count: with data.group_by each group's model trains on one worker; set 1"
            )
        if self.data.group_by is not None and self.data.group_by == self.data.label:
            raise ValueError("data.group_by: the label column cannot also be the group column")
        return self

    def to_record(self) -> RecipeRecord:
        """The recipe as written into model.json."""
        return cast(RecipeRecord, self.model_dump(mode="json"))


def field_lines() -> list[str]:
    """Every recipe field with its default and description, for `serving train --help` and
    docs/training.md."""
    lines = []

    def walk(model: type[Document], prefix: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, Document):
                # one line, however it is wrapped
                summary = " ".join((annotation.__doc__ or "").split())
                lines.append(f"{prefix}{name}:  {summary}".rstrip())
                walk(annotation, prefix + "  ")
                continue
            default = "required" if field.is_required() else f"default {_shown_default(field)}"
            lines.append(f"{prefix}{name}  ({default})  {field.description or ''}".rstrip())

    walk(Recipe, "")
    return lines


def _shown_default(field: Any) -> str:
    value = field.get_default(call_default_factory=True)
    return "none" if value is None else str(value.value if isinstance(value, Enum) else value)


def parse_recipe(document: Any, base_dir: Path, where: str = "recipe") -> Recipe:
    """Validate a loaded recipe document; RecipeError names every field at fault."""
    if not isinstance(document, dict):
        raise RecipeError(
            f"{where}: a recipe is a YAML mapping (name, framework, data, model, ...)"
        )
    try:
        return Recipe.model_validate(document, context={BASE_DIR: str(base_dir)})
    except ValidationError as error:
        lines = [
            line.removeprefix("@: ") for line in describe(error, "a training recipe", root="@")
        ]
        raise RecipeError("\n".join(f"{where}: {line}" for line in lines)) from None


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate RECIPE.yaml (paths in it are relative to its folder)."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as error:
        raise RecipeError(f"cannot read recipe {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise RecipeError(f"{path} is not valid YAML: {error}") from None
    return parse_recipe(document, path.resolve().parent, str(path))
