"""Malformed request bodies are the caller's 400 ValidationError, decoded cheaply, never a 500 with
internals.

Each body is checked at the codec and through real runtimes (a skops scikit-learn model and a Python
handler), as the container calls them; messages must not carry this machine's paths or tracebacks.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import skops.io
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

from serving.errors import ValidationError, failure_message
from serving.runtimes import InvocationContext, codecs, runtime_for

JSON, CSV, NPY = "application/json", "text/csv", "application/x-npy"


def npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def npy_declaring(shape: tuple, descr: str = "<f8", payload: bytes = b"\0" * 64) -> bytes:
    """An NPY header declaring `shape` of `descr`, followed by far fewer bytes than that."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue() + payload


MALFORMED = {
    "100k-deep JSON": (b"[" * 100_000 + b"]" * 100_000, JSON),
    "100k-deep JSON objects": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, JSON),
    "CSV field over 128 KiB": (b"1," + b"9" * (200 * 1024) + b"\n", CSV),
    "quoted CSV field over 128 KiB": (b'"' + b"9" * (200 * 1024) + b'"\n', CSV),
    "NPY declaring terabytes": (npy_declaring((10**12,)), NPY),
    "NPY declaring 30 GiB": (npy_declaring((10**9, 4)), NPY),
    "NPY declaring fewer bytes than it has": (npy_declaring((2,)) + b"\0" * 64, NPY),
    "NPY object array": (npy(np.array([{"a": 1}, None], dtype=object), allow_pickle=True), NPY),
}
TEXT = {
    "NPY unicode array": (npy(np.array([["a", "b", "c", "d"]])), NPY),
    "NPY bytes array": (npy(np.array([[b"a", b"b", b"c", b"d"]])), NPY),
    "JSON strings": (json.dumps([["a", "b", "c", "d"]]).encode(), JSON),
}


def assert_clean(error: ValidationError, *machine_paths: str) -> None:
    assert error.status == 400 and error.code == "ValidationError"
    fragments = [
        "Traceback",
        "site-packages",
        "/work/",
        "/tmp/",
        "/root/",
        "/usr/",
        sys.prefix,
        os.getcwd(),
        *machine_paths,
    ]
    for fragment in fragments:
        assert fragment not in error.message, (fragment, error.message)


