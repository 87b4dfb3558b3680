"""V2 inference requests and responses as Triton's client writes and reads them
(`tritonclient.http`'s own request builder and result parser, no server): every datatype in JSON and
binary, the container bodies they become, and refusals that name the field at fault."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.http._utils import _get_inference_request

from serving.errors import ValidationError
from serving.open_inference import codec
from serving.protocol import CSV, JSON, NPY

NUMERIC = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


def triton_request(
    arrays: dict[str, tuple[np.ndarray, str]], binary: bool, outputs=None
) -> tuple[bytes, str | None]:
    inputs = []
    for name, (array, datatype) in arrays.items():
        tensor = triton.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    body, length = _get_inference_request(inputs, "", outputs, 0, False, False, 0, None, None)
    return body, None if length is None else str(length)


def triton_result(body: bytes, headers: dict[str, str]) -> triton.InferResult:
    length = headers.get("Inference-Header-Content-Length")
    return triton.InferResult.from_response_body(
        body, header_length=None if length is None else int(length)
    )


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", [*NUMERIC, "BYTES"])
def test_every_datatype_arrives_as_sent_and_returns_as_sent(datatype: str, binary: bool) -> None:
    if datatype == "BYTES":
        array = np.array([[b"setosa", b"virginica"], [b"", "caf\u00e9".encode()]], dtype=object)
    elif datatype == "BOOL":
        array = np.array([[True, False], [False, True]])
    else:
        array = (np.arange(6).reshape(2, 3) * (1.5 if datatype.startswith("FP") else 1)).astype(
            NUMERIC[datatype]
        )
    body, length = triton_request({"x": (array, datatype)}, binary)
    request = codec.parse_request(body, length)
    ((name, got),) = request.inputs
    assert name == "x" and got.shape == array.shape
    assert got.tolist() == array.tolist() and (datatype == "BYTES" or got.dtype == array.dtype)
    request.binary_output = binary
    answer, headers = codec.encode_response(
        "ep.c", "1", request, codec.chosen_outputs("ep.c", request, [("y", got)])
    )
    result = triton_result(answer, headers)
    assert result.get_output("y")["datatype"] == datatype
    returned = result.as_numpy("y")
    if datatype == "BYTES" and not binary:  # Triton's client gives JSON's BYTES elements as str
        returned = np.vectorize(str.encode, otypes=[object])(returned)
    assert returned.tolist() == array.tolist()


def test_nested_json_data_and_flat_json_data_are_the_same_tensor() -> None:
    flat = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]}]}
    nested = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]
    }
    a = codec.parse_request(json.dumps(flat).encode(), None).inputs[0][1]
    b = codec.parse_request(json.dumps(nested).encode(), None).inputs[0][1]
    assert a.dtype == np.float32 and a.tolist() == b.tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    "document, length, words",
    [
        (b"not json", None, "not valid JSON"),
        (b"[]", None, "JSON object"),
        (b'{"inputs": []}', None, "inputs: a non-empty list"),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3]}]}',
            None,
            "inputs[0].data: 3 elements given for shape [1, 4]",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "BF16", "shape": [1], "data": [1]}]}',
            None,
            "datatype 'BF16'",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}]}',
            None,
            "inputs[0].shape",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [300]}]}',
            None,
            "do not fit INT8",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ["a"]}]}',
            None,
            "must be numbers",
        ),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}', None, "inputs[0]: data"),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}, '
            b'{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}',
            None,
            "given twice",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]}abcd',
            "4 at the end",
            "binary_data_size 8 runs past",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 4}}]}abcd',
            "4 at the end",
            "its binary data is 4 bytes",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}abcd',
            "4 at the end",
            "no input claims",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [4294967296, 4294967296], "data": []}]}',
            None,
            "declares more than",
        ),
        (b"{}", "999", "Inference-Header-Content-Length"),
    ],
)
def test_malformed_requests_are_refused_naming_the_field(
    document: bytes, length: str | None, words: str
) -> None:
    if length == "4 at the end":  # the JSON, then 4 bytes of tensor data
        length = str(len(document) - 4)
    with pytest.raises(ValidationError) as refused:
        codec.parse_request(document, length)
    assert words in refused.value.message


def test_a_container_reads_one_tensor_as_npy_or_csv_and_several_by_name() -> None:
    rows = np.array([[5.1, 3.5], [6.7, 3.0]], dtype=np.float32)
    one = codec.InferRequest([("x", rows)])
    body, kind = codec.container_body(one, NPY)
    assert kind == NPY and np.load(io.BytesIO(body), allow_pickle=False).tolist() == rows.tolist()
    body, kind = codec.container_body(one, CSV)
    assert (
        kind == CSV
        and np.loadtxt(io.StringIO(body.decode()), delimiter=",").tolist() == rows.tolist()
    )
    body, kind = codec.container_body(one, JSON)
    assert kind == JSON and np.asarray(json.loads(body), dtype=np.float32).tolist() == rows.tolist()
    two = codec.InferRequest([("a", rows), ("b", np.array([1, 2], dtype=np.int64))])
    body, kind = codec.container_body(two, NPY)
    assert kind == JSON and json.loads(body) == {
        "inputs": {"a": [[5.1, 3.5], [6.7, 3.0]], "b": [1, 2]}
    }  # float32's shortest
    text = codec.InferRequest([("words", np.array([b"hi", b"there"], dtype=object))])
    assert codec.container_body(text, NPY) == (b'["hi","there"]', JSON)


@pytest.mark.parametrize(
    "body, content_type, names, expected",
    [
        (None, NPY, ["probabilities"], {"probabilities": [[0.25, 0.75]]}),
        (b"0.5\n0.25\n", CSV, [], {"output-0": [0.5, 0.25]}),
        (
            b'{"labels": ["setosa"], "scores": [0.9]}',
            JSON,
            [],
            {"labels": [b"setosa"], "scores": [0.9]},
        ),
        (b'{"outputs": {"a": [1], "b": [2]}}', JSON, [], {"a": [1], "b": [2]}),
        (
            b"[[1, 2], [3, 4]]",
            "application/json; charset=utf-8",
            [],
            {"output-0": [[1, 2], [3, 4]]},
        ),
        (b'[{"score": 0.5}]', JSON, [], {"output-0": [b'[{"score": 0.5}]']}),
        (b"plain words", "text/plain", ["y"], {"y": [b"plain words"]}),
    ],
)
def test_a_containers_answer_becomes_named_outputs(body, content_type, names, expected) -> None:
    if body is None:
        buffer = io.BytesIO()
        np.save(buffer, np.array([[0.25, 0.75]]))
        body = buffer.getvalue()
    outputs = codec.answer_tensors(body, content_type, names)
    assert {name: array.tolist() for name, array in outputs} == expected


def test_requested_outputs_choose_and_order_and_each_says_if_it_is_binary() -> None:
    request = codec.InferRequest(
        [("x", np.zeros(1))],
        outputs=[codec.RequestedOutput("b", True), codec.RequestedOutput("a", False)],
    )
    chosen = codec.chosen_outputs("ep", request, [("a", np.array([1])), ("b", np.array([2.5]))])
    answer, headers = codec.encode_response("ep", None, request, chosen)
    result = triton_result(answer, headers)
    assert [output["name"] for output in result.get_response()["outputs"]] == ["b", "a"]
    assert result.get_output("a")["data"] == [1] and "data" not in result.get_output("b")
    assert result.as_numpy("b").tolist() == [2.5]
    request.outputs = [codec.RequestedOutput("c", None)]
    with pytest.raises(ValidationError, match="'c' is not an output of model ep"):
        codec.chosen_outputs("ep", request, [("a", np.array([1]))])
