"""The TensorFlow data-parallel loop, run once per worker (Ray Train's TensorflowTrainer sets
TF_CONFIG).

A custom `strategy.run` loop on `MultiWorkerMirroredStrategy` (Keras 3's `fit` fails under it): each
step computes this worker's gradients, all-reduces them across the workers (collective ring, packed
into chunks of `bucket_cap_mb`, TensorFlow's tensor fusion), then applies them with PyTorch's update
rules (SGD with momentum, Adam; L2 weight decay) so a recipe means the same thing in both
frameworks. The three phases are separate calls, so each step's time splits into data, compute,
gradient synchronisation and optimizer. Weights start from a seeded generator (identical on every
rank), dropout masks and the batch order are functions of (seed, step or epoch, rank), and
checkpoints hold weights, optimizer state and step: a resumed run ends with the weights of an
uninterrupted one.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import tensorflow as tf

from serving.training.run_records import Metrics, ModelSetup, RecipeRecord, WorkerTiming
from serving.training.session import WorkerSession, label_indices, steps_per_epoch
from serving.training.tf_models import ALLOWED, Mlp, Optimizer, export_model

__all__ = ["train_tensorflow"]

STATE_FILE = "state.npz"
TIMING_KEYS = ("steps", "wall", "rows", "data", "compute", "sync_wait", "optimizer")


class TraceEvent(TypedDict):
    """One complete event ("ph": "X") of the Chrome trace format: a phase of a step, in microseconds."""

    name: str
    ph: str
    ts: float
    dur: float
    pid: int
    tid: int
    args: dict[str, int]  # the step


class Timeline:
    """Times each step's phases into `totals`; with `--profile` (profile_dir) also records the first
    steps as a Chrome trace, worker-RANK.trace.json (Perfetto, chrome://tracing), like torch_loop's
    profiler trace."""

    def __init__(self, folder: str | None, rank: int, steps: int = 50) -> None:
        self.folder, self.rank, self.steps = folder, rank, steps
        self.totals: dict[str, float] = {}
        self.events: list[TraceEvent] = []
        self.step = 0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.totals[name] = self.totals.get(name, 0.0) + end - start
            if self.folder and self.step < self.steps:
                event: TraceEvent = {
                    "name": name,
                    "ph": "X",
                    "ts": start * 1e6,
                    "dur": (end - start) * 1e6,
                    "pid": self.rank,
                    "tid": 0,
                    "args": {"step": self.step},
                }
                self.events.append(event)

    def write(self) -> None:
        if self.folder:
            Path(self.folder).mkdir(parents=True, exist_ok=True)
            trace = {"traceEvents": self.events, "displayTimeUnit": "ms"}
            (Path(self.folder) / f"worker-{self.rank}.trace.json").write_text(json.dumps(trace))


def _strategy(session: WorkerSession) -> tf.distribute.Strategy:
    # TF_CONFIG (set by TensorflowTrainer) names the cluster and this worker
    if session.world_size > 1:
        communication = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)
    return tf.distribute.get_strategy()


def _threads(recipe: RecipeRecord) -> None:
    threads = max(1, int(recipe["workers"]["cpus_per_worker"]))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    # TensorFlow already running in this process (a unit test): keep its settings
    except RuntimeError:
        pass


def _lr(recipe: RecipeRecord, world_size: int, warmup_steps: int, step: int) -> float:
    """The one-worker rate × workers (linear scaling), reached linearly over the warm-up
    (torch_loop's rule)."""
    training = recipe["training"]
    target = float(world_size) if training["lr_scaling"] == "linear" else 1.0
    factor = (
        target
        if warmup_steps <= 0 or step >= warmup_steps
        else 1.0 + (target - 1.0) * step / warmup_steps
    )
    return float(training["learning_rate"]) * factor


def _loss(out: tf.Tensor, y: tf.Tensor, classification: bool) -> tf.Tensor:
    if classification:
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=out))
    return tf.reduce_mean(tf.square(out - tf.reshape(y, tf.shape(out))))


def _evaluate(model: Mlp, x: np.ndarray, y: np.ndarray, setup: ModelSetup) -> Metrics:
    out = model(tf.constant(x))
    if setup["task"] == "classification":
        target = label_indices(y, setup["classes"])
        loss = float(_loss(out, tf.constant(target), True))
        return {
            "val_loss": loss,
            "val_accuracy": float(np.mean(np.argmax(out.numpy(), axis=1) == target)),
        }
    return {"val_loss": float(_loss(out, tf.constant(y.astype(np.float32)), False))}


