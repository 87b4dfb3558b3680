"""serving.runtimes: the sklearn and python stacks on real models and real handler files."""

from __future__ import annotations

import io
import json
import operator
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import joblib
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer

from serving.errors import ServingError, ValidationError
from serving.runtimes import InvocationContext, Runtime, runtime_for

if TYPE_CHECKING:
    from conftest import Iris, SavedModel

ROWS = [[5.1, 3.5, 1.4, 0.2], [6.2, 3.4, 5.4, 2.3], [5.9, 3.0, 4.2, 1.5]]


def npy(array: Any) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array))
    return buffer.getvalue()


def invoke(
    runtime: Runtime,
    body: bytes,
    content_type: str | None = "application/json",
    accept: str | None = None,
    context: InvocationContext | None = None,
) -> tuple[bytes, str]:
    return runtime.invoke(body, content_type, accept, context or InvocationContext())


def test_unknown_stack_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown serving stack 'caffe'"):
        runtime_for("caffe", None, {})


# --- sklearn ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (json.dumps(ROWS).encode(), "application/json"),
        (json.dumps({"instances": ROWS}).encode(), "application/json; charset=utf-8"),
        (json.dumps({"inputs": ROWS}).encode(), "application/json"),
        (b"5.1,3.5,1.4,0.2\n6.2,3.4,5.4,2.3\n5.9,3.0,4.2,1.5\n", "text/csv"),
        (npy(ROWS), "application/x-npy"),
    ],
    ids=["json rows", "json instances", "json inputs", "csv", "npy"],
)
def test_sklearn_predicts_like_the_estimator(
    iris_classifier: SavedModel, loaded, body: bytes, content_type: str
) -> None:
    runtime = loaded("sklearn", iris_classifier.path)
    out, out_type = invoke(runtime, body, content_type)
    assert out_type == "application/json"
    assert json.loads(out) == iris_classifier.estimator.predict(np.array(ROWS)).tolist()


def test_sklearn_single_row_is_one_sample(iris_classifier: SavedModel, loaded) -> None:
    out, _ = invoke(loaded("sklearn", iris_classifier.path), json.dumps(ROWS[1]).encode())
    assert json.loads(out) == iris_classifier.estimator.predict(np.array([ROWS[1]])).tolist()


@pytest.mark.parametrize(
    ("accept", "decode"),
    [
        ("text/csv", lambda body: np.loadtxt(io.StringIO(body.decode()), delimiter=",", ndmin=1)),
        ("application/x-npy", lambda body: np.load(io.BytesIO(body), allow_pickle=False)),
        ("*/*", lambda body: np.array(json.loads(body))),
        (
            "image/png, text/csv",
            lambda body: np.loadtxt(io.StringIO(body.decode()), delimiter=",", ndmin=1),
        ),
    ],
)
def test_sklearn_answers_in_the_accepted_type(
    iris_classifier: SavedModel, loaded, accept: str, decode: Callable
) -> None:
    out, out_type = invoke(
        loaded("sklearn", iris_classifier.path), json.dumps(ROWS).encode(), accept=accept
    )
    assert out_type in accept or accept == "*/*"
    np.testing.assert_array_equal(decode(out), iris_classifier.estimator.predict(np.array(ROWS)))


