"""The xgboost stack on real boosters trained here: SageMaker's XGBoost algorithm container's wire
behaviour.

Boosters are trained with XGBoost on scikit-learn's bundled datasets (binary:logistic on breast
cancer, multi:softprob on iris, reg:squarederror on diabetes) and saved as the algorithm writes them
(`xgboost-model`, Booster.save_model) or as its old versions did (a pickle). Every answer is
compared with `Booster.predict` on the same rows: bit-exact, since the stack calls that very
function on the same float64 values.
"""

from __future__ import annotations

import json
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris

from serving.errors import UnsupportedFormatError, ValidationError
from serving.models.artifacts import materialize
from serving.runtimes import STACKS, InvocationContext, Runtime, runtime_for

# imports torch, TensorFlow, ONNX Runtime or XGBoost: not in `make test-unit`
pytestmark = pytest.mark.frameworks
xgboost = pytest.importorskip("xgboost")

DATA = {"binary": load_breast_cancer, "multi": load_iris, "regression": load_diabetes}
PARAMS = {
    "binary": {"objective": "binary:logistic"},
    "multi": {"objective": "multi:softprob", "num_class": 3},
    "regression": {"objective": "reg:squarederror"},
}


def train_booster(task: str, rounds: int = 4, seed: int = 0) -> tuple[xgboost.Booster, np.ndarray]:
    """A small booster for `task` and the rows it was trained on."""
    x, y = DATA[task](return_X_y=True)
    params = {**PARAMS[task], "max_depth": 3, "seed": seed, "nthread": 1, "subsample": 0.8}
    return xgboost.train(params, xgboost.DMatrix(x, label=y), num_boost_round=rounds), x


def save_algorithm_model(
    folder: Path, booster: xgboost.Booster, name: str = "xgboost-model"
) -> Path:
    """The booster as SageMaker's XGBoost algorithm saves it (Booster.save_model to a name without
    extension)."""
    folder.mkdir(parents=True, exist_ok=True)
    # XGBoost picks UBJSON for a file name without extension
    with pytest.warns(UserWarning, match="UBJSON"):
        booster.save_model(str(folder / name))
    return folder


def loaded(folder: Path, **environment: str) -> Runtime:
    runtime = runtime_for("xgboost", folder, environment)
    runtime.load()
    return runtime


def invoke(
    runtime: Runtime, body: bytes | str, content_type: str | None, accept: str | None = None
) -> tuple[bytes, str]:
    raw = body.encode() if isinstance(body, str) else body
    return runtime.invoke(raw, content_type, accept, InvocationContext())


def csv_rows(x: np.ndarray) -> str:
    return "\n".join(",".join(repr(float(v)) for v in row) for row in x)


def csv_answer(predictions: np.ndarray) -> bytes:
    """What the container's CSV encoder writes: one line per prediction, a row of class
    probabilities per line."""
    return "".join(
        ",".join(str(v) for v in np.atleast_1d(row).tolist()) + "\n" for row in predictions
    ).encode()


def json_answer(predictions: np.ndarray) -> bytes:
    return json.dumps(
        {"predictions": [{"score": value} for value in predictions.tolist()]}
    ).encode()


@pytest.fixture(scope="module")
def boosters(tmp_path_factory) -> dict[str, tuple[xgboost.Booster, np.ndarray, Path]]:
    root = tmp_path_factory.mktemp("xgboost")
    out = {}
    for task in DATA:
        booster, x = train_booster(task)
        out[task] = (booster, x, save_algorithm_model(root / task, booster))
    return out


def test_xgboost_is_a_stack():
    assert "xgboost" in STACKS


@pytest.mark.parametrize("task", list(DATA))
def test_csv_and_json_answers_are_booster_predict(boosters, task):
    booster, x, folder = boosters[task]
    rows = x[:7]
    expected = booster.predict(xgboost.DMatrix(rows))
    runtime = loaded(folder)
    assert invoke(runtime, csv_rows(rows), "text/csv", "text/csv") == (
        csv_answer(expected),
        "text/csv",
    )
    assert invoke(runtime, csv_rows(rows), "text/csv", "application/json") == (
        json_answer(expected),
        "application/json",
    )
    body = json.dumps({"instances": rows.tolist()})
    assert invoke(runtime, body, "application/json", "application/json")[0] == json_answer(expected)
    got = np.array(
        json.loads(invoke(runtime, csv_rows(rows), "text/csv", "application/json")[0])[
            "predictions"
        ][0]["score"]
    )
    assert np.array_equal(got.astype(np.float32), expected[0])  # the float32 prediction, exactly