def train_tensorflow(setup: ModelSetup, session: WorkerSession) -> None:
    """One worker's part of a TensorFlow recipe; rank 0's last report carries the exported
    SavedModel."""
    recipe, training = setup["recipe"], setup["recipe"]["training"]
    _threads(recipe)
    # first: MultiWorkerMirroredStrategy configures collectives at start-up
    strategy = _strategy(session)
    tf.keras.utils.set_random_seed(recipe["seed"])
    classification = setup["task"] == "classification"
    outputs = len(setup["classes"] or []) if classification else 1
    hyper = recipe["model"]["hyperparameters"]
    unknown = sorted(set(hyper) - ALLOWED)
    if unknown:
        raise ValueError(
            f"model.hyperparameters: {', '.join(unknown)} not an mlp hyperparameter (dropout, hidden)"
        )

    train, validation = session.shard("train"), session.shard("validation")
    x_train = train.x.astype(np.float32)
    y_train = (
        label_indices(train.y, setup["classes"]) if classification else train.y.astype(np.float32)
    )
    x_val = validation.x.astype(np.float32)
    features = x_train.shape[1]
    with strategy.scope():
        model = Mlp(features, outputs, setup["stats"], recipe["seed"], **hyper)
        optimizer = Optimizer(training, model.weights)

    per_epoch = steps_per_epoch(len(x_train), training["batch_size"])
    total_steps = per_epoch * training["epochs"]
    if training["max_steps"]:
        total_steps = min(total_steps, training["max_steps"])
    warmup = int(round(training["warmup_epochs"] * per_epoch))
    fusion = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=int(training["bucket_cap_mb"] * 2**20)
    )

    @tf.function(reduce_retracing=True)
    def compute(xb: tf.Tensor, yb: tf.Tensor, seed: tf.Tensor) -> Any:
        def replica(xb, yb):
            with tf.GradientTape() as tape:
                loss = _loss(model(xb, seed), yb, classification)
            return loss, tape.gradient(loss, model.weights)

        return strategy.run(replica, args=(xb, yb))

    @tf.function
    def synchronise(grads: list) -> Any:
        # tf.identity places each gradient on the replica's device, where all_reduce wants it
        def replica(grads):
            local = [tf.identity(g) for g in grads]
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.MEAN, local, fusion
            )

        return strategy.run(replica, args=(grads,))

    @tf.function
    def apply(grads: list, lr: tf.Tensor) -> None:
        optimizer.apply(
            model.weights, [strategy.experimental_local_results(g)[0] for g in grads], lr
        )

    step = 0
    resumed = session.latest_checkpoint()
    if resumed is not None:
        step = _restore(resumed / STATE_FILE, model, optimizer, strategy)
        if session.rank == 0:
            session.say(f"[serving train] resumed from step {step} ({resumed.name})")

    timeline = Timeline(setup.get("profile_dir"), session.rank)
    timed_steps = 0
    bar = (
        session.progress(total_steps, f"{recipe['name']} (rank {session.rank})")
        if session.rank == 0
        else None
    )
    if bar is not None and step:
        bar.update(step)
    metrics: Metrics = {}
    loss: Any = 0.0
    batch_size = training["batch_size"]
    started = time.perf_counter()
    while step < total_steps:
        epoch, offset = divmod(step, per_epoch)
        order = np.random.default_rng([recipe["seed"], epoch, session.rank]).permutation(
            len(x_train)
        )
        for index in range(offset, per_epoch):
            if step >= total_steps:
                break
            with timeline.phase("data"):
                rows = order[index * batch_size : (index + 1) * batch_size]
                xb, yb = tf.constant(x_train[rows]), tf.constant(y_train[rows])
                seed = tf.constant(
                    [recipe["seed"], step * session.world_size + session.rank], tf.int64
                )
            with timeline.phase("compute"):
                loss, grads = compute(xb, yb, seed)
                _block(strategy, loss)
            with timeline.phase("sync_wait"):
                grads = synchronise(grads)
                _block(strategy, grads)
            with timeline.phase("optimizer"):
                apply(grads, tf.constant(_lr(recipe, session.world_size, warmup, step), tf.float32))
                _block(strategy, model.weights[0])
            timed_steps += 1
            timeline.step = timed_steps
            step += 1
            if bar is not None:
                bar.update(1)
            if step % training["checkpoint_every_steps"] == 0 and step < total_steps:
                _checkpoint(session, model, optimizer, step, {"step": step, "epoch": epoch + 1})
        if step % per_epoch == 0 or step >= total_steps:
            lr = _lr(recipe, session.world_size, warmup, step)
            local_loss = float(strategy.experimental_local_results(loss)[0])
            metrics = {"epoch": epoch + 1, "step": step, "loss": local_loss, "lr": lr}
            metrics.update(_evaluate(model, x_val, validation.y, setup))
            if session.rank == 0:
                shown = ", ".join(
                    f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in metrics.items()
                )
                session.say(f"[serving train] {recipe['name']}: {shown}")
    timeline.write()
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - started
    mine: WorkerTiming = {
        "steps": timed_steps,
        "wall": wall,
        "rows": timed_steps * batch_size,
        **timeline.totals,
    }
    timing = _gather(strategy, session, mine)
    _finish(session, setup, model, optimizer, step, metrics, timing)


