"""What a training loop sees of the cluster: its rank, its shard of the rows, reports, checkpoints,
progress.

The loops (`torch_loop`, `tf_loop`, `xgboost_loop`) are plain framework code written against this
small interface; `serving/ray_wing/train_session.py` implements it on Ray Train (get_dataset_shard,
report, get_checkpoint, tqdm_ray), and `LocalSession` implements it in-process for one worker
(scikit-learn, the per-group models of a MultiModel recipe, and unit tests).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from serving.training.run_records import Label, Metrics

__all__ = ["Progress", "Shard", "WorkerSession", "label_indices"]


@dataclass
class Shard:
    """This worker's rows: float32 features in the recipe's feature order, and the raw labels."""

    x: np.ndarray
    y: np.ndarray


class Progress(Protocol):
    def update(self, n: int = 1) -> None: ...
    def close(self) -> None: ...


class WorkerSession(Protocol):
    rank: int
    world_size: int

    def shard(self, name: str) -> Shard:
        """`train`: this worker's shard; `validation`: every validation row."""
        ...

    def report(self, metrics: Mapping[str, float], checkpoint: Path | None = None) -> None:
        """Every worker calls this at the same step; a checkpoint folder is kept by the run (rank
        0's)."""
        ...

    def latest_checkpoint(self) -> Path | None:
        """The folder of the checkpoint to resume from (after a restart or `--resume`), or None."""
        ...

    def progress(self, total: int, desc: str) -> Progress:
        """A progress bar shown on the driver's console."""
        ...

    def say(self, line: str) -> None:
        """One line of the run's progress (an epoch's metrics) for the driver's console."""
        ...


def label_indices(y: np.ndarray, classes: Sequence[Label] | None) -> np.ndarray:
    """Class labels as indices into `classes` (the sorted distinct labels of the training rows; a
    regression setup's None holds none)."""
    lookup = {value: index for index, value in enumerate(classes or ())}
    try:
        return np.fromiter((lookup[_plain(v)] for v in y), dtype=np.int64, count=len(y))
    except KeyError as error:
        raise ValueError(
            f"label {error.args[0]!r} of a validation row never occurs in the training rows"
        ) from None


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


@dataclass
class _Bar:
    total: int
    desc: str
    done: int = 0

    def update(self, n: int = 1) -> None:
        self.done += n

    def close(self) -> None:
        pass


@dataclass
class LocalSession:
    """One in-process worker: the whole training shard, reports kept in memory, checkpoints in a
    folder."""

    shards: dict[str, Shard]
    checkpoint_root: Path | None = None
    rank: int = 0
    world_size: int = 1
    reports: list[Metrics] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)
    # where `say` appends (the driver prints it), else this process's stdout
    progress_file: str | None = None

    def shard(self, name: str) -> Shard:
        return self.shards[name]

    def report(self, metrics: Mapping[str, float], checkpoint: Path | None = None) -> None:
        self.reports.append(dict(metrics))
        if checkpoint is not None:
            # the loop's folder is temporary: keep a copy, as Ray Train does
            if self.checkpoint_root is not None:
                kept = self.checkpoint_root / f"checkpoint-{len(self.checkpoints):04d}"
                shutil.copytree(checkpoint, kept)
                checkpoint = kept
            self.checkpoints.append(checkpoint)

    def latest_checkpoint(self) -> Path | None:
        return self.checkpoints[-1] if self.checkpoints else None

    def progress(self, total: int, desc: str) -> Progress:
        return _Bar(total, desc)

    def say(self, line: str) -> None:
        say(line, self.progress_file)


def say(line: str, progress_file: str | None) -> None:
    """Append `line` to the run's progress file, which the driver prints as it grows (one write:
    lines from several processes do not interleave), or print it when there is none."""
    if progress_file is None:
        print(line, flush=True)
        return
    with open(progress_file, "a", encoding="utf-8") as out:
        out.write(line + "\n")


@contextmanager
def stopwatch(totals: dict[str, float], key: str) -> Iterator[None]:
    """Adds the block's wall time to totals[key]."""
    import time

    start = time.perf_counter()
    try:
        yield
    finally:
        totals[key] = totals.get(key, 0.0) + time.perf_counter() - start


def steps_per_epoch(rows: int, batch_size: int) -> int:
    return max(1, math.ceil(rows / batch_size))
