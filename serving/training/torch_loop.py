"""The PyTorch data-parallel loop, run once per worker (Ray Train's TorchTrainer sets up the process
group).

Horovod's techniques, on torch.distributed: DDP broadcasts rank 0's initial weights and all-reduces
gradients in buckets of `bucket_cap_mb` (the fusion threshold) while backward runs; the learning
rate is the one-worker rate × workers, reached by a linear warm-up; every step's time is split into
data, forward, backward (gradient computation, then the all-reduce it waits for) and optimizer. The
batch order is a function of (seed, epoch, rank) and checkpoints hold the model, optimizer, schedule
and step, so a resumed run ends with the weights of an uninterrupted one.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from serving.training.run_records import Metrics, ModelSetup, RecipeRecord, WorkerTiming
from serving.training.session import WorkerSession, label_indices, steps_per_epoch, stopwatch
from serving.training.torch_export import export_model
from serving.training.torch_models import build_model

__all__ = ["train_torch"]

STATE_FILE = "state.pt"


class SyncClock:
    """A DDP comm hook that all-reduces each bucket (as DDP's default) and times it.

    `busy` sums every bucket's all-reduce (launch to done, overlapping backward); `last_launch` is
    when the last bucket was handed over, i.e. when the local gradients were all computed: backward
    time after that is time spent waiting for the network (exposed synchronisation)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.busy = 0.0
        self.last_launch: float | None = None

    def hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        start = time.perf_counter()
        self.last_launch = start
        tensor = bucket.buffer().div_(self.world_size)
        future = dist.all_reduce(tensor, async_op=True).get_future()

        def done(fut: torch.futures.Future) -> torch.Tensor:
            self.busy += time.perf_counter() - start
            return fut.value()[0]

        return future.then(done)


def _device(recipe: RecipeRecord) -> torch.device:
    if recipe["workers"]["gpus_per_worker"] > 0 and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _lr_factor(recipe: RecipeRecord, world_size: int, warmup_steps: int) -> Callable[[int], float]:
    training = recipe["training"]
    target = float(world_size) if training["lr_scaling"] == "linear" else 1.0

    def factor(step: int) -> float:
        if warmup_steps <= 0 or step >= warmup_steps:
            return target
        return 1.0 + (target - 1.0) * step / warmup_steps

    return factor


def _optimizer(recipe: RecipeRecord, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    training = recipe["training"]
    if training["optimizer"] == "adam":
        return torch.optim.Adam(
            params, lr=training["learning_rate"], weight_decay=training["weight_decay"]
        )
    return torch.optim.SGD(
        params,
        lr=training["learning_rate"],
        momentum=training["momentum"],
        weight_decay=training["weight_decay"],
    )


def _evaluate(
    model: nn.Module, x: np.ndarray, y: np.ndarray, setup: ModelSetup, device: torch.device
) -> Metrics:
    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(x).to(device)).float().cpu()
    model.train()
    if setup["task"] == "classification":
        target = torch.from_numpy(label_indices(y, setup["classes"]))
        loss = nn.functional.cross_entropy(out, target).item()
        return {"val_loss": loss, "val_accuracy": float((out.argmax(1) == target).float().mean())}
    target = torch.from_numpy(y.astype(np.float32)).reshape(out.shape)
    return {"val_loss": nn.functional.mse_loss(out, target).item()}


def train_torch(setup: ModelSetup, session: WorkerSession) -> None:
    """One worker's part of a PyTorch recipe; rank 0's last report carries the exported model."""
    recipe = setup["recipe"]
    training = recipe["training"]
    # every rank builds the same initial weights; DDP broadcasts rank 0's anyway
    torch.manual_seed(recipe["seed"])
    threads = max(1, int(recipe["workers"]["cpus_per_worker"]))
    torch.set_num_threads(threads)
    device = _device(recipe)
    classification = setup["task"] == "classification"
    outputs = len(setup["classes"] or []) if classification else 1

    train, validation = session.shard("train"), session.shard("validation")
    x_train = train.x.astype(np.float32)
    y_train = (
        label_indices(train.y, setup["classes"]) if classification else train.y.astype(np.float32)
    )
    x_val = validation.x.astype(np.float32)

    model = build_model(
        recipe["model"]["family"],
        recipe["model"]["hyperparameters"],
        x_train.shape[1],
        outputs,
        setup["stats"],
    ).to(device)
    clock = SyncClock(session.world_size)
    distributed = dist.is_available() and dist.is_initialized() and session.world_size > 1
    net: nn.Module = model
    if distributed:
        net = nn.parallel.DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=training["bucket_cap_mb"],
        )
        # unannotated wrapper: DDP checks a hook's annotations, which `from __future__ import
        # annotations` makes strings
        net.register_comm_hook(None, lambda state, bucket: clock.hook(state, bucket))

    per_epoch = steps_per_epoch(len(x_train), training["batch_size"])
    total_steps = per_epoch * training["epochs"]
    if training["max_steps"]:
        total_steps = min(total_steps, training["max_steps"])
    warmup = int(round(training["warmup_epochs"] * per_epoch))
    optimizer = _optimizer(recipe, net.parameters())
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _lr_factor(recipe, session.world_size, warmup)
    )
    mixed = training["mixed_precision"] == "on" or (
        training["mixed_precision"] == "auto" and device.type == "cuda"
    )
    amp_dtype = (
        torch.bfloat16
        if device.type == "cuda" and torch.cuda.is_bf16_supported()
        else torch.float16
    )
    scaler = torch.amp.GradScaler(
        "cuda", enabled=mixed and device.type == "cuda" and amp_dtype == torch.float16
    )

    step = 0
    resumed = session.latest_checkpoint()
    if resumed is not None:
        state = torch.load(resumed / STATE_FILE, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step = int(state["step"])
        if session.rank == 0:
            session.say(f"[serving train] resumed from step {step} ({resumed.name})")

    loss_fn = nn.CrossEntropyLoss() if classification else nn.MSELoss()
    totals: dict[str, float] = {}
    timed_steps = timed_rows = 0
    profiler = _profiler(setup, session.rank, device)
    bar = (
        session.progress(total_steps, f"{recipe['name']} (rank {session.rank})")
        if session.rank == 0
        else None
    )
    if bar is not None and step:
        bar.update(step)
    metrics: Metrics = {}
    started = time.perf_counter()
    while step < total_steps:
        epoch, offset = divmod(step, per_epoch)
        order = np.random.default_rng([recipe["seed"], epoch, session.rank]).permutation(
            len(x_train)
        )
        batch_size = training["batch_size"]
        for index in range(offset, per_epoch):
            if step >= total_steps:
                break
            with stopwatch(totals, "data"), torch.profiler.record_function("data"):
                rows = order[index * batch_size : (index + 1) * batch_size]
                xb = torch.from_numpy(x_train[rows]).to(device)
                yb = torch.from_numpy(y_train[rows]).to(device)
                if not classification:
                    yb = yb.reshape(-1, 1)
            with stopwatch(totals, "forward"), torch.profiler.record_function("forward"):
                with torch.autocast(device.type, dtype=amp_dtype, enabled=mixed):
                    loss = loss_fn(net(xb).float(), yb)
            clock.last_launch = None
            backward_start = time.perf_counter()
            with torch.profiler.record_function("backward"):
                scaler.scale(loss).backward()
            backward_end = time.perf_counter()
            computed = clock.last_launch if clock.last_launch is not None else backward_end
            totals["backward"] = totals.get("backward", 0.0) + computed - backward_start
            totals["sync_wait"] = totals.get("sync_wait", 0.0) + backward_end - computed
            with stopwatch(totals, "optimizer"), torch.profiler.record_function("optimizer"):
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                schedule.step()
            timed_steps += 1
            # the last batch of an epoch is short: count the rows, not steps × batch
            timed_rows += len(rows)
            step += 1
            if profiler is not None:
                profiler.step()
            if bar is not None:
                bar.update(1)
            if step % training["checkpoint_every_steps"] == 0 and step < total_steps:
                _checkpoint(
                    session, model, optimizer, schedule, step, {"step": step, "epoch": epoch + 1}
                )
        if step % per_epoch == 0 or step >= total_steps:
            metrics = {
                "epoch": epoch + 1,
                "step": step,
                "loss": float(loss.item()),
                "lr": float(schedule.get_last_lr()[0]),
            }
            metrics.update(_evaluate(model, x_val, validation.y, setup, device))
            if session.rank == 0:
                shown = ", ".join(
                    f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in metrics.items()
                )
                session.say(f"[serving train] {setup.get('group') or recipe['name']}: {shown}")
    if profiler is not None:
        profiler.stop()
    if bar is not None:
        bar.close()
    totals["sync_busy"] = clock.busy
    wall = time.perf_counter() - started
    timing = _gather({"steps": timed_steps, "wall": wall, "rows": timed_rows, **totals})
    _finish(session, setup, model, optimizer, schedule, step, metrics, timing, x_val)


def _gather(mine: WorkerTiming) -> list[WorkerTiming]:
    if dist.is_available() and dist.is_initialized():
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        return every
    return [mine]


def _state(model, optimizer, schedule, step: int) -> dict:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "step": step,
    }


