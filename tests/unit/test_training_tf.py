"""The TensorFlow training loop (serving/training/tf_loop.py) on one in-process worker
(LocalSession).

Named to sort after the other unit tests that start TensorFlow: examples/train_hetero.py (the
session's `hetero_models`) sets TensorFlow's thread pools, which only works before TensorFlow first
runs in a process. The 2-worker MultiWorkerMirroredStrategy path runs under Ray Train in the
integration tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from serving.runtimes import InvocationContext, runtime_for
from serving.training.data import sklearn_frame
from serving.training.recipe import parse_recipe
from serving.training.session import LocalSession, Shard

# imports torch, TensorFlow, ONNX Runtime or XGBoost: not in `make test-unit`
pytestmark = pytest.mark.frameworks

tf_loop = pytest.importorskip("serving.training.tf_loop")

TRAINING = {"epochs": 30, "batch_size": 16, "learning_rate": 0.05, "checkpoint_every_steps": 40}


def iris_setup(
    training: dict, hyperparameters: dict | None = None, optimizer: str = "sgd"
) -> tuple[dict, dict]:
    """The recipe's setup and the train/validation shards: iris split 80/20 with seed 0."""
    frame = sklearn_frame("iris")
    features = [c for c in frame.columns if c != "target"]
    x, y = frame[features].to_numpy(np.float32), frame["target"].to_numpy()
    order = np.random.default_rng(0).permutation(len(x))
    train, validation = order[:120], order[120:]
    recipe = parse_recipe(
        {
            "name": "iris-tf",
            "framework": "tensorflow",
            "seed": 3,
            "data": {"source": "sklearn:iris"},
            "model": {
                "family": "mlp",
                "hyperparameters": hyperparameters or {"hidden": [32, 32], "dropout": 0.1},
            },
            "training": {**training, "optimizer": optimizer},
        },
        Path("."),
    )
    setup = {
        "recipe": recipe.model_dump(mode="json"),
        "task": "classification",
        "classes": sorted(set(y.tolist())),
        "features": features,
        "stats": {"mean": x[train].mean(0).tolist(), "std": x[train].std(0).tolist()},
    }
    shards = {"train": Shard(x[train], y[train]), "validation": Shard(x[validation], y[validation])}
    return setup, shards


def weights(checkpoint: Path) -> list[np.ndarray]:
    with np.load(checkpoint / tf_loop.STATE_FILE) as state:
        return [state[name] for name in sorted(state.files) if name.startswith("model_")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, LocalSession]:
    setup, shards = iris_setup(TRAINING)
    session = LocalSession(shards, checkpoint_root=tmp_path_factory.mktemp("tf-checkpoints"))
    tf_loop.train_tensorflow(setup, session)
    return setup, shards, session


def test_iris_trains_to_the_stated_accuracy(trained) -> None:
    _, _, session = trained
    final = session.reports[-1]
    assert final["final"] is True and final["step"] == 240  # 30 epochs of ceil(120 / 16) steps
    assert final["val_accuracy"] >= 0.9
    result = json.loads((session.checkpoints[-1] / "result.json").read_text())
    assert result["metrics"]["val_accuracy"] == final["val_accuracy"]
    assert [row["steps"] for row in result["timing"]] == [240]
    assert {"wall", "rows", "data", "compute", "sync_wait", "optimizer"} <= set(result["timing"][0])
    assert result["signature"]["inputs"] == [
        {"name": "input", "dtype": "float32", "shape": [-1, 4], "columns": trained[0]["features"]}
    ]
    assert result["signature"]["outputs"][0]["shape"] == [-1, 3] and result["signature"][
        "classes"
    ] == [0, 1, 2]


def test_checkpoints_every_n_steps(trained) -> None:
    _, _, session = trained
    steps = [report["step"] for report in session.reports]
    # 5 + the final one
    assert steps[:5] == [40, 80, 120, 160, 200] and len(session.checkpoints) == 6
    assert all((folder / tf_loop.STATE_FILE).is_file() for folder in session.checkpoints)