def test_default_accept_comes_from_the_sagemaker_variable(iris_scaler: SavedModel, loaded) -> None:
    runtime = loaded(
        "sklearn", iris_scaler.path, {"SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "text/csv"}
    )
    for accept in (None, "*/*"):
        out, out_type = invoke(runtime, json.dumps(ROWS).encode(), accept=accept)
        assert out_type == "text/csv"
        np.testing.assert_allclose(
            np.loadtxt(io.StringIO(out.decode()), delimiter=","),
            iris_scaler.estimator.transform(ROWS),
        )
    _, out_type = invoke(runtime, json.dumps(ROWS).encode(), accept="application/json")
    assert out_type == "application/json"  # an explicit Accept still wins


def test_predict_proba_by_environment(iris_classifier: SavedModel, loaded) -> None:
    runtime = loaded("sklearn", iris_classifier.path, {"SERVING_SKLEARN_METHOD": "predict_proba"})
    out, _ = invoke(runtime, json.dumps(ROWS).encode())
    probabilities = np.array(json.loads(out))
    assert probabilities.shape == (3, 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)
    np.testing.assert_allclose(
        probabilities, iris_classifier.estimator.predict_proba(np.array(ROWS))
    )


def test_missing_method_is_named(iris_scaler: SavedModel, loaded) -> None:
    runtime = loaded("sklearn", iris_scaler.path, {"SERVING_SKLEARN_METHOD": "predict_proba"})
    with pytest.raises(AttributeError, match="StandardScaler has no method 'predict_proba'"):
        invoke(runtime, json.dumps(ROWS).encode())


def test_transformer_uses_transform(iris_scaler: SavedModel, loaded) -> None:
    out, _ = invoke(loaded("sklearn", iris_scaler.path), json.dumps(ROWS).encode())
    np.testing.assert_allclose(
        np.array(json.loads(out)), iris_scaler.estimator.transform(np.array(ROWS))
    )


def test_any_skops_file_name_is_found(
    save_skops, iris_classifier: SavedModel, loaded, tmp_path: Path
) -> None:
    save_skops(iris_classifier.estimator, tmp_path, "iris-v3.skops")
    out, _ = invoke(loaded("sklearn", tmp_path), json.dumps(ROWS).encode())
    assert json.loads(out) == iris_classifier.estimator.predict(np.array(ROWS)).tolist()


@pytest.fixture(scope="module")
def joblib_model(
    iris_classifier: SavedModel, tmp_path_factory: pytest.TempPathFactory
) -> SimpleNamespace:
    folder = tmp_path_factory.mktemp("joblib-model")
    joblib.dump(iris_classifier.estimator, folder / "model.joblib")
    return SimpleNamespace(path=folder, estimator=iris_classifier.estimator)


@pytest.mark.parametrize("allow", [None, "", "false", "0", "no"])
def test_joblib_is_refused_without_opt_in(joblib_model: SimpleNamespace, allow: str | None) -> None:
    runtime = runtime_for(
        "sklearn", joblib_model.path, {} if allow is None else {"SERVING_ALLOW_PICKLE": allow}
    )
    with pytest.raises(PermissionError, match="SERVING_ALLOW_PICKLE") as caught:
        runtime.load()
    assert "model.joblib" in str(caught.value)


@pytest.mark.parametrize("allow", ["true", "TRUE", "1", "yes"])
def test_joblib_loads_with_opt_in(joblib_model: SimpleNamespace, loaded, allow: str) -> None:
    runtime = loaded("sklearn", joblib_model.path, {"SERVING_ALLOW_PICKLE": allow})
    out, _ = invoke(runtime, json.dumps(ROWS).encode())
    assert json.loads(out) == joblib_model.estimator.predict(np.array(ROWS)).tolist()


def test_skops_prefers_skops_over_pickle(
    save_skops, iris_classifier: SavedModel, loaded, tmp_path: Path
) -> None:
    save_skops(iris_classifier.estimator, tmp_path)
    (tmp_path / "model.joblib").write_bytes(b"never unpickled")
    out, _ = invoke(loaded("sklearn", tmp_path), json.dumps(ROWS).encode())
    assert json.loads(out) == iris_classifier.estimator.predict(np.array(ROWS)).tolist()


def test_skops_with_untrusted_types_needs_them_listed(
    save_skops, iris: Iris, loaded, tmp_path: Path
) -> None:
    model = make_pipeline(FunctionTransformer(operator.neg), LogisticRegression(max_iter=1000)).fit(
        iris.data, iris.target
    )
    save_skops(model, tmp_path)
    with pytest.raises(PermissionError, match="_operator.neg") as caught:
        loaded("sklearn", tmp_path)
    assert "SERVING_SKOPS_TRUSTED_TYPES" in str(caught.value)
    runtime = loaded(
        "sklearn", tmp_path, {"SERVING_SKOPS_TRUSTED_TYPES": "numpy.float64, _operator.neg"}
    )
    out, _ = invoke(runtime, json.dumps(ROWS).encode())
    assert json.loads(out) == model.predict(np.array(ROWS)).tolist()


@pytest.mark.parametrize("model_dir", [None, "empty"], ids=["no ModelDataUrl", "empty folder"])
def test_sklearn_without_a_model_file(tmp_path: Path, model_dir: str | None) -> None:
    runtime = runtime_for("sklearn", tmp_path if model_dir else None, {})
    with pytest.raises(FileNotFoundError):
        runtime.load()


def test_wrong_feature_count_is_a_model_error(iris_classifier: SavedModel, loaded) -> None:
    runtime = loaded("sklearn", iris_classifier.path)
    with pytest.raises(ValueError, match="features") as caught:
        invoke(runtime, b"[[1.0, 2.0, 3.0]]")
    # The model failed on well-formed input: not the caller's ValidationError (400).
    assert not isinstance(caught.value, ServingError)


@pytest.mark.parametrize(
    ("body", "content_type", "accept", "fragment"),
    [
        (b'{"rows": [[1, 2, 3, 4]]}', "application/json", None, '"instances" or "inputs"'),
        (b"[[1, 2, 3, 4], [1, 2]]", "application/json", None, "rectangular"),
        (b'[[1, {"a": 2}, 3, 4]]', "application/json", None, "rectangular"),
        (b"1,2,3,4", "text/plain", None, "unsupported content type 'text/plain'"),
        (b"[[1, 2, 3, 4]", "application/json", None, "not valid application/json"),
        (b"[[1, 2, 3, 4]]", "application/json", "image/png", "unsupported Accept 'image/png'"),
    ],
    ids=[
        "object without instances",
        "ragged",
        "object cell",
        "unsupported type",
        "bad json",
        "bad accept",
    ],
)
def test_sklearn_bad_input_is_a_validation_error(
    iris_classifier: SavedModel,
    loaded,
    body: bytes,
    content_type: str,
    accept: str | None,
    fragment: str,
) -> None:
    runtime = loaded("sklearn", iris_classifier.path)
    with pytest.raises(ValidationError) as caught:
        invoke(runtime, body, content_type, accept)
    assert fragment in caught.value.message


# --- python stack: a user's code/inference.py ----------------------------------------------

LABELS = json.dumps(["setosa", "versicolor", "virginica"])

HANDLERS = [
    (
        "predict_fn only",
        """
        def predict_fn(data, model):
            assert model is None
            return {"sum": sum(data)}
        """,
        b"[1, 2, 3]",
        "application/json",
        None,
        b'{"sum":6}',
        "application/json",
    ),
    (
        "model_fn and predict_fn",
        """
        import json, os
        def model_fn(model_dir):
            with open(os.path.join(model_dir, "labels.json")) as f:
                return json.load(f)
        def predict_fn(ids, labels):
            return [labels[int(i)] for i in ids]
        """,
        b"[2, 0]",
        "application/json",
        "text/csv",
        b"virginica\nsetosa\n",
        "text/csv",
    ),
    (
        "model_fn returning a callable",
        """
        def model_fn(model_dir):
            return lambda data: [x * 10 for x in data]
        """,
        b"[1, 2]",
        "application/json",
        None,
        b"[10,20]",
        "application/json",
    ),
    (
        "input_fn gets raw bytes of an unknown type",
        """
        def input_fn(body, content_type):
            assert isinstance(body, bytes), type(body)
            return {"type": content_type, "text": body.decode()[::-1]}
        def predict_fn(data, model):
            return data
        """,
        b"olleh",
        "application/x-custom; v=2",
        None,
        b'{"type":"application/x-custom; v=2","text":"hello"}',
        "application/json",
    ),
    (
        "output_fn returning a string",
        """
        def predict_fn(data, model):
            return data
        def output_fn(prediction, accept):
            return "accept=" + accept + " n=" + str(len(prediction))
        """,
        b"[1, 2, 3]",
        "application/json",
        "text/plain",
        b"accept=text/plain n=3",
        "text/plain",
    ),
    (
        "output_fn returning body and type",
        """
        def predict_fn(data, model):
            return data
        def output_fn(prediction, accept):
            return bytes(prediction), "application/octet-stream"
        """,
        b"[104, 105]",
        "application/json",
        None,
        b"hi",
        "application/octet-stream",
    ),
    (
        "all four hooks",
        """
        def model_fn(model_dir):
            return {"offset": 100}
        def input_fn(body, content_type):
            return int(body)
        def predict_fn(value, model):
            return value + model["offset"]
        def output_fn(prediction, accept):
            return str(prediction).encode(), "text/plain"
        """,
        b"23",
        "text/plain",
        None,
        b"123",
        "text/plain",
    ),
]


@pytest.mark.parametrize(
    ("source", "body", "content_type", "accept", "expected_body", "expected_type"),
    [case[1:] for case in HANDLERS],
    ids=[case[0] for case in HANDLERS],
)
def test_python_handler_hooks(
    handler_dir,
    loaded,
    source: str,
    body: bytes,
    content_type: str,
    accept: str | None,
    expected_body: bytes,
    expected_type: str,
) -> None:
    runtime = loaded("python", handler_dir(source, {"labels.json": LABELS}))
    assert invoke(runtime, body, content_type, accept) == (expected_body, expected_type)


def test_hooks_taking_context_read_and_set_custom_attributes(handler_dir, loaded) -> None:
    runtime = loaded(
        "python",
        handler_dir(
            """
        def input_fn(body, content_type, context):
            return {"rows": len(body.splitlines()), "caller": context.custom_attributes, "id": context.inference_id}
        def predict_fn(data, model):
            return data
        def output_fn(prediction, accept, context):
            context.response_custom_attributes = "rows=%d;%s" % (prediction["rows"], context.custom_attributes)
            return str(prediction)
        """
        ),
    )
    context = InvocationContext(custom_attributes="trace=abc", inference_id="req-7")
    out, _ = invoke(runtime, b"a\nb\n", "text/plain", None, context)
    assert out == str({"rows": 2, "caller": "trace=abc", "id": "req-7"}).encode()
    assert context.response_custom_attributes == "rows=2;trace=abc"


def test_handler_imports_its_own_helper_module(handler_dir, loaded) -> None:
    folder = handler_dir(
        """
        from iris_helper_for_runtime_test import double
        def predict_fn(data, model):
            return double(data)
        """,
        {
            "code/iris_helper_for_runtime_test.py": "def double(values):\n    return [2 * v for v in values]\n"
        },
    )
    out, _ = invoke(loaded("python", folder), b"[1, 4]")
    assert json.loads(out) == [2, 8]


@pytest.mark.parametrize(
    "source",
    [
        "def input_fn(body, content_type):\n    return body\n",
        "def model_fn(model_dir):\n    return {'not': 'callable'}\n",
        "predict_fn = 'not a function'\n",
    ],
    ids=["no predict_fn", "model not callable", "predict_fn not callable"],
)
def test_python_without_predict_fn_is_refused_at_load(handler_dir, source: str) -> None:
    runtime = runtime_for("python", handler_dir(source), {})
    with pytest.raises(RuntimeError, match="predict_fn"):
        runtime.load()


def test_handler_with_a_syntax_error_fails_at_load(handler_dir) -> None:
    runtime = runtime_for(
        "python", handler_dir("def predict_fn(data, model)\n    return data\n"), {}
    )
    with pytest.raises(SyntaxError):
        runtime.load()


def test_python_without_any_code_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="code/inference.py"):
        runtime_for("python", tmp_path, {}).load()


