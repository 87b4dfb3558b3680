"""The trainer without Ray: recipes and their refusals, data checks, the PyTorch loop on one
in-process worker, its exported artifacts loaded by the serving stacks, resumption, and the model
store's layout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from serving.training.data import plan_data, sklearn_frame
from serving.training.recipe import RecipeError, load_recipe, parse_recipe
from serving.training.session import LocalSession, Shard

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "recipes"


def _recipe(**changes) -> dict:
    document = {
        "name": "iris-mlp",
        "framework": "pytorch",
        "seed": 3,
        "data": {"source": "sklearn:iris"},
        "model": {"family": "mlp", "hyperparameters": {"hidden": [16]}},
        "training": {
            "epochs": 60,
            "batch_size": 16,
            "learning_rate": 0.05,
            "checkpoint_every_steps": 20,
        },
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            document.setdefault(section, {})[field] = value
        else:
            document[section] = value
    return document


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_recipe_is_valid_and_its_data_checks_out(path: Path) -> None:
    recipe = load_recipe(path)
    plan = plan_data(recipe.data)
    assert plan.fingerprint.startswith("sha256:") and plan.label in plan.columns


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"training__batch_size": 0},
            "training.batch_size: Input should be greater than or equal to 1",
        ),
        ({"training__bogus": 1}, "training.bogus: unknown field"),
        (
            {"model": {"family": "rnn"}},
            "model.family: 'rnn' is not a pytorch family; one of mlp, cnn",
        ),
        (
            {
                "framework": "sklearn",
                "model": {"family": "logistic_regression"},
                "workers": {"count": 2},
            },
            "workers.count: scikit-learn trains on one worker",
        ),
        (
            {"data": {"source": "sklearn:digitz"}},
            "data.source: unknown scikit-learn dataset 'digitz'",
        ),
        ({"name": "../escape"}, "name: String should match pattern"),
        (
            {"framework": "lightgbm", "model": {"family": "gbtree"}},
            "model.family: 'gbtree' is not a lightgbm family; one of gbdt",
        ),
        (
            {"output__mlflow": True},
            "output.mlflow: only sklearn recipes write an MLflow copy (this one is pytorch)",
        ),
    ],
)
def test_a_bad_recipe_is_refused_naming_the_field(changes: dict, message: str) -> None:
    with pytest.raises(RecipeError) as refused:
        parse_recipe(_recipe(**changes), Path("."), "r.yaml")
    assert message in str(refused.value)


def test_data_problems_are_refused_before_anything_starts(tmp_path: Path) -> None:
    table = tmp_path / "table.csv"
    table.write_text("a,b,label\n1,2,0\n3,4,1\n")
    with pytest.raises(
        RecipeError, match=r"data.label: no column 'y' in .*table.csv \(columns: a, b, label\)"
    ):
        plan_data(parse_recipe(_recipe(data={"source": "table.csv", "label": "y"}), tmp_path).data)
    with pytest.raises(RecipeError, match="data.source: .*missing.csv does not exist"):
        plan_data(parse_recipe(_recipe(data={"source": "missing.csv"}), tmp_path).data)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"\x00not parquet at all" * 10)
    with pytest.raises(RecipeError, match=r"data.source: cannot read .*broken.parquet as PARQUET"):
        plan_data(
            parse_recipe(
                _recipe(data={"source": "broken.parquet", "label": "label"}), tmp_path
            ).data
        )
    with pytest.raises(RecipeError, match="data.group_by: no column 'customer'"):
        plan_data(
            parse_recipe(
                _recipe(
                    data={"source": "table.csv", "label": "label", "group_by": "customer"},
                    workers={"count": 1},
                ),
                tmp_path,
            ).data
        )
    plan = plan_data(
        parse_recipe(_recipe(data={"source": "table.csv", "label": "label"}), tmp_path).data
    )
    assert plan.features == ("a", "b")
    table.write_text("a,b,label\n1,2,0\n3,4,0\n")
    assert (
        plan_data(
            parse_recipe(_recipe(data={"source": "table.csv", "label": "label"}), tmp_path).data
        ).fingerprint
        != plan.fingerprint
    )


def test_serving_train_refuses_a_bad_recipe_with_status_2(tmp_path: Path, capsys) -> None:
    from serving.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: x\nframework: pytorch\ndata: {source: sklearn:iris, label: species}\nmodel: {family: mlp}\n"
    )
    assert main(["train", str(path)]) == 2
    error = capsys.readouterr().err
    assert "INVALID" in error and "data.label: no column 'species' in sklearn:iris" in error


def _iris_setup(recipe_document: dict) -> tuple[dict, dict[str, Shard]]:
    recipe = parse_recipe(recipe_document, Path("."))
    frame = sklearn_frame("iris")
    order = np.random.default_rng(0).permutation(len(frame))
    train, validation = frame.iloc[order[30:]], frame.iloc[order[:30]]
    features = [c for c in frame.columns if c != "target"]
    x = train[features].to_numpy(dtype=np.float32)
    setup = {
        "recipe": recipe.to_record(),
        "features": features,
        "label": "target",
        "task": "classification",
        "classes": [0, 1, 2],
        "stats": {"mean": x.mean(0).tolist(), "std": x.std(0).tolist(), "image_shape": None},
        "profile_dir": None,
    }
    shards = {
        "train": Shard(x, train["target"].to_numpy()),
        "validation": Shard(
            validation[features].to_numpy(dtype=np.float32), validation["target"].to_numpy()
        ),
    }
    return setup, shards


@pytest.mark.frameworks
def test_the_pytorch_loop_trains_and_its_exports_serve_what_it_predicts(tmp_path: Path) -> None:
    import torch

    from serving.runtimes import InvocationContext, runtime_for
    from serving.training.torch_loop import train_torch
    from serving.training.torch_models import build_model

    setup, shards = _iris_setup(_recipe())
    session = LocalSession(shards, checkpoint_root=tmp_path)
    train_torch(setup, session)
    final = session.latest_checkpoint()
    result = json.loads((final / "result.json").read_text())
    assert result["metrics"]["val_accuracy"] >= 0.9 and session.reports[-1]["final"] is True
    state = torch.load(final / "state.pt", weights_only=True)
    model = build_model("mlp", {"hidden": [16]}, 4, 3, setup["stats"])
    model.load_state_dict(state["model"])
    rows = shards["validation"].x
    with torch.no_grad():
        expected = model.eval()(torch.from_numpy(rows)).numpy()
    for stack in ("pytorch", "onnx"):
        runtime = runtime_for(stack, final / "export", {})
        runtime.load()
        body, _ = runtime.invoke(
            json.dumps(rows.tolist()).encode(),
            "application/json",
            "application/json",
            InvocationContext(),
        )
        np.testing.assert_allclose(
            np.asarray(json.loads(body), dtype=np.float32), expected, rtol=1e-4, atol=1e-5
        )


@pytest.mark.frameworks
def test_the_lightgbm_loop_trains_and_its_model_txt_serves_what_it_predicts(
    tmp_path: Path,
) -> None:
    lightgbm = pytest.importorskip("lightgbm")
    from serving.runtimes import InvocationContext, runtime_for
    from serving.training.lightgbm_loop import train_lightgbm

    setup, shards = _iris_setup(
        _recipe(
            framework="lightgbm",
            model={"family": "gbdt", "hyperparameters": {"num_leaves": 7, "min_data_in_leaf": 5}},
            training={"boost_rounds": 20, "checkpoint_every_steps": 8},
        )
    )
    session = LocalSession(shards, checkpoint_root=tmp_path / "whole")
    (tmp_path / "whole").mkdir()
    train_lightgbm(setup, session)
    final = session.latest_checkpoint()
    result = json.loads((final / "result.json").read_text())
    # a scikit-learn random forest scores 0.87 on this split's 30 rows too
    assert result["metrics"]["val_accuracy"] >= 0.85 and session.reports[-1]["final"] is True
    assert [report.get("round") for report in session.reports[:-1]] == [8, 16]
    booster = lightgbm.Booster(model_file=str(final / "export" / "model.txt"))
    assert booster.current_iteration() == 20
    rows = shards["validation"].x
    runtime = runtime_for("lightgbm", final / "export", {})
    runtime.load()
    body, _ = runtime.invoke(
        json.dumps(rows.tolist()).encode(),
        "application/json",
        "application/json",
        InvocationContext(),
    )
    assert json.loads(body) == booster.predict(rows.astype(np.float64)).tolist()
    # a restarted worker resumes from its checkpoint's booster and boosts only the rounds left
    (tmp_path / "resumed").mkdir()
    resumed = LocalSession(
        shards, checkpoint_root=tmp_path / "resumed", checkpoints=[session.checkpoints[1]]
    )
    train_lightgbm(setup, resumed)
    again = json.loads((resumed.latest_checkpoint() / "result.json").read_text())
    assert again["timing"][0]["steps"] == 4
    again_booster = lightgbm.Booster(
        model_file=str(resumed.latest_checkpoint() / "export" / "model.txt")
    )
    assert again_booster.current_iteration() == 20
    np.testing.assert_allclose(again_booster.predict(rows), booster.predict(rows), rtol=1e-6)


@pytest.mark.frameworks
def test_the_xgboost_loop_trains_resumes_and_its_model_serves_what_it_predicts(
    tmp_path: Path,
) -> None:
    """As the LightGBM loop's test: both end through `training.boosted_trees`."""
    xgboost = pytest.importorskip("xgboost")
    from serving.runtimes import InvocationContext, runtime_for
    from serving.training.xgboost_loop import MODEL_FILE, train_xgboost

    setup, shards = _iris_setup(
        _recipe(
            framework="xgboost",
            model={"family": "gbtree", "hyperparameters": {"max_depth": 3}},
            training={"boost_rounds": 20, "checkpoint_every_steps": 8},
        )
    )
    session = LocalSession(shards, checkpoint_root=tmp_path / "whole")
    (tmp_path / "whole").mkdir()
    train_xgboost(setup, session)
    final = session.latest_checkpoint()
    result = json.loads((final / "result.json").read_text())
    assert result["metrics"]["val_accuracy"] >= 0.85 and session.reports[-1]["final"] is True
    assert [report.get("round") for report in session.reports[:-1]] == [8, 16]
    assert result["signature"]["inputs"][0]["dtype"] == "float32"
    booster = xgboost.Booster()
    booster.load_model(str(final / "export" / MODEL_FILE))
    assert booster.num_boosted_rounds() == 20
    rows = shards["validation"].x
    runtime = runtime_for("xgboost", final / "export", {})
    runtime.load()
    body, _ = runtime.invoke(
        json.dumps(rows.tolist()).encode(),
        "application/json",
        "application/json",
        InvocationContext(),
    )
    want = booster.predict(
        xgboost.DMatrix(rows.astype(np.float32), feature_names=setup["features"])
    )
    # SageMaker's XGBoost answer: {"predictions": [{"score": [...]}, ...]}
    scores = [row["score"] for row in json.loads(body)["predictions"]]
    np.testing.assert_allclose(np.asarray(scores), want, rtol=1e-5)
    (tmp_path / "resumed").mkdir()
    resumed = LocalSession(
        shards, checkpoint_root=tmp_path / "resumed", checkpoints=[session.checkpoints[1]]
    )
    train_xgboost(setup, resumed)
    again = json.loads((resumed.latest_checkpoint() / "result.json").read_text())
    assert again["timing"][0]["steps"] == 4


