"""The pytorch, tensorflow and onnx stacks on real saved models of every layout they accept.

Models come from examples/train_hetero.py (trained once per session from scikit-learn's
bundled datasets) plus a few built here for layouts and dtypes the demo does not use.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.errors import ContainerAnswerError, ValidationError
from serving.models.artifacts import materialize
from serving.runtimes import InvocationContext, Runtime, runtime_for
from serving.runtimes.tensors import (
    InputSpec,
    ModelInputError,
    conform,
    cpu_threads,
    split_request,
    wrap_outputs,
)

# imports torch, TensorFlow, ONNX Runtime or XGBoost: not in `make test-unit`
pytestmark = pytest.mark.frameworks

STACK_OF = {
    "hetero-features": "sklearn",
    "hetero-iris-sklearn": "sklearn",
    "hetero-wine-sklearn": "sklearn",
    "hetero-iris-torchscript": "pytorch",
    "hetero-wine-export": "pytorch",
    "hetero-iris-state": "pytorch",
    "hetero-tf-features": "tensorflow",
    "hetero-tf-iris": "tensorflow",
    "hetero-tf-wine.tar.gz": "tensorflow",
    "hetero-onnx-iris": "onnx",
    "hetero-onnx-two": "onnx",
    "hetero-onnx-features": "onnx",
    "hetero-labels": "python",
    "hetero-wine-labels": "python",
    "hetero-rules": "python",
}
ENVIRONMENT = {
    "hetero-wine-sklearn": {"SERVING_SKLEARN_METHOD": "predict_proba"},
    "hetero-wine-export": {"SERVING_ALLOW_PICKLE": "true"},
}  # a .pt2 runs code while loading
# setosa, versicolor, virginica
IRIS_ROWS = [[5.1, 3.5, 1.4, 0.2], [7.0, 3.2, 4.7, 1.4], [6.3, 3.3, 6.0, 2.5]]


def unwrap(got: Any) -> Any:
    """The tensor of a TF Serving answer (the tensorflow stack always answers `{"predictions": ...}`
    to JSON and CSV, as SageMaker's TensorFlow Serving container does;
    tests/unit/test_tfs_shapes.py)."""
    return got.get("predictions", got.get("outputs")) if isinstance(got, dict) else got


def npy(array: Any) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array))
    return buffer.getvalue()


def invoke(
    runtime: Runtime, body: Any, content_type: str = "application/json", accept: str | None = None
) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    out, out_type = runtime.invoke(raw, content_type, accept, InvocationContext())
    if out_type == "application/json":
        return json.loads(out)
    if out_type == "application/x-npy":
        return np.load(io.BytesIO(out), allow_pickle=False)
    return out.decode()


@pytest.fixture(scope="module")
def model(hetero_models: Path) -> Callable[..., Runtime]:
    """A loaded runtime for one of the demo's model folders (cached: loading TensorFlow models takes
    a while)."""
    cache: dict[tuple, Runtime] = {}

    def load(name: str, environment: dict[str, str] | None = None) -> Runtime:
        key = (name, tuple(sorted((environment or {}).items())))
        if key not in cache:
            runtime = runtime_for(
                STACK_OF[name],
                materialize(str(hetero_models / name)),
                {"SERVING_CPUS": "1", **ENVIRONMENT.get(name, {}), **(environment or {})},
            )
            runtime.load()
            cache[key] = runtime
        return cache[key]

    return load


def copy_model(hetero_models: Path, name: str, target: Path) -> Path:
    shutil.copytree(hetero_models / name, target)
    return target


# --- every layout loads and answers what the framework answered in process -----------------


@pytest.mark.parametrize("name", sorted(STACK_OF))
def test_each_model_answers_as_trained(
    model, hetero_expected: dict, answer_matches, name: str
) -> None:
    expected = hetero_expected[name]
    got = invoke(model(name), expected["request"])
    if STACK_OF[name] == "tensorflow" and not isinstance(expected["response"], dict):
        got = unwrap(got)  # a bare JSON list is TF Serving's "instances" there
    assert answer_matches(got, expected["response"]), (name, got, expected["response"])
    if expected["classes"]:  # and the model is right, not only consistent: one probe row per class
        values = got.get("predictions", got.get("outputs")) if isinstance(got, dict) else got
        values = np.asarray(values)
        assert (values.argmax(axis=1) if values.ndim == 2 else values).tolist() == expected[
            "classes"
        ]


@pytest.mark.parametrize(
    "name", ["hetero-iris-torchscript", "hetero-iris-state", "hetero-tf-iris", "hetero-onnx-iris"]
)
@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (json.dumps(IRIS_ROWS).encode(), "application/json"),
        (b"5.1,3.5,1.4,0.2\n7.0,3.2,4.7,1.4\n6.3,3.3,6.0,2.5\n", "text/csv"),
        (npy(IRIS_ROWS), "application/x-npy"),
        (npy(np.array(IRIS_ROWS, dtype=np.float32)), "application/x-npy"),
    ],
    ids=["json", "csv", "npy float64", "npy float32"],
)
def test_iris_models_read_every_content_type(
    model, name: str, body: bytes, content_type: str
) -> None:
    probabilities = np.asarray(unwrap(invoke(model(name), body, content_type)))
    assert probabilities.shape == (3, 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    assert probabilities.argmax(axis=1).tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "name",
    [
        "hetero-iris-torchscript",
        "hetero-iris-state",
        "hetero-tf-iris",
        "hetero-onnx-iris",
        "hetero-onnx-two",
    ],
)
def test_whole_numbers_reach_float_models(model, name: str) -> None:
    rows = [[5, 3, 1, 0], [6, 3, 6, 3]]  # JSON integers decode as int64; these models take float32
    body = (
        {"sepal": [r[:2] for r in rows], "petal": [r[2:] for r in rows]}
        if name == "hetero-onnx-two"
        else rows
    )
    got = invoke(model(name), body)
    probabilities = np.asarray(got["predictions"] if isinstance(got, dict) else got)
    assert probabilities.argmax(axis=1).tolist() == [0, 2]


# Not tensorflow: SageMaker's TensorFlow Serving container answers JSON whatever the Accept
# (test_tfs_shapes.py).
@pytest.mark.parametrize(
    "name", ["hetero-iris-torchscript", "hetero-onnx-iris", "hetero-wine-export"]
)
@pytest.mark.parametrize("accept", ["text/csv", "application/x-npy"])
def test_answers_in_the_accepted_type(model, hetero_expected: dict, name: str, accept: str) -> None:
    request = hetero_expected[name]["request"]
    out = invoke(model(name), request, accept=accept)
    array = np.loadtxt(io.StringIO(out), delimiter=",") if accept == "text/csv" else out
    assert array.shape == (3, 3)
    assert array.argmax(axis=1).tolist() == [0, 1, 2]


REQUEST_SHAPES = {
    "instances": (lambda rows: {"instances": rows}, "predictions"),
    "inputs": (lambda rows: {"inputs": rows}, "outputs"),
    # the container sends it to TF Serving as "instances"
    "plain array": (lambda rows: rows, "predictions"),
    "instances by input name": (
        lambda rows: {"instances": [{"features": row} for row in rows]},
        "predictions",
    ),
    "inputs by input name": (lambda rows: {"inputs": {"features": rows}}, "outputs"),
    "instances one per line": (
        lambda rows: "\n".join(json.dumps({"features": row}) for row in rows),
        "predictions",
    ),
}


@pytest.mark.parametrize("shape", list(REQUEST_SHAPES))
@pytest.mark.parametrize(
    "name", ["hetero-tf-iris", "hetero-tf-features"], ids=["keras", "savedmodel"]
)
def test_tensorflow_serving_request_shapes(
    model, hetero_expected: dict, name: str, shape: str
) -> None:
    rows = IRIS_ROWS if name == "hetero-tf-iris" else hetero_expected[name]["request"]
    build, key = REQUEST_SHAPES[shape]
    request = build(rows)
    got = invoke(model(name), request.encode() if isinstance(request, str) else request)
    if key:
        assert list(got) == [key]
        got = got[key]
    assert np.asarray(got).argmax(axis=1).tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "name", ["hetero-wine-export", "hetero-tf-features", "hetero-onnx-iris", "hetero-tf-iris"]
)
def test_a_single_instance_gets_a_batch_axis(model, hetero_expected: dict, name: str) -> None:
    request = hetero_expected[name]["request"]
    rows = request["instances"] if isinstance(request, dict) else request
    got = invoke(model(name), rows[0])
    assert np.asarray(unwrap(got)).shape == (1, 3)


# --- input mismatches: a ModelInputError (424 at the edge) that says what the model takes --------


@pytest.mark.parametrize(
    ("name", "body", "fragments"),
    [
        ("hetero-wine-export", [[1.0, 2.0, 3.0]], ["has shape [1, 3]", "x (float32 [?, 13])"]),
        ("hetero-onnx-iris", [[1.0, 2.0, 3.0]], ["has shape [1, 3]", "x (float32 [?, 4])"]),
        ("hetero-tf-features", [[1.0, 2.0, 3.0, 4.0]], ["has shape [1, 4]", "(float32 [?, 3])"]),
        ("hetero-tf-iris", [[1.0, 2.0, 3.0]], ["has shape [1, 3]", "features (float32 [?, 4])"]),
        (
            "hetero-iris-torchscript",
            [[1, 2, 3]],
            [
                "the model failed on input x float32 [1, 3]",
                "size of tensor a (3) must match the size of tensor b (4)",
            ],
        ),
        (
            "hetero-iris-state",
            [[1.0, 2.0, 3.0]],
            ["the model failed on input x float32 [1, 3]", "size of tensor a (3)"],
        ),
        ("hetero-onnx-iris", [[[1.0, 2.0, 3.0, 4.0]]], ["has shape [1, 1, 4]"]),
        ("hetero-onnx-iris", [["a", "b", "c", "d"]], ["holds text", "x (float32 [?, 4])"]),
        ("hetero-tf-iris", [[1.0, [2.0], 3.0, 4.0]], ["not a rectangular array"]),
        (
            "hetero-onnx-two",
            {"sepal": [[5.1, 3.5]]},
            ["missing input 'petal'", "sepal (float32 [?, 2])"],
        ),
        (
            "hetero-onnx-two",
            {"sepal": [[5.1, 3.5]], "petal": [[1.4, 0.2]], "stem": [[1]]},
            ["unknown input 'stem'"],
        ),
        ("hetero-onnx-two", IRIS_ROWS, ["takes 2 inputs", "JSON object keyed by input name"]),
        ("hetero-tf-wine.tar.gz", {"inputs": {"wine": [[1.0] * 13]}}, ["missing input 'features'"]),
        (
            "hetero-tf-iris",
            {"instances": [{"features": IRIS_ROWS[0]}, {"other": IRIS_ROWS[1]}]},
            ["Failed to process element: 1 of 'instances' list", "keys must be equal to: features"],
        ),
    ],
    ids=[
        "export wrong width",
        "onnx wrong width",
        "savedmodel wrong width",
        "keras wrong width",
        "torchscript wrong width",
        "state dict wrong width",
        "onnx wrong rank",
        "onnx strings",
        "ragged",
        "missing input name",
        "unknown input name",
        "array for two inputs",
        "tf missing input",
        "instances differ",
    ],
)
def test_input_mismatch_says_what_the_model_takes(
    model, name: str, body: Any, fragments: list[str]
) -> None:
    # tensorflow: TF Serving's 400 {"error": ...}, which the router reports as 424 ModelError too.
    with pytest.raises((ModelInputError, ContainerAnswerError)) as caught:
        invoke(model(name), body)
    if STACK_OF[name] == "tensorflow":
        assert isinstance(caught.value, ContainerAnswerError) and caught.value.status == 400
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)
    # Not the caller's ValidationError (400): the container answers 500, the router 424 ModelError.
    assert not isinstance(caught.value, ValidationError)


def test_the_replica_keeps_serving_after_a_mismatch(model) -> None:
    runtime = model("hetero-onnx-iris")
    with pytest.raises(ModelInputError):
        invoke(runtime, [[1.0]])
    assert np.asarray(invoke(runtime, IRIS_ROWS)).argmax(axis=1).tolist() == [0, 1, 2]


def test_malformed_body_is_still_a_validation_error(model) -> None:
    with pytest.raises(ValidationError, match="not valid application/json"):
        invoke(model("hetero-onnx-iris"), b"[[1, 2", "application/json")


# --- dtypes ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_int_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ONNX model summing int64 ids per row: a non-float input dtype."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["ids", "axes"], ["total"], keepdims=0)],
        "sum_ids",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None, 3])],
        [helper.make_tensor_value_info("total", TensorProto.INT64, [None])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    folder = tmp_path_factory.mktemp("onnx-int")
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx"
    )
    return folder


def test_onnx_casts_whole_numbers_to_the_model_dtype(loaded, onnx_int_model: Path) -> None:
    runtime = loaded("onnx", onnx_int_model)
    assert invoke(runtime, [[1, 2, 3], [4.0, 5.0, 6.0]]) == [6, 15]
    assert invoke(runtime, b"1,2,3\n", "text/csv") == [6]


def test_onnx_refuses_fractions_for_an_integer_input(loaded, onnx_int_model: Path) -> None:
    with pytest.raises(ModelInputError, match="non-integer values.*ids \\(int64 \\[\\?, 3\\]\\)"):
        invoke(loaded("onnx", onnx_int_model), [[1.5, 2, 3]])


@pytest.fixture(scope="module")
def tf_module_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain tf.Module SavedModel (not Keras) with two named inputs of different dtypes and two
    outputs."""
    import tensorflow as tf

    class Scorer(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 2], tf.float32, name="values"),
                tf.TensorSpec([None], tf.int64, name="offset"),
            ]
        )
        def serve(self, values, offset):
            return {
                "total": tf.reduce_sum(values, axis=-1) + tf.cast(offset, tf.float32),
                "count": tf.shape(values)[:1],
            }

    scorer = Scorer()
    folder = tmp_path_factory.mktemp("tf-module")
    tf.saved_model.save(
        scorer, str(folder), signatures={"serving_default": scorer.serve, "other": scorer.serve}
    )
    return folder