@pytest.fixture(scope="module")
def sklearn_model(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("iris")
    iris = load_iris()
    skops.io.dump(
        LogisticRegression(max_iter=500).fit(iris.data, iris.target), folder / "model.skops"
    )
    runtime = runtime_for("sklearn", folder, {})
    runtime.load()
    return runtime, folder


@pytest.fixture(scope="module")
def python_handler(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("handler")
    (folder / "code").mkdir()
    (folder / "code" / "inference.py").write_text(
        "def predict_fn(data, model):\n    return [len(data)]\n"
    )
    runtime = runtime_for("python", folder, {})
    runtime.load()
    return runtime, folder


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_body_is_a_clean_validation_error_at_the_codec(case: str) -> None:
    body, content_type = MALFORMED[case]
    started = time.process_time()
    with pytest.raises(ValidationError) as caught:
        codecs.decode(body, content_type)
    # refused cheaply: no allocation of what the header declares
    assert time.process_time() - started < 2.0
    assert content_type in caught.value.message
    assert_clean(caught.value)


@pytest.mark.parametrize("stack", ["sklearn", "python"])
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_body_is_a_clean_validation_error_through_a_runtime(
    request, stack: str, case: str
) -> None:
    runtime, folder = request.getfixturevalue(
        f"{stack}_model" if stack == "sklearn" else "python_handler"
    )
    body, content_type = MALFORMED[case]
    with pytest.raises(ValidationError) as caught:
        runtime.invoke(body, content_type, None, InvocationContext())
    assert_clean(caught.value, str(folder))


@pytest.mark.parametrize("case", list(TEXT))
def test_text_for_a_numeric_scikit_learn_model_is_a_validation_error(
    sklearn_model, case: str
) -> None:
    runtime, folder = sklearn_model
    body, content_type = TEXT[case]
    with pytest.raises(ValidationError, match="holds text") as caught:
        runtime.invoke(body, content_type, None, InvocationContext())
    assert_clean(caught.value, str(folder))


def test_text_still_reaches_a_scikit_learn_model_that_takes_it(tmp_path: Path) -> None:
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    model = make_pipeline(OneHotEncoder(), LogisticRegression()).fit(
        [["red"], ["blue"], ["red"]], [1, 0, 1]
    )
    skops.io.dump(model, tmp_path / "model.skops")
    runtime = runtime_for("sklearn", tmp_path, {})
    runtime.load()
    out, _ = runtime.invoke(npy(np.array([["red"]])), NPY, None, InvocationContext())
    assert json.loads(out) == [1]


@pytest.mark.parametrize(("depth", "accepted"), [(64, True), (100, True), (101, False)])
def test_json_depth_bound(depth: int, accepted: bool) -> None:
    body = b"[" * depth + b"1" + b"]" * depth
    if accepted:
        assert codecs.decode(body, JSON) is not None
    else:
        with pytest.raises(ValidationError, match="nested more than 100 levels"):
            codecs.decode(body, JSON)


def test_brackets_inside_json_strings_do_not_count() -> None:
    text = "[" * 500 + '\\"' + "{" * 500  # escaped quotes do not end the string
    doc = {"note": text, "rows": [[1, 2]]}
    assert codecs.decode(json.dumps(doc).encode(), JSON) == doc


def test_a_well_formed_npy_still_decodes_exactly() -> None:
    for array in (
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.asfortranarray(np.eye(3)),
        np.array(5.0),
        np.zeros((0, 4)),
        np.array([["a", "bc"]]),
    ):
        decoded = codecs.decode(npy(array), NPY)
        assert decoded.dtype == array.dtype and decoded.shape == array.shape
        np.testing.assert_array_equal(decoded, array)


def test_failure_message_drops_paths_and_tracebacks(tmp_path: Path) -> None:
    # What the container sends for an unexpected failure (the caller sees it as OriginalMessage).
    error = FileNotFoundError(
        2, "No such file or directory", str(tmp_path / "model" / "weights.bin")
    )
    message = failure_message(error)
    assert (
        message.startswith("FileNotFoundError: ")
        and str(tmp_path) not in message
        and "weights.bin" not in message
    )
    torch_like = RuntimeError(
        "The following operation failed in the TorchScript interpreter.\n"
        "Traceback of TorchScript (most recent call last):\n"
        f'  File "{tmp_path}/code/__torch__.py", line 12, in forward\n'
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x3 and 4x16)\n"
    )
    message = failure_message(torch_like)
    assert "mat1 and mat2 shapes cannot be multiplied" in message
    assert str(tmp_path) not in message and "Traceback" not in message and 'File "' not in message
    assert (
        failure_message(ValueError("could not convert 'a/b' to float"))
        == "ValueError: could not convert 'a/b' to float"
    )


def test_a_failing_model_reports_no_path_of_the_server(tmp_path: Path) -> None:
    # The container's catch-all answer for a model that raised: the error's type and text, paths
    # removed.
    from starlette.testclient import TestClient

    from serving.model_server.app import build_container_app
    from serving.runtimes import runtime_for

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(
        "def predict_fn(data, model):\n    open('/srv/secret/weights.bin')\n"
    )
    runtime = runtime_for("python", tmp_path, {})
    runtime.load()
    with TestClient(build_container_app(runtime, "leaky")) as client:
        response = client.post(
            "/invocations", content=b"[1]", headers={"content-type": "application/json"}
        )
    assert response.status_code == 500
    message = response.json()["message"]
    assert (
        message.startswith("FileNotFoundError")
        and "/srv/secret" not in message
        and str(tmp_path) not in message
    )