def test_unknown_type_without_user_input_fn_is_a_validation_error(handler_dir, loaded) -> None:
    runtime = loaded("python", handler_dir("def predict_fn(data, model):\n    return data\n"))
    with pytest.raises(ValidationError, match="application/x-custom"):
        invoke(runtime, b"\x00\x01", "application/x-custom")


def test_output_fn_returning_a_dict_is_json_as_the_model_servers_send_it(
    handler_dir, loaded
) -> None:
    # MMS and TorchServe answer a non-bytes, non-str hook result with json.dumps(value, indent=2).
    runtime = loaded(
        "python",
        handler_dir(
            """
        def predict_fn(data, model):
            return data
        def output_fn(prediction, accept):
            return {"echo": prediction}
        """
        ),
    )
    assert invoke(runtime, b"[1]") == (
        json.dumps({"echo": [1]}, indent=2).encode(),
        "application/json",
    )


def test_output_fn_returning_something_else_is_refused(handler_dir, loaded) -> None:
    runtime = loaded(
        "python",
        handler_dir(
            """
        def predict_fn(data, model):
            return data
        def output_fn(prediction, accept):
            return object()
        """
        ),
    )
    with pytest.raises(TypeError, match="output_fn must return bytes"):
        invoke(runtime, b"[1]")


def test_user_predict_fn_error_propagates(handler_dir, loaded) -> None:
    runtime = loaded(
        "python",
        handler_dir("def predict_fn(data, model):\n    raise ZeroDivisionError('model blew up')\n"),
    )
    with pytest.raises(ZeroDivisionError, match="model blew up"):
        invoke(runtime, b"[1]")


def test_user_hooks_override_sklearn_defaults(
    save_skops, iris_classifier: SavedModel, handler_dir, loaded, tmp_path: Path
) -> None:
    folder = handler_dir(
        """
        import json
        NAMES = ["setosa", "versicolor", "virginica"]
        def output_fn(prediction, accept):
            return json.dumps([NAMES[int(i)] for i in prediction]), "application/json"
        """
    )
    save_skops(iris_classifier.estimator, folder)
    out, _ = invoke(loaded("sklearn", folder), json.dumps(ROWS).encode())
    names = ["setosa", "versicolor", "virginica"]
    assert json.loads(out) == [names[i] for i in iris_classifier.estimator.predict(np.array(ROWS))]
