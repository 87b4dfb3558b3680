"""The documents a training run passes around and writes, typed: the recipe as a record, the setup
each loop is handed, a loop's result, the timing summary and the model.json of a version.

They are plain JSON-able dicts (Ray ships the setup to the workers, result.json and model.json are
written as they are); these TypedDicts only say which keys they have.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

__all__ = [
    "DataExtra",
    "DataRecord",
    "Hyperparameters",
    "Label",
    "Metrics",
    "ModelSetup",
    "RecipeRecord",
    "RunSetup",
    "Signature",
    "Stats",
    "StepSplit",
    "Task",
    "TimingSummary",
    "TrainResult",
    "TrainingRecord",
    "WorkerTiming",
]

# the recipe's per-family settings: open, checked by each family's builder
Hyperparameters = dict[str, Any]
Task = Literal["classification", "regression"]
Label = int | float | str  # a class label as the rows hold it (bool counts as int)
# a report's or an epoch's numbers: loss, val_accuracy, lr ..., with step, epoch, round and `final`
# (ints and True are numbers too)
Metrics = dict[str, float]
# one worker's totals: steps, wall, rows and each phase's seconds (data, forward, backward,
# sync_wait ...)
WorkerTiming = dict[str, float]


class DataRecordSection(TypedDict):
    source: str
    label: str
    features: list[str] | None
    task: Task | None
    validation_fraction: float
    group_by: str | None
    image_shape: list[int] | None


class ModelRecord(TypedDict):
    family: str
    hyperparameters: Hyperparameters


class WorkersRecord(TypedDict):
    count: int
    cpus_per_worker: float
    gpus_per_worker: float


class TrainingRecordSection(TypedDict):
    epochs: int
    max_steps: int | None
    batch_size: int
    learning_rate: float
    lr_scaling: Literal["linear", "none"]
    warmup_epochs: float
    optimizer: Literal["sgd", "adam"]
    momentum: float
    weight_decay: float
    bucket_cap_mb: float
    mixed_precision: Literal["auto", "on", "off"]
    checkpoint_every_steps: int
    max_failures: int
    boost_rounds: int


class OutputRecord(TypedDict):
    store: str
    formats: list[Literal["torchscript", "onnx"]]
    mlflow: bool


class RecipeRecord(TypedDict):
    """`Recipe.to_record()`: the recipe as JSON, section by section (recipe.py's fields)."""

    name: str
    framework: Literal["pytorch", "tensorflow", "xgboost", "sklearn"]
    seed: int
    data: DataRecordSection
    model: ModelRecord
    workers: WorkersRecord
    training: TrainingRecordSection
    output: OutputRecord


class Stats(TypedDict):
    """The training rows' per-feature mean and std (the models standardise with them), and the image
    shape of a cnn."""

    mean: list[float]
    std: list[float]
    image_shape: list[int] | None


class RunSetup(TypedDict):
    """What the runner knows of a run before it sees the labels."""

    recipe: RecipeRecord
    features: list[str]
    label: str
    profile_dir: str | None  # `--profile`: where the workers write their traces
    progress_file: str  # where the workers' `say` appends (the driver prints it)


class ModelSetup(RunSetup):
    """What a training loop is handed (Ray Train's train_loop_config): the run's setup, the task the
    labels make, and the training rows' statistics."""

    task: Task
    classes: list[Label] | None  # the sorted distinct labels (classification), else None
    stats: Stats
    group: NotRequired[str]  # the group's file name, for one group's model of a `group_by` recipe


class SignatureInput(TypedDict):
    name: str
    dtype: str
    shape: list[int]
    columns: list[str]


class SignatureOutput(TypedDict):
    name: str
    dtype: str
    shape: list[int]
    meaning: str


class Signature(TypedDict):
    """The exported model's input and output, as model.json describes them."""

    inputs: list[SignatureInput]
    outputs: list[SignatureOutput]
    classes: list[Label] | None


class TrainResult(TypedDict):
    """A loop's result.json: the final metrics, every worker's timing, the export's signature."""

    metrics: Metrics
    timing: list[WorkerTiming]
    signature: Signature


class StepSplit(TypedDict):
    """Mean milliseconds per step of each phase."""

    data_ms: float
    compute_ms: float
    sync_wait_ms: float
    allreduce_busy_ms: float


class TimingSummary(TypedDict, total=False):
    """`runner.summarize`: every key, or none when the loop timed no step."""

    steps: float  # an int: the timing's numbers carry it
    samples_per_s: float | None
    step_ms: float
    per_step: StepSplit
    forward_ms: float
    backward_ms: float
    optimizer_ms: float


class DataExtra(TypedDict, total=False):
    dataset: str  # the sklearn: dataset's name


class DataRecord(TypedDict):
    """`DataPlan.record()`: the data's part of model.json."""

    source: str
    format: str
    files: int | None
    label: str
    features: list[str]
    fingerprint: str


class TrainingRecord(TypedDict):
    """model.json: what a version is, how it was trained and what it scored."""

    name: str
    version: int
    framework: str
    stacks: list[str]
    artifact: str
    signature: Signature | None
    metrics: Metrics | dict[str, Metrics]  # per group, for a `group_by` recipe
    groups: list[str] | None
    recipe: RecipeRecord
    data: DataRecord
    code_version: str
    created: str
    wall_time_s: float
    workers: int
    timing: TimingSummary