@pytest.mark.frameworks
def test_a_run_resumed_from_a_checkpoint_ends_with_the_uninterrupted_weights(
    tmp_path: Path,
) -> None:
    import torch

    from serving.training.torch_loop import train_torch

    setup, shards = _iris_setup(
        _recipe(training={"epochs": 4, "batch_size": 16, "checkpoint_every_steps": 7})
    )
    setup["recipe"]["output"]["formats"] = ["torchscript"]
    whole = LocalSession(shards, checkpoint_root=tmp_path / "whole")
    (tmp_path / "whole").mkdir()
    train_torch(setup, whole)
    # Resume from the second mid-run checkpoint (step 14, inside epoch 2: the loop must skip that
    # epoch's first batches in the same order), as Ray Train hands it to a restarted worker.
    (tmp_path / "resumed").mkdir()
    resumed = LocalSession(
        shards, checkpoint_root=tmp_path / "resumed", checkpoints=[whole.checkpoints[1]]
    )
    train_torch(setup, resumed)
    assert torch.load(whole.checkpoints[1] / "state.pt", weights_only=True)["step"] == 14
    expected = torch.load(whole.latest_checkpoint() / "state.pt", weights_only=True)
    got = torch.load(resumed.latest_checkpoint() / "state.pt", weights_only=True)
    assert got["step"] == expected["step"] == 32
    for name, tensor in expected["model"].items():
        assert torch.equal(got["model"][name], tensor), name


