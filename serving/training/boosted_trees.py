"""What the boosted-tree recipes (`xgboost_loop`, `lightgbm_loop`) share once their framework has
trained: labels as floats, the progress bar, the validation metrics and accuracy, the result's
signature and the report of a booster (a checkpoint, or the final one with its export). Only how
each framework saves its booster, and its dtype, differ.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from serving.training.run_records import Metrics, ModelSetup, TrainResult
from serving.training.session import Shard, WorkerSession, label_indices

__all__ = ["EvalsLog", "finish", "labels", "progress", "report"]

# each evaluation set's metrics, a float per round (xgboost's evals_result, LightGBM's
# record_evaluation)
EvalsLog = dict[str, dict[str, list[float]]]


def labels(setup: ModelSetup, y: np.ndarray) -> np.ndarray:
    """The targets as the boosters take them: class indices (classification) or values, as
    float32."""
    if setup["task"] == "classification":
        return label_indices(y, setup["classes"]).astype(np.float32)
    return y.astype(np.float32)


def progress(setup: ModelSetup, session: WorkerSession, rounds: int, done: int) -> Any:
    """Rank 0's progress bar over the rounds, the resumed ones counted; None on other ranks."""
    if session.rank != 0:
        return None
    bar = session.progress(rounds, f"{setup['recipe']['name']} (rank {session.rank})")
    if done:
        bar.update(done)
    return bar


def report(
    session: WorkerSession,
    model_file: str,
    saved: Callable[[], bytes],
    metrics: Metrics,
    final: bool,
    result: TrainResult | None = None,
) -> None:
    """Report `metrics`; rank 0 with the booster (`saved()`, made on rank 0 only) as a checkpoint,
    and when `final` its export and `result`."""
    if session.rank != 0:
        session.report(metrics)
        return
    with tempfile.TemporaryDirectory(prefix="serving-trees-") as folder:
        root = Path(folder)
        model = saved()
        (root / model_file).write_bytes(model)
        if final:
            (root / "export").mkdir()
            (root / "export" / model_file).write_bytes(model)
            (root / "result.json").write_text(json.dumps(result))
        session.report(metrics, root)


def finish(
    setup: ModelSetup,
    session: WorkerSession,
    *,
    history: EvalsLog,
    predicted: np.ndarray,
    boosted: int,
    span: tuple[int, int, float],
    shards: tuple[Shard, Shard],
    dtype: str,
    model_file: str,
    saved: Callable[[], bytes],
) -> None:
    """The final report: the last round's validation metrics and accuracy on `predicted` (the
    validation shard's predictions), rank 0's summary line, the result's timing and signature.
    `span`: (rounds asked, rounds resumed, seconds trained); `shards`: (train, validation)."""
    rounds, done, wall = span
    train, validation = shards
    metrics: Metrics = {
        f"val_{name}": float(values[-1]) for name, values in history.get("validation", {}).items()
    }
    classification = setup["task"] == "classification"
    if classification:
        chosen = (
            (predicted > 0.5).astype(np.int64) if predicted.ndim == 1 else predicted.argmax(axis=1)
        )
        metrics["val_accuracy"] = float(
            np.mean(chosen == label_indices(validation.y, setup["classes"]))
        )
    if session.rank == 0:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        name = setup.get("group") or setup["recipe"]["name"]
        session.say(f"[serving train] {name}: {boosted} rounds, {shown}")
    classes = len(setup["classes"] or [])
    result: TrainResult = {
        "metrics": metrics,
        "timing": [
            {
                "steps": rounds - done,
                "wall": wall,
                "rows": len(train.x) * (rounds - done),
                "forward": wall,
            }
        ],
        "signature": {
            "inputs": [
                {
                    "name": "input",
                    "dtype": dtype,
                    "shape": [-1, train.x.shape[1]],
                    "columns": setup["features"],
                }
            ],
            "outputs": [
                {
                    "name": "output",
                    "dtype": dtype,
                    "shape": [-1, classes] if classification and classes > 2 else [-1],
                    "meaning": "class probabilities (of classes[1] for two classes)"
                    if classification
                    else "the predicted value",
                }
            ],
            "classes": setup["classes"],
        },
    }
    report(session, model_file, saved, {**metrics, "final": True}, final=True, result=result)