def test_the_savedmodel_serves_what_the_trained_model_predicts(trained) -> None:
    setup, shards, session = trained
    final = session.checkpoints[-1]
    in_memory = tf_loop.Mlp(4, 3, setup["stats"], 0, hidden=[32, 32], dropout=0.1)
    for variable, value in zip(in_memory.weights, weights(final)):
        variable.assign(value)
    rows = shards["validation"].x
    expected = in_memory(rows).numpy()

    runtime = runtime_for("tensorflow", final / "export", {})
    runtime.load()
    body = json.dumps({"instances": rows.tolist()}).encode()
    out, content_type = runtime.invoke(body, "application/json", None, InvocationContext())
    served = np.asarray(json.loads(out)["predictions"], np.float32)
    assert content_type == "application/json" and served.shape == (30, 3)
    # Same graph, same weights: the logits agree to float32 rounding (JSON carries them as decimal
    # text).
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-5)
    accuracy = np.mean(served.argmax(1) == shards["validation"].y)
    assert accuracy == session.reports[-1]["val_accuracy"]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(
    optimizer: str, tmp_path: Path
) -> None:
    training = {**TRAINING, "epochs": 5, "checkpoint_every_steps": 12, "learning_rate": 0.01}
    setup, shards = iris_setup(training, optimizer=optimizer)
    whole = LocalSession(shards, checkpoint_root=tmp_path / "whole")
    tf_loop.train_tensorflow(setup, whole)
    assert [report["step"] for report in whole.reports] == [12, 24, 36, 40]

    # A run killed after its second checkpoint (step 24, mid epoch 4), restarted from that
    # checkpoint.
    resumed = LocalSession(
        shards, checkpoint_root=tmp_path / "resumed", checkpoints=[whole.checkpoints[1]]
    )
    tf_loop.train_tensorflow(setup, resumed)
    assert [report["step"] for report in resumed.reports] == [36, 40]
    final, expected = weights(resumed.checkpoints[-1]), weights(whole.checkpoints[-1])
    assert len(final) == 6
    for got, want in zip(final, expected):
        np.testing.assert_array_equal(got, want)

    # The check can fail: a run from scratch that stops at the checkpoint's step has other weights.
    assert not np.array_equal(weights(whole.checkpoints[1])[0], expected[0])


def test_regression_exports_one_value_per_row(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(256, 3)).astype(np.float32) * [1, 10, 100] + [0, 5, -50]
    y = (x @ np.array([2.0, -0.3, 0.05]) + 1.0).astype(np.float32)
    setup, _ = iris_setup({"epochs": 40, "batch_size": 32, "learning_rate": 0.01}, {"hidden": [16]})
    setup.update(task="regression", classes=[], features=["a", "b", "c"])
    setup["stats"] = {"mean": x[:200].mean(0).tolist(), "std": x[:200].std(0).tolist()}
    shards = {"train": Shard(x[:200], y[:200]), "validation": Shard(x[200:], y[200:])}
    session = LocalSession(shards, checkpoint_root=tmp_path)
    tf_loop.train_tensorflow(setup, session)
    # explains > 95% of the variance
    assert session.reports[-1]["val_loss"] < 0.05 * float(np.var(y))
    assert "val_accuracy" not in session.reports[-1]
    result = json.loads((session.checkpoints[-1] / "result.json").read_text())
    assert (
        result["signature"]["outputs"][0]["shape"] == [-1, 1]
        and result["signature"]["classes"] is None
    )


def test_unknown_hyperparameter_is_refused() -> None:
    setup, shards = iris_setup(TRAINING, {"hidden": [8], "channels": [4]})
    with pytest.raises(ValueError, match="channels not an mlp hyperparameter"):
        tf_loop.train_tensorflow(setup, LocalSession(shards))


def test_profile_writes_a_chrome_trace_of_each_step(tmp_path: Path) -> None:
    setup, shards = iris_setup({**TRAINING, "epochs": 1})
    setup["profile_dir"] = str(tmp_path / "profile")
    tf_loop.train_tensorflow(setup, LocalSession(shards, checkpoint_root=tmp_path / "checkpoints"))
    events = json.loads((tmp_path / "profile" / "worker-0.trace.json").read_text())["traceEvents"]
    assert [e["name"] for e in events[:4]] == ["data", "compute", "sync_wait", "optimizer"]
    # 8 steps, 4 phases
    assert len(events) == 4 * 8 and all(e["ph"] == "X" and e["dur"] >= 0 for e in events)
    assert [e["args"]["step"] for e in events[::4]] == list(range(8))