@pytest.mark.frameworks
def test_the_learning_rate_warms_up_linearly_to_the_scaled_rate() -> None:
    from serving.training.torch_loop import _lr_factor

    recipe = {"training": {"lr_scaling": "linear"}}
    factor = _lr_factor(recipe, world_size=4, warmup_steps=10)
    assert [factor(s) for s in (0, 5, 10, 50)] == [1.0, 2.5, 4.0, 4.0]
    assert _lr_factor({"training": {"lr_scaling": "none"}}, 4, 10)(50) == 1.0


def test_versions_publish_atomically_and_latest_is_a_model_data_url(tmp_path: Path) -> None:
    import tarfile

    from serving.models.artifacts import materialize
    from serving.training import versions

    first = versions.open_version(tmp_path, "m", resume=False)
    export = tmp_path / "export"
    export.mkdir()
    (export / "model.onnx").write_bytes(b"onnx")
    versions.pack(export, versions.archive_path(first))
    versions.publish(first, {"name": "m"})
    assert os.readlink(tmp_path / "m" / "latest") == "1"
    with tarfile.open(tmp_path / "m" / "1" / "model.tar.gz") as tar:
        # the files at the root, as SageMaker packs model.tar.gz
        assert tar.getnames() == ["model.onnx"]
    extracted = materialize(str(tmp_path / "m" / "latest"))
    assert (extracted / "model.onnx").read_bytes() == b"onnx"

    second = versions.open_version(tmp_path, "m", resume=False)  # killed before publishing
    assert second.number == 2 and second.staging.is_dir()
    assert versions.open_version(tmp_path, "m", resume=True) == second
    assert versions.open_version(tmp_path, "m", resume=False).number == 3
    with pytest.raises(RecipeError, match="nothing to resume"):
        versions.open_version(tmp_path, "other", resume=True)