def test_multi_softprob_answers_a_row_of_probabilities_per_instance(boosters):
    booster, x, folder = boosters["multi"]
    body, _ = invoke(loaded(folder), csv_rows(x[:2]), "text/csv", "application/json")
    scores = [item["score"] for item in json.loads(body)["predictions"]]
    assert len(scores) == 2 and all(len(row) == 3 for row in scores)
    assert np.array_equal(
        np.array(scores, dtype=np.float32), booster.predict(xgboost.DMatrix(x[:2]))
    )


def test_libsvm_absent_features_are_missing_values(boosters):
    booster, x, folder = boosters["binary"]
    rows = x[:5].copy()
    rows[0, 3] = rows[1, 0] = rows[4, -1] = np.nan  # left out of the LIBSVM lines below
    lines = [
        "1 " + " ".join(f"{j + 1}:{v!r}" for j, v in enumerate(row.tolist()) if not np.isnan(v))
        for row in rows
    ]  # 1-based indices and a leading label, as LIBSVM files are written
    expected = booster.predict(xgboost.DMatrix(rows))  # NaN: missing
    runtime = loaded(folder)
    # none: LIBSVM, as the container reads it
    for content_type in ("text/libsvm", "text/x-libsvm", None):
        body, _ = invoke(runtime, "\n".join(lines) + "\n", content_type, "text/csv")
        assert body == csv_answer(expected)


def test_libsvm_with_feature_zero_is_zero_based(boosters):
    booster, x, folder = boosters["regression"]
    line = " ".join(f"{j}:{v!r}" for j, v in enumerate(x[0].tolist()))
    body, _ = invoke(loaded(folder), line, "text/libsvm", "application/json")
    assert body == json_answer(booster.predict(xgboost.DMatrix(x[:1])))


def test_json_shapes_and_csv_missing_fields(boosters):
    booster, x, folder = boosters["multi"]
    runtime = loaded(folder)
    rows = x[:3]
    expected = json_answer(booster.predict(xgboost.DMatrix(rows)))
    for document in (
        rows.tolist(),
        {"inputs": rows.tolist()},
        {"instances": [{"features": r} for r in rows.tolist()]},
    ):
        assert (
            invoke(runtime, json.dumps(document), "application/json", "application/json")[0]
            == expected
        )
    one = json_answer(booster.predict(xgboost.DMatrix(rows[:1])))
    assert (
        invoke(runtime, json.dumps(rows[0].tolist()), "application/json", "application/json")[0]
        == one
    )
    assert (
        invoke(
            runtime,
            json.dumps({"features": rows[0].tolist()}),
            "application/json",
            "application/json",
        )[0]
        == one
    )
    holes = np.array([[5.1, np.nan, 1.4, 0.2]])
    with_holes = json_answer(booster.predict(xgboost.DMatrix(holes)))
    assert invoke(runtime, "5.1,,1.4,0.2", "text/csv", "application/json")[0] == with_holes
    assert (
        invoke(runtime, "[[5.1, null, 1.4, 0.2]]", "application/json", "application/json")[0]
        == with_holes
    )
    # sniffed delimiter
    assert invoke(runtime, "5.1;3.5;1.4;0.2\r\n", "text/csv", "application/json")[0] == one


