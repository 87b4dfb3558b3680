"""The tensorflow stack without user code answers as SageMaker's TensorFlow Serving container does.

Expected bytes are those the container's own tests document (sagemaker-tensorflow-serving-container,
test/integration/local/test_container.py, on TF Serving's half_plus_three): `{"predictions": ...}`
from TF Serving's pretty printer, its newlines removed when the Accept names a JSON type. The model
here is a real SavedModel computing the same function (0.5 * x + 3, input of any shape).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from serving.errors import ContainerAnswerError
from serving.runtimes import InvocationContext, Runtime, runtime_for
from serving.runtimes.tfs_json import decimal_token, outputs_json, predictions_json

# imports torch, TensorFlow, ONNX Runtime or XGBoost: not in `make test-unit`
pytestmark = pytest.mark.frameworks

JSON, JSONL, CSV = "application/json", "application/jsonlines", "text/csv"


def save_half_plus_three(folder: Path) -> Path:
    import tensorflow as tf

    class HalfPlusThree(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec(None, tf.float32, name="x")])
        def serve(self, x):
            return {"y": 0.5 * x + 3.0}

    module = HalfPlusThree()
    tf.saved_model.save(
        module,
        str(folder / "half_plus_three" / "123"),
        signatures={"serving_default": module.serve},
    )
    return folder


@pytest.fixture(scope="module")
def half_plus_three(tmp_path_factory: pytest.TempPathFactory) -> Runtime:
    runtime = runtime_for("tensorflow", save_half_plus_three(tmp_path_factory.mktemp("tfs")), {})
    runtime.load()
    return runtime


def answer(
    runtime: Runtime,
    body: str,
    content_type: str = JSON,
    accept: str | None = JSON,
    attributes: str | None = None,
) -> tuple[int, bytes, str]:
    try:
        out, out_type = runtime.invoke(
            body.encode(), content_type, accept, InvocationContext(custom_attributes=attributes)
        )
        return 200, out, out_type
    except ContainerAnswerError as error:
        return error.status, error.raw, error.content_type


# (request body, content type, the container's documented answer)
DOCUMENTED = {
    "instances": ('{"instances": [1.0, 2.0, 5.0]}', JSON, {"predictions": [3.5, 4.0, 5.5]}),
    "two instances": (
        '{"instances": [[1.0, 2.0, 5.0], [1.0, 2.0, 5.0]]}',
        JSON,
        {"predictions": [[3.5, 4.0, 5.5], [3.5, 4.0, 5.5]]},
    ),
    "jsons as json": (
        "[1.0, 2.0, 5.0]\n[1.0, 2.0, 5.0]",
        JSON,
        {"predictions": [[3.5, 4.0, 5.5], [3.5, 4.0, 5.5]]},
    ),
    "jsonlines": (
        "[1.0, 2.0, 5.0]\n[1.0, 2.0, 5.0]",
        JSONL,
        {"predictions": [[3.5, 4.0, 5.5], [3.5, 4.0, 5.5]]},
    ),
    "jsons": (
        "[1.0, 2.0, 5.0]\n[1.0, 2.0, 5.0]",
        "application/jsons",
        {"predictions": [[3.5, 4.0, 5.5], [3.5, 4.0, 5.5]]},
    ),
    "jsons objects": (
        '{"x": [1.0, 2.0, 5.0]}\n{"x": [1.0, 2.0, 5.0]}',
        JSON,
        {"predictions": [[3.5, 4.0, 5.5], [3.5, 4.0, 5.5]]},
    ),
    "bare list": ("[1.0, 2.0, 5.0]", JSON, {"predictions": [[3.5, 4.0, 5.5]]}),
    "bare list of two": (
        "[[1.0, 2.0, 5.0], [1.0, 2.0, 5.0]]",
        JSON,
        {"predictions": [[3.5, 4.0, 5.5], [3.5, 4.0, 5.5]]},
    ),
    "csv": ("1.0", CSV, {"predictions": [3.5]}),
    "csv zero": ("0.0", CSV, {"predictions": [3.0]}),
    "csv one row": ("0.0,2.0,5.0", CSV, {"predictions": [[3.0, 4.0, 5.5]]}),
    "csv two rows": (
        "1.0,2.0,5.0\n1.0,2.0,5.0",
        CSV,
        {"predictions": [[3.5, 4.0, 5.5], [3.5, 4.0, 5.5]]},
    ),
    "csv three instances": ("1.0\n2.0\n5.0", CSV, {"predictions": [3.5, 4.0, 5.5]}),
}


@pytest.mark.parametrize("case", list(DOCUMENTED))
def test_documented_shapes(half_plus_three: Runtime, case: str) -> None:
    body, content_type, expected = DOCUMENTED[case]
    status, out, out_type = answer(half_plus_three, body, content_type)
    assert (status, out_type) == (200, JSON)
    assert json.loads(out) == expected


def test_exact_bytes_with_a_json_accept(half_plus_three: Runtime) -> None:
    # test_predict_with_jsonlines / test_predict_with_multiple_accept_types
    body = '{"instances": [1.0, 2.0, 5.0]}'
    assert answer(half_plus_three, body, accept=JSONL) == (
        200,
        b'{    "predictions": [3.5, 4.0, 5.5    ]}',
        JSONL,
    )
    assert answer(half_plus_three, body, accept="application/json, application/jsonlines") == (
        200,
        b'{    "predictions": [3.5, 4.0, 5.5    ]}',
        JSON,
    )


def test_without_a_json_accept_tf_servings_newlines_stay(half_plus_three: Runtime) -> None:
    expected = b'{\n    "predictions": [[3.5, 4.0, 5.5], [3.5, 4.0, 5.5]\n    ]\n}'
    assert answer(half_plus_three, "1.0,2.0,5.0\n1.0,2.0,5.0", CSV, accept=None) == (
        200,
        expected,
        JSON,
    )
    assert answer(half_plus_three, "1.0,2.0,5.0\n1.0,2.0,5.0", CSV, accept="text/csv") == (
        200,
        expected,
        JSON,
    )


def test_columnar_request_gets_outputs(half_plus_three: Runtime) -> None:
    status, out, _ = answer(half_plus_three, '{"inputs": [[1.0, 2.0], [5.0, 0.5]]}', accept=None)
    assert status == 200
    assert out == (
        b'{\n    "outputs": [\n        [\n            3.5,\n            4.0\n        ],\n'
        b"        [\n            5.5,\n            3.25\n        ]\n    ]\n}"
    )


def test_tf_serving_errors_keep_their_status_and_shape(half_plus_three: Runtime) -> None:
    status, out, _ = answer(half_plus_three, "whatever", accept=None)
    assert status == 400 and out.startswith(b'{\n    "error": "JSON Parse error: ')
    status, out, _ = answer(half_plus_three, '{"instances": ["]["]}')
    assert status == 400 and "error" in json.loads(out)
    assert answer(half_plus_three, "x", "text/plain") == (
        415,
        b'{"error": "Unsupported Media Type: text/plain"}',
        JSON,
    )


def test_custom_attributes_name_the_servable(half_plus_three: Runtime) -> None:
    body = '{"instances": [1.0]}'
    assert (
        answer(
            half_plus_three, body, attributes="tfs-model-name=half_plus_three,tfs-model-version=123"
        )[0]
        == 200
    )
    assert answer(half_plus_three, body, attributes="tfs-model-name=other") == (
        404,
        b'{    "error": "Servable not found for request: Latest(other)"}',
        JSON,
    )
    assert answer(half_plus_three, body, attributes="tfs-model-version=124")[0] == 404
    assert answer(half_plus_three, body, attributes="tfs-method=regress")[0] == 400


def test_npy_keeps_the_tensor_codec_path(half_plus_three: Runtime) -> None:
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.array([1.0, 2.0], dtype=np.float32))
    out, out_type = half_plus_three.invoke(
        buffer.getvalue(), "application/x-npy", JSON, InvocationContext()
    )
    assert json.loads(out) == [3.5, 4.0]


@pytest.mark.parametrize(
    ("value", "single", "text"),
    [
        (3.5, True, "3.5"),
        (4.0, True, "4.0"),
        (float(np.float32(0.1)), True, "0.1"),
        (1e-5, False, "1e-05"),
        (9000000.0, False, "9e+06"),
        (1234567.0, True, "1234567.0"),
        (float(np.float32(3.000005)), True, "3.00000501"),
        (float("nan"), True, "NaN"),
        (float("-inf"), False, "-Infinity"),
        (0.1 + 0.2, False, "0.30000000000000004"),
    ],
)
def test_float_formatting_is_tf_servings(value: float, single: bool, text: str) -> None:
    assert decimal_token(value, single) == text


def test_several_outputs_in_row_and_columnar_format() -> None:
    outputs = {
        "ids": np.array([1, 2]),
        "scores": np.array([[0.5, 0.25], [1.0, 2.0]], dtype=np.float32),
    }
    assert predictions_json(outputs) == (
        b'{\n    "predictions": [\n        {\n            "ids": 1,\n            "scores": [0.5, 0.25]\n        },\n'
        b'        {\n            "ids": 2,\n            "scores": [1.0, 2.0]\n        }\n    ]\n}'
    )
    assert outputs_json({"label_bytes": np.array([b"a"], dtype=object)}) == (
        b'{\n    "outputs": [\n        {\n            "b64": "YQ=="\n        }\n    ]\n}'
    )