def test_savedmodel_with_named_inputs_and_outputs(loaded, tf_module_model: Path) -> None:
    runtime = loaded("tensorflow", tf_module_model)
    got = invoke(runtime, {"inputs": {"values": [[1.0, 2.0], [3.0, 4.0]], "offset": [10, 20]}})
    assert got == {"outputs": {"count": [2], "total": [13.0, 27.0]}}
    row_format = invoke(runtime, {"instances": [{"values": [1.0, 2.0], "offset": 1}]})
    assert row_format == {"predictions": [{"count": 1, "total": 4.0}]}


def test_savedmodel_signature_by_environment(loaded, tf_module_model: Path) -> None:
    runtime = loaded("tensorflow", tf_module_model, {"SERVING_TF_SIGNATURE": "other"})
    assert invoke(runtime, {"inputs": {"values": [[1.0, 2.0]], "offset": [0]}})["outputs"][
        "total"
    ] == [3.0]
    with pytest.raises(ValueError, match="no signature 'missing' \\(it has: .*serving_default"):
        loaded("tensorflow", tf_module_model, {"SERVING_TF_SIGNATURE": "missing"})


# --- TensorFlow layouts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layout", ["root", "version folder", "model/version", "export/Servo", "two versions", "archive"]
)
def test_savedmodel_layouts(
    loaded, hetero_models: Path, hetero_expected: dict, answer_matches, tmp_path: Path, layout: str
) -> None:
    source = hetero_models / "hetero-tf-features" / "1"
    target = {
        "root": tmp_path / "m",
        "version folder": tmp_path / "m" / "3",
        "model/version": tmp_path / "m" / "features" / "7",
        "export/Servo": tmp_path / "m" / "export" / "Servo" / "5",  # SageMaker's legacy TF layout
        "two versions": tmp_path / "m" / "2",
        "archive": tmp_path / "staging" / "model" / "1",
    }[layout]
    shutil.copytree(source, target)
    if layout == "two versions":  # the highest version is served: version 1 is a broken copy
        (tmp_path / "m" / "1").mkdir()
        (tmp_path / "m" / "1" / "saved_model.pb").write_bytes(b"not a SavedModel")
    model_dir = tmp_path / "m"
    if layout == "archive":
        with tarfile.open(tmp_path / "model.tar.gz", "w:gz") as tar:
            tar.add(tmp_path / "staging" / "model", arcname="model")
        model_dir = materialize(str(tmp_path / "model.tar.gz"))
    expected = hetero_expected["hetero-tf-features"]
    assert answer_matches(
        unwrap(invoke(loaded("tensorflow", model_dir), expected["request"])), expected["response"]
    )