def test_an_sklearn_recipe_names_an_unknown_hyperparameter() -> None:
    from serving.training.sklearn_fit import build_estimator

    with pytest.raises(
        ValueError,
        match="model.hyperparameters: max_iterations not an argument of LogisticRegression",
    ):
        build_estimator("logistic_regression", {"max_iterations": 5}, 0)


def test_docs_list_every_recipe_field_as_the_help_does() -> None:
    from serving.training.recipe import field_lines

    docs = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    assert "\n".join(field_lines()) in docs, (
        "docs/training.md's field list is stale: paste `field_lines()`"
    )


@pytest.mark.frameworks
def test_profile_writes_a_chrome_trace_with_the_step_phases(tmp_path: Path) -> None:
    from serving.training.torch_loop import train_torch

    setup, shards = _iris_setup(_recipe(training={"epochs": 2, "batch_size": 16}))
    setup["recipe"]["output"]["formats"] = ["torchscript"]
    setup["profile_dir"] = str(tmp_path / "timeline")
    train_torch(setup, LocalSession(shards, checkpoint_root=tmp_path))
    trace = json.loads((tmp_path / "timeline" / "worker-0.trace.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert {"data", "forward", "backward", "optimizer"} <= names


def test_parquet_files_and_folders_are_planned_like_csv(tmp_path: Path) -> None:
    frame = sklearn_frame("wine")
    (tmp_path / "parts").mkdir()
    frame.iloc[:100].to_parquet(tmp_path / "parts" / "a.parquet")
    frame.iloc[100:].to_parquet(tmp_path / "parts" / "b.parquet")
    plan = plan_data(parse_recipe(_recipe(data={"source": "parts"}), tmp_path).data)
    assert (
        plan.kind == "parquet"
        and len(plan.files) == 2
        and plan.label == "target"
        and len(plan.features) == 13
    )
    (tmp_path / "parts" / "c.csv").write_text("a\n1\n")
    with pytest.raises(RecipeError, match="mixes CSV and Parquet"):
        plan_data(parse_recipe(_recipe(data={"source": "parts"}), tmp_path).data)


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_the_typed_records_have_the_keys_model_json_is_written_with(path: Path) -> None:
    from typing import get_type_hints

    from serving.training import run_records

    recipe = load_recipe(path)
    record = recipe.to_record()
    sections = get_type_hints(run_records.RecipeRecord)
    assert list(record) == list(sections)
    for section in ("data", "model", "workers", "training", "output"):
        assert list(record[section]) == list(get_type_hints(sections[section])), section
    assert list(plan_data(recipe.data).record()) == list(run_records.DataRecord.__annotations__)


def test_the_timing_summary_keeps_its_keys_and_rounding() -> None:
    from serving.training.runner import summarize

    worker = {
        "steps": 4,
        "wall": 0.2,
        "rows": 64,
        "data": 0.001,
        "compute": 0.01,
        "sync_wait": 0.002,
    }
    summary = summarize([worker, {**worker, "wall": 0.3, "sync_busy": 0.004}])
    assert json.dumps(summary) == json.dumps(
        {
            "steps": 4,
            "samples_per_s": 128 / 0.3,
            "step_ms": 75.0,
            "per_step": {
                "data_ms": 0.25,
                "compute_ms": 2.5,
                "sync_wait_ms": 0.5,
                "allreduce_busy_ms": 0.5,
            },
            "forward_ms": 0.0,
            "backward_ms": 0.0,
            "optimizer_ms": 0.0,
        }
    )
    assert summarize([]) == {}


@pytest.mark.frameworks
def test_an_sklearn_recipe_writes_an_mlflow_copy_that_the_mlflow_stack_serves(
    tmp_path: Path,
) -> None:
    """`output.mlflow`: model.tar.gz's mlflow/ folder, served by `Image: mlflow` from the export
    folder as by the sklearn stack, both answering what the fitted pipeline predicts."""
    import skops.io

    from serving.runtimes import InvocationContext, runtime_for
    from serving.training.sklearn_fit import MLFLOW_FOLDER, train_sklearn

    recipe = _recipe(
        framework="sklearn",
        model={"family": "logistic_regression"},
        training={},
        output={"mlflow": True},
    )
    setup, shards = _iris_setup(recipe)
    session = LocalSession(shards, checkpoint_root=tmp_path)
    train_sklearn(setup, session)
    export = session.latest_checkpoint() / "export"
    assert (export / MLFLOW_FOLDER / "MLmodel").is_file() and (export / "model.skops").is_file()
    pipeline = skops.io.load(
        export / "model.skops", trusted=skops.io.get_untrusted_types(file=export / "model.skops")
    )
    rows = shards["validation"].x
    records = [dict(zip(setup["features"], map(float, row), strict=True)) for row in rows]
    runtime = runtime_for("mlflow", export, {})
    runtime.load()
    body, _ = runtime.invoke(
        json.dumps({"dataframe_records": records}).encode(),
        "application/json",
        "application/json",
        InvocationContext(),
    )
    assert json.loads(body) == {"predictions": pipeline.predict(rows.astype(np.float64)).tolist()}
    names = [tensor["name"] for tensor in runtime.tensor_signature()["inputs"]]
    assert names == setup["features"]