def test_default_accept_is_csv_unless_configured(boosters):
    booster, x, folder = boosters["binary"]
    expected = booster.predict(xgboost.DMatrix(x[:2]))
    assert invoke(loaded(folder), csv_rows(x[:2]), "text/csv") == (csv_answer(expected), "text/csv")
    assert invoke(loaded(folder), csv_rows(x[:2]), "text/csv", "*/*")[1] == "text/csv"
    configured = loaded(folder, SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT="application/json")
    assert invoke(configured, csv_rows(x[:2]), "text/csv") == (
        json_answer(expected),
        "application/json",
    )
    lines, kind = invoke(configured, csv_rows(x[:2]), "text/csv", "application/jsonlines")
    assert kind == "application/jsonlines"
    assert [json.loads(line) for line in lines.decode().splitlines()] == [
        {"score": v} for v in expected.tolist()
    ]


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        ("1,2,3,4,5", "text/csv", "CSV rows have 5 features; the model takes 4"),
        ("1,2", "text/csv", "CSV rows have 2 features; the model takes 4"),
        ("1,2,x,4", "text/csv", "CSV row 1, column 3: 'x' is not a number"),
        ("1,2,3,4\n1,2,3", "text/csv", "CSV row 2 has 3 fields; row 1 has 4"),
        ("", "text/csv", "request body is empty"),
        (
            "0 1:1 7:2",
            "text/libsvm",
            "LIBSVM feature index 6 (0-based) is beyond the model's 4 features",
        ),
        ("0 1:a", "text/libsvm", "LIBSVM line 1: '1:a' is not index:value"),
        (
            '{"rows": [[1, 2, 3, 4]]}',
            "application/json",
            'needs an "instances", "inputs" or "features" field',
        ),
        ("[[1, 2, 3, 4], [1, 2]]", "application/json", "not a rectangular array of numbers"),
        ("1,2,3,4", "text/csv; label_size=2", "label_size must be 1"),
    ],
)
def test_bad_input_is_a_validation_error_naming_the_problem(boosters, body, content_type, message):
    runtime = loaded(boosters["multi"][2])
    with pytest.raises(
        ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")
    ) as raised:
        invoke(runtime, body, content_type)
    assert 400 <= raised.value.status < 500


def test_one_feature_fewer_is_accepted_as_the_container_does(boosters):
    # its pickled-model check: the model's features, or one fewer
    booster, x, folder = boosters["multi"]
    body, _ = invoke(loaded(folder), "5.1,3.5,1.4", "text/csv", "application/json")
    assert body == json_answer(booster.predict(xgboost.DMatrix(np.array([[5.1, 3.5, 1.4]]))))


@pytest.mark.parametrize(
    ("content_type", "accept"),
    [
        ("application/x-recordio-protobuf", "text/csv"),
        ("application/x-npy", "text/csv"),
        ("text/csv", "application/x-recordio-protobuf"),
        ("text/csv", "text/html"),
    ],
)
def test_unsupported_types_are_415(boosters, content_type, accept):
    with pytest.raises(UnsupportedFormatError) as raised:
        invoke(loaded(boosters["multi"][2]), "5.1,3.5,1.4,0.2", content_type, accept)
    assert raised.value.status == 415


def test_selectable_inference_output(boosters):
    booster, x, folder = boosters["binary"]
    p = booster.predict(xgboost.DMatrix(x[:3]))
    runtime = loaded(
        folder,
        SAGEMAKER_INFERENCE_OUTPUT="probabilities, predicted_label,probability,predicted_score",
    )
    body, _ = invoke(runtime, csv_rows(x[:3]), "text/csv", "application/json")
    assert json.loads(body) == {
        "predictions": [
            {
                "predicted_label": int(v > 0.5),
                "probability": v.item(),
                "probabilities": [1.0 - v.item(), v.item()],
                "predicted_score": pytest.approx(float("nan"), nan_ok=True),
            }
            for v in p
        ]
    }
    assert list(json.loads(body)["predictions"][0]) == [
        "predicted_label",
        "probability",
        "probabilities",
        "predicted_score",
    ]  # the container's order
    body, kind = invoke(runtime, csv_rows(x[:3]), "text/csv", "text/csv")
    assert kind == "text/csv"
    assert body.decode() == "\n".join(
        f'"{[1.0 - v.item(), v.item()]}",{int(v > 0.5)},{v.item()},nan' for v in p
    )


