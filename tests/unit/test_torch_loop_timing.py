"""The PyTorch loop's step timing counts the rows it trained on (samples/s is what the scaling
benchmark reads).

One in-process worker (LocalSession, no Ray, no process group): the loop is the real one, on real
torch.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from serving.training.recipe import parse_recipe  # noqa: E402
from serving.training.session import LocalSession, Shard  # noqa: E402
from serving.training.torch_loop import train_torch  # noqa: E402

# imports torch, TensorFlow, ONNX Runtime or XGBoost: not in `make test-unit`
pytestmark = pytest.mark.frameworks


def test_rows_counted_include_the_short_last_batch_of_each_epoch(tmp_path) -> None:
    rows, batch, epochs = 50, 16, 2  # 4 steps an epoch: 16 + 16 + 16 + 2 rows
    recipe = parse_recipe(
        {
            "name": "timing",
            "framework": "pytorch",
            "data": {"source": "sklearn:iris"},
            "model": {"family": "mlp", "hyperparameters": {"hidden": [4]}},
            "training": {"epochs": epochs, "batch_size": batch, "checkpoint_every_steps": 1000},
            "output": {"formats": ["torchscript"]},
        },
        tmp_path,
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    y = np.arange(rows) % 3
    setup = {
        "recipe": recipe.to_record(),
        "features": ["a", "b", "c", "d"],
        "label": "target",
        "task": "classification",
        "classes": [0, 1, 2],
        "stats": {"mean": [0.0] * 4, "std": [1.0] * 4, "image_shape": None},
        "profile_dir": None,
    }
    session = LocalSession(
        {"train": Shard(x, y), "validation": Shard(x[:6], y[:6])}, checkpoint_root=tmp_path / "c"
    )
    train_torch(setup, session)
    timing = json.loads((session.checkpoints[-1] / "result.json").read_text())["timing"]
    assert [t["steps"] for t in timing] == [4 * epochs]
    assert [t["rows"] for t in timing] == [rows * epochs]  # not steps × batch (64 per epoch)


def test_summary_gives_the_loop_wall_time_per_step() -> None:
    from serving.training.runner import summarize

    worker = {
        "steps": 10,
        "rows": 300,
        "data": 0.01,
        "forward": 0.1,
        "backward": 0.1,
        "optimizer": 0.05,
    }
    summary = summarize([{**worker, "wall": 0.5}, {**worker, "wall": 0.4}])
    assert summary["step_ms"] == pytest.approx(50.0)  # the slowest worker's wall / steps
    assert summary["samples_per_s"] == pytest.approx(600 / 0.5)
    assert summary["per_step"]["compute_ms"] == pytest.approx(25.0)