def _block(strategy: tf.distribute.Strategy, values: Any) -> None:
    """Wait for the values (eager ops may run ahead), so the stopwatch times the phase itself."""
    for value in tf.nest.flatten(values):
        for local in strategy.experimental_local_results(value):
            local.numpy()


def _gather(
    strategy: tf.distribute.Strategy, session: WorkerSession, mine: WorkerTiming
) -> list[WorkerTiming]:
    """Every rank's timing, as rows of a matrix summed across the workers (each rank fills its own
    row)."""
    table = np.zeros((session.world_size, len(TIMING_KEYS)), np.float64)
    table[session.rank] = [float(mine.get(key, 0.0)) for key in TIMING_KEYS]
    total = lambda t: tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.identity(t)
    )
    summed = strategy.run(tf.function(total), args=(tf.constant(table),))
    rows = strategy.experimental_local_results(summed)[0].numpy()
    return [
        {
            key: (int(value) if key in ("steps", "rows") else float(value))
            for key, value in zip(TIMING_KEYS, row)
        }
        for row in rows
    ]


def _save(path: Path, model: Mlp, optimizer: Optimizer, step: int) -> None:
    """Weights, optimizer state and step, as named arrays (restored by `_restore`)."""
    state: dict[str, np.ndarray] = {f"model_{i}": v.numpy() for i, v in enumerate(model.weights)}
    state.update({f"optimizer_{i}": v.numpy() for i, v in enumerate(optimizer.variables_list)})
    state["step"] = np.asarray(step, np.int64)
    np.savez(path, **state)  # type: ignore[arg-type]  # numpy's stub checks **kwds against allow_pickle: bool


def _restore(path: Path, model: Mlp, optimizer: Optimizer, strategy: tf.distribute.Strategy) -> int:
    with np.load(path) as state, strategy.scope():
        for i, v in enumerate(model.weights):
            v.assign(state[f"model_{i}"])
        for i, v in enumerate(optimizer.variables_list):
            v.assign(state[f"optimizer_{i}"])
        return int(state["step"])


def _checkpoint(
    session: WorkerSession, model: Mlp, optimizer: Optimizer, step: int, metrics: Metrics
) -> None:
    if session.rank != 0:
        session.report(metrics)
        return
    with tempfile.TemporaryDirectory(prefix="serving-ckpt-") as folder:
        _save(Path(folder) / STATE_FILE, model, optimizer, step)
        session.report(metrics, Path(folder))


def _finish(
    session: WorkerSession,
    setup: ModelSetup,
    model: Mlp,
    optimizer: Optimizer,
    step: int,
    metrics: Metrics,
    timing: list[WorkerTiming],
) -> None:
    final = {**metrics, "final": True}
    if session.rank != 0:
        session.report(final)
        return
    with tempfile.TemporaryDirectory(prefix="serving-final-") as folder:
        root = Path(folder)
        _save(root / STATE_FILE, model, optimizer, step)
        signature = export_model(model, root / "export", setup)
        (root / "result.json").write_text(
            json.dumps({"metrics": metrics, "timing": timing, "signature": signature})
        )
        session.report(final, root)