def test_selectable_output_of_a_multiclass_model(boosters):
    booster, x, folder = boosters["multi"]
    p = booster.predict(xgboost.DMatrix(x[:2]))
    runtime = loaded(folder, SAGEMAKER_INFERENCE_OUTPUT="predicted_label,labels,probability")
    body, _ = invoke(runtime, csv_rows(x[:2]), "text/csv", "application/json")
    assert json.loads(body)["predictions"] == [
        {
            "predicted_label": int(np.argmax(row)),
            "labels": [0, 1, 2],
            "probability": max(row).item(),
        }
        for row in p
    ]


def test_selectable_output_refuses_an_objective_without_fields(tmp_path):
    x, y = load_diabetes(return_X_y=True)
    booster = xgboost.train(
        {"objective": "count:poisson", "nthread": 1}, xgboost.DMatrix(x, label=np.round(y)), 2
    )
    with pytest.raises(ValueError, match="objective 'count:poisson' has no selectable fields"):
        loaded(
            save_algorithm_model(tmp_path, booster), SAGEMAKER_INFERENCE_OUTPUT="predicted_score"
        )


def test_pickled_booster_needs_the_opt_in(boosters, tmp_path):
    booster, x, _ = boosters["binary"]
    # the algorithm's versions before 1.3
    (tmp_path / "xgboost-model").write_bytes(pickle.dumps(booster))
    with pytest.raises(
        PermissionError, match="refusing to unpickle xgboost-model.*SERVING_ALLOW_PICKLE"
    ):
        loaded(tmp_path)
    runtime = loaded(tmp_path, SERVING_ALLOW_PICKLE="true")
    assert invoke(runtime, csv_rows(x[:4]), "text/csv")[0] == csv_answer(
        booster.predict(xgboost.DMatrix(x[:4]))
    )


def test_trainer_and_other_file_names(boosters, tmp_path):
    booster, x, _ = boosters["regression"]
    expected = csv_answer(booster.predict(xgboost.DMatrix(x[:3])))
    for name in ("model.json", "model.ubj", "trees.json"):
        folder = tmp_path / name
        folder.mkdir()
        booster.save_model(str(folder / name))
        assert invoke(loaded(folder), csv_rows(x[:3]), "text/csv")[0] == expected
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "xgboost-model").write_bytes(b"not a model")
    with pytest.raises(
        ValueError, match="xgboost-model is not an XGBoost model saved with Booster.save_model"
    ):
        loaded(tmp_path / "junk")
    with pytest.raises(FileNotFoundError, match="no xgboost-model"):
        loaded(tmp_path / "junk" / "..")  # a folder holding only folders


def test_model_tar_gz_as_the_algorithm_writes_it(boosters, tmp_path):
    booster, x, folder = boosters["binary"]
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder / "xgboost-model", arcname="xgboost-model")
    runtime = loaded(materialize(str(archive)))
    assert invoke(runtime, csv_rows(x[:2]), "text/csv")[0] == csv_answer(
        booster.predict(xgboost.DMatrix(x[:2]))
    )


@pytest.mark.parametrize(("model_threads", "nthread"), [(None, "1"), ("1", "2")])
def test_threads_follow_the_cpu_share(boosters, model_threads, nthread):
    # Cpus 2.5: three model threads (Booster.predict releases the GIL) of one thread each, or, with
    # one model thread, the two whole cores for it.
    settings = {"SERVING_CPUS": "2.5"} | (
        {"SERVING_MODEL_THREADS": model_threads} if model_threads else {}
    )
    runtime = loaded(boosters["binary"][2], **settings)
    assert json.loads(runtime.model.save_config())["learner"]["generic_param"]["nthread"] == nthread


def test_kfold_models_are_an_ensemble(tmp_path):
    members = [train_booster("binary", seed=seed)[0] for seed in (1, 2)]
    _, x = train_booster("binary")
    for index, booster in enumerate(members):
        save_algorithm_model(tmp_path, booster, f"xgboost-model-{index}")
    outputs = [booster.predict(xgboost.DMatrix(x[:3])) for booster in members]
    assert not np.array_equal(outputs[0], outputs[1])
    assert invoke(loaded(tmp_path), csv_rows(x[:3]), "text/csv")[0] == csv_answer(
        np.mean(outputs, axis=0)
    )
    first = loaded(tmp_path, SAGEMAKER_INFERENCE_ENSEMBLE="false")
    assert invoke(first, csv_rows(x[:3]), "text/csv")[0] == csv_answer(outputs[0])