def _checkpoint(
    session: WorkerSession, model, optimizer, schedule, step: int, metrics: Metrics
) -> None:
    if session.rank != 0:
        session.report(metrics)
        return
    with tempfile.TemporaryDirectory(prefix="serving-ckpt-") as folder:
        torch.save(_state(model, optimizer, schedule, step), Path(folder) / STATE_FILE)
        session.report(metrics, Path(folder))


def _finish(session, setup, model, optimizer, schedule, step, metrics, timing, x_val) -> None:
    final = {**metrics, "final": True}
    if session.rank != 0:
        session.report(final)
        return
    with tempfile.TemporaryDirectory(prefix="serving-final-") as folder:
        root = Path(folder)
        torch.save(_state(model, optimizer, schedule, step), root / STATE_FILE)
        model = model.cpu().eval()
        signature = export_model(model, root / "export", setup, x_val[:4])
        (root / "result.json").write_text(
            json.dumps({"metrics": metrics, "timing": timing, "signature": signature})
        )
        session.report(final, root)


def _profiler(setup: ModelSetup, rank: int, device: torch.device):
    """torch.profiler over a few steps, written as a Chrome/Perfetto trace per worker
    (`--profile`)."""
    folder = setup.get("profile_dir")
    if not folder:
        return None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def write(prof: torch.profiler.profile) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(Path(folder) / f"worker-{rank}.trace.json"))

    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=8, repeat=1),
        on_trace_ready=write,
    )
    profiler.start()
    return profiler