def test_several_savedmodels_are_refused(hetero_models: Path, tmp_path: Path) -> None:
    for name in ("first", "second"):
        shutil.copytree(hetero_models / "hetero-tf-features" / "1", tmp_path / name / "1")
    with pytest.raises(ValueError, match="several SavedModels .*first/1, second/1"):
        runtime_for("tensorflow", tmp_path, {}).load()


def test_tensorflow_without_a_model(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    with pytest.raises(FileNotFoundError, match="no SavedModel"):
        runtime_for("tensorflow", tmp_path, {}).load()


# --- PyTorch layouts ---------------------------------------------------------------------------


def test_state_dict_without_model_fn_is_refused(hetero_models: Path, tmp_path: Path) -> None:
    shutil.copy(hetero_models / "hetero-iris-state" / "model.pth", tmp_path / "model.pth")
    with pytest.raises(ValueError, match="holds a state dict.*model_fn"):
        runtime_for("pytorch", tmp_path, {}).load()


@pytest.fixture(scope="module")
def pickled_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A whole nn.Module saved with torch.save: loading it means unpickling."""
    import torch

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("pickled-torch")
    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 2)), folder / "model.pth")
    return folder


def test_pickled_module_needs_opt_in(pickled_module: Path, loaded) -> None:
    with pytest.raises(PermissionError, match="SERVING_ALLOW_PICKLE"):
        runtime_for("pytorch", pickled_module, {}).load()
    got = invoke(loaded("pytorch", pickled_module, {"SERVING_ALLOW_PICKLE": "true"}), IRIS_ROWS)
    assert np.asarray(got).shape == (3, 2)


def test_pytorch_without_a_model(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("no weights here")
    with pytest.raises(FileNotFoundError, match="no model.pt2"):
        runtime_for("pytorch", tmp_path, {}).load()


def test_export_is_preferred_over_weights(
    hetero_models: Path, hetero_expected: dict, answer_matches, loaded, tmp_path: Path
) -> None:
    folder = copy_model(hetero_models, "hetero-wine-export", tmp_path / "m")
    (folder / "model.pt").write_bytes(b"not read")
    expected = hetero_expected["hetero-wine-export"]
    got = invoke(loaded("pytorch", folder, ENVIRONMENT["hetero-wine-export"]), expected["request"])
    assert answer_matches(got, expected["response"])


def test_export_without_the_opt_in_is_refused_not_skipped(
    hetero_models: Path, tmp_path: Path
) -> None:
    folder = copy_model(hetero_models, "hetero-wine-export", tmp_path / "m")
    shutil.copy(hetero_models / "hetero-iris-torchscript" / "model.pt", folder / "model.pt")
    with pytest.raises(PermissionError, match="refusing to load model.pt2.*SERVING_ALLOW_PICKLE"):
        runtime_for("pytorch", folder, {}).load()


# --- hooks override the stack defaults ---------------------------------------------------------

NAMES_OUTPUT = """
import json
NAMES = ["setosa", "versicolor", "virginica"]
def output_fn(prediction, accept):
    values = prediction.get("predictions", prediction) if isinstance(prediction, dict) else prediction
    return json.dumps([NAMES[int(i)] for i in values.argmax(axis=1)]), "application/json"
"""

SCALE_INPUT = """
import json
import numpy as np
def input_fn(body, content_type):
    # centimetres in, millimetres sent: scale back before the model
    return np.asarray(json.loads(body)["mm"], dtype=np.float32) / 10.0
"""

OWN_PREDICT = """
def predict_fn(data, model):
    return {"stack": "custom", "rows": len(data)}
"""


# Not tensorflow: it takes SageMaker TensorFlow Serving's handlers and refuses these
# (test_tfs_handlers.py).
@pytest.mark.parametrize("name", ["hetero-iris-torchscript", "hetero-onnx-iris"])
@pytest.mark.parametrize(
    ("hook", "body", "expected"),
    [
        (NAMES_OUTPUT, IRIS_ROWS, ["setosa", "versicolor", "virginica"]),
        (
            SCALE_INPUT + NAMES_OUTPUT,
            {"mm": (np.array(IRIS_ROWS) * 10).tolist()},
            ["setosa", "versicolor", "virginica"],
        ),
        (OWN_PREDICT, IRIS_ROWS, {"stack": "custom", "rows": 3}),
    ],
    ids=["output_fn", "input_fn and output_fn", "predict_fn"],
)
def test_hooks_override_the_defaults(
    hetero_models: Path, loaded, tmp_path: Path, name: str, hook: str, body: Any, expected: Any
) -> None:
    folder = copy_model(hetero_models, name, tmp_path / "m")
    (folder / "code").mkdir()
    (folder / "code" / "inference.py").write_text(hook)
    assert invoke(loaded(STACK_OF[name], folder), body) == expected


def test_user_model_fn_replaces_loading(hetero_models: Path, loaded, tmp_path: Path) -> None:
    folder = copy_model(hetero_models, "hetero-onnx-features", tmp_path / "m")
    # only the user's model_fn knows this name
    (folder / "model.onnx").rename(folder / "weights.bin")
    (folder / "code").mkdir()
    (folder / "code" / "inference.py").write_text(
        "import os, onnxruntime\n"
        "def model_fn(model_dir):\n"
        "    return onnxruntime.InferenceSession(os.path.join(model_dir, 'weights.bin'))\n"
    )
    assert np.asarray(invoke(loaded("onnx", folder), [[-2.0, 0.4, 0.1]])).argmax() == 0


# --- CPU and GPU share ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environment", "threads"),
    [
        ({}, None),
        ({"SERVING_CPUS": "0.05"}, 1),
        ({"SERVING_CPUS": "1"}, 1),
        ({"SERVING_CPUS": "2.5"}, 2),
        ({"SERVING_CPUS": "0.5", "SERVING_NUM_THREADS": "3"}, 3),
    ],
)
def test_threads_follow_the_cpu_share(environment: dict[str, str], threads: int | None) -> None:
    assert cpu_threads(environment) == threads


@pytest.mark.parametrize(
    ("environment", "predictions", "threads"),
    [
        ({"SERVING_CPUS": "2"}, 2, 1),
        ({"SERVING_CPUS": "4"}, 2, 2),
        ({"SERVING_CPUS": "1"}, 4, 1),
        ({"SERVING_CPUS": "2", "SERVING_NUM_THREADS": "3"}, 2, 3),
        ({}, 2, None),
    ],
)
def test_concurrent_predictions_share_the_cpus(
    environment: dict[str, str], predictions: int, threads: int | None
) -> None:
    # Model threads times intra-op threads stay within the reservation (an explicit
    # SERVING_NUM_THREADS wins).
    assert cpu_threads(environment, predictions) == threads


def test_bad_thread_override_is_refused() -> None:
    with pytest.raises(ValueError, match="SERVING_NUM_THREADS"):
        cpu_threads({"SERVING_NUM_THREADS": "0"})


def test_onnx_session_uses_the_cpu_share(hetero_models: Path) -> None:
    runtime = runtime_for("onnx", hetero_models / "hetero-onnx-iris", {"SERVING_CPUS": "1"})
    runtime.load()
    assert runtime.model.get_session_options().intra_op_num_threads == 1
    assert runtime.model.get_providers() == ["CPUExecutionProvider"]


@pytest.mark.parametrize(
    "stack,name", [("onnx", "hetero-onnx-iris"), ("pytorch", "hetero-iris-torchscript")]
)
def test_gpu_share_without_cuda_falls_back_to_cpu(
    hetero_models: Path, caplog: pytest.LogCaptureFixture, stack: str, name: str
) -> None:
    # The CUDA path itself needs a GPU machine: here only the decision and the fallback are
    # exercised.
    runtime = runtime_for(stack, hetero_models / name, {"SERVING_CPUS": "1", "SERVING_GPUS": "1"})
    with caplog.at_level(logging.WARNING):
        runtime.load()
    assert "running on CPU" in caplog.text
    assert np.asarray(invoke(runtime, IRIS_ROWS)).argmax(axis=1).tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("gpus", "available", "chosen"),
    [
        (
            "1",
            ["CUDAExecutionProvider", "CPUExecutionProvider"],
            ["CUDAExecutionProvider", "CPUExecutionProvider"],
        ),
        ("0", ["CUDAExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"]),
        ("1", ["CPUExecutionProvider"], ["CPUExecutionProvider"]),
    ],
)
def test_onnx_provider_choice(gpus: str, available: list[str], chosen: list[str]) -> None:
    # A stand-in for onnxruntime's provider list: no onnxruntime build with CUDA can be installed
    # here (CUDA itself ran on a GPU machine: python -m loadtests.bench_gpu,
    # docs/benchmarks/bench_gpu.md).
    class FakeOrt:
        @staticmethod
        def get_available_providers() -> list[str]:
            return available

    runtime = runtime_for("onnx", None, {"SERVING_GPUS": gpus})
    assert runtime.providers(FakeOrt) == chosen


def test_onnx_threads_sleep_between_calls(hetero_models: Path) -> None:
    runtime = runtime_for("onnx", hetero_models / "hetero-onnx-iris", {"SERVING_CPUS": "4"})
    runtime.load()
    options = runtime.model.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.intra_op_num_threads == 1  # 4 model threads (it releases the GIL), one core each


@pytest.mark.parametrize(
    ("script", "torch_threads"), [(None, 1), (OWN_PREDICT, 2)], ids=["no script", "predict_fn"]
)
def test_pytorch_intra_op_threads_follow_the_model_threads(
    hetero_models: Path, tmp_path: Path, script: str | None, torch_threads: int
) -> None:
    # Cpus 2: two model threads of one intra-op thread each; a script's predict_fn (not assumed
    # thread-safe) runs one prediction at a time, which then gets both cores.
    import torch

    folder = copy_model(hetero_models, "hetero-iris-torchscript", tmp_path / "m")
    if script is not None:
        (folder / "code").mkdir()
        (folder / "code" / "inference.py").write_text(script)
    before = torch.get_num_threads()
    try:
        runtime = runtime_for("pytorch", folder, {"SERVING_CPUS": "2"})
        runtime.load()
        assert runtime.prediction_threads() == 2 // torch_threads
        assert torch.get_num_threads() == torch_threads
    finally:
        torch.set_num_threads(before)


def test_pytorch_sets_threads_from_the_cpu_share(hetero_models: Path) -> None:
    import torch

    before = torch.get_num_threads()
    try:
        runtime_for(
            "pytorch", hetero_models / "hetero-iris-torchscript", {"SERVING_CPUS": "1"}
        ).load()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


# --- request helpers ---------------------------------------------------------------------------


def test_split_request_shapes() -> None:
    assert split_request([[1, 2]]) == ([[1, 2]], None)
    assert split_request({"instances": [[1, 2]]}) == ([[1, 2]], "predictions")
    assert split_request({"inputs": {"a": [1]}}) == ({"a": [1]}, "outputs")
    assert split_request({"instances": [{"a": 1, "b": 2}, {"a": 3, "b": 4}]}) == (
        {"a": [1, 3], "b": [2, 4]},
        "predictions",
    )
    assert split_request({"a": [1]}) == ({"a": [1]}, None)


def test_wrap_outputs_follows_tf_serving() -> None:
    one = np.array([[0.1, 0.9]])
    assert wrap_outputs({"out": one}, None) is one
    assert wrap_outputs({"out": one}, "predictions") == {"predictions": one}
    rows = wrap_outputs({"a": np.array([1, 2]), "b": np.array([3, 4])}, "predictions")
    assert rows == {"predictions": [{"a": 1, "b": 3}, {"a": 2, "b": 4}]}
    with_scalar = wrap_outputs({"a": np.array([1, 2]), "n": np.array(2)}, "predictions")
    assert with_scalar == {"predictions": [{"a": 1, "n": 2}, {"a": 2, "n": 2}]}
    assert wrap_outputs({"a": np.array([1]), "b": np.array([2])}, "outputs") == {
        "outputs": {"a": np.array([1]), "b": np.array([2])}
    }


def test_conform_out_of_range_integers() -> None:
    with pytest.raises(ModelInputError, match="out of range for int8"):
        conform([300], InputSpec("x", (None,), np.dtype(np.int8)))