SCRIPT_MODEL_FN = """
import os
import xgboost

def model_fn(model_dir):
    booster = xgboost.Booster()
    booster.load_model(os.path.join(model_dir, "xgboost-model"))
    return booster
"""

SCRIPT_PREDICT_FN = """
def predict_fn(data, model):
    return {"rows": data.num_row(), "columns": data.num_col(), "type": type(data).__name__,
            "first": model.predict(data, validate_features=False)[:1].tolist()}
"""


# the script loads xgboost-model as AWS's examples do
@pytest.mark.filterwarnings("ignore:.*Unknown file format")
def test_script_with_model_fn_gets_the_container_script_mode_defaults(boosters, tmp_path):
    booster, x, folder = boosters["regression"]
    (tmp_path / "xgboost-model").write_bytes((folder / "xgboost-model").read_bytes())
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(SCRIPT_MODEL_FN)
    runtime = loaded(tmp_path)
    body, kind = invoke(runtime, csv_rows(x[:2]), "text/csv", "application/json")
    assert kind == "application/json"
    # a plain list, as encoders.encode
    assert json.loads(body) == booster.predict(xgboost.DMatrix(x[:2])).tolist()
    # Script mode's LIBSVM decoder: features absent below the largest index given are 0, not
    # missing.
    dense = np.array([[0.0, 0.5]])
    body, _ = invoke(runtime, "2:0.5", "text/libsvm", "application/json")
    assert json.loads(body) == booster.predict(xgboost.DMatrix(dense)).tolist()


def test_script_predict_fn_gets_a_dmatrix_and_the_booster(boosters, tmp_path):
    booster, x, folder = boosters["multi"]
    (tmp_path / "xgboost-model").write_bytes((folder / "xgboost-model").read_bytes())
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(SCRIPT_PREDICT_FN)
    body, _ = invoke(loaded(tmp_path), csv_rows(x[:3]), "text/csv", "application/json")
    assert json.loads(body) == {
        "rows": 3,
        "columns": 4,
        "type": "DMatrix",
        "first": booster.predict(xgboost.DMatrix(x[:1])).tolist(),
    }


# XGBoost's own LIBSVM reader, as reference
@pytest.mark.filterwarnings("ignore:.*Text file input has been deprecated")
def test_sparse_csr_matches_xgboost_reading_the_same_libsvm(tmp_path, boosters):
    booster, _, folder = boosters["multi"]
    text = "0 1:5.1 3:1.4\n1 2:3.0 4:2.3\n"
    from serving.runtimes.xgboost_codecs import parse_libsvm

    matrix: Any = parse_libsvm(text.encode())
    assert scipy.sparse.issparse(matrix) and matrix.shape == (2, 4)
    (tmp_path / "rows.libsvm").write_text(text)
    reference = xgboost.DMatrix(f"{tmp_path / 'rows.libsvm'}?format=libsvm&indexing_mode=1")
    body, _ = invoke(loaded(folder), text, "text/libsvm", "text/csv")
    assert body == csv_answer(booster.predict(reference))


def test_trainer_booster_with_feature_names_takes_unnamed_rows(tmp_path):
    # serving train (serving/training/xgboost_loop.py) names the features; requests carry none (CSV,
    # LIBSVM, JSON).
    data = load_iris()
    names = [
        name.replace(" ", "_").replace("(", "").replace(")", "") for name in data.feature_names
    ]
    train = xgboost.DMatrix(data.data, label=data.target, feature_names=names)
    booster = xgboost.train({"objective": "multi:softprob", "num_class": 3, "nthread": 1}, train, 3)
    runtime = loaded(save_algorithm_model(tmp_path, booster))
    expected = booster.predict(xgboost.DMatrix(data.data[:2], feature_names=names))
    assert invoke(runtime, csv_rows(data.data[:2]), "text/csv")[0] == csv_answer(expected)
