"""A V2 inference request in, a container's body out; a container's answer in, a V2 inference
response out.

Containers keep SageMaker's contract (`POST /invocations` with a body and a content type), so a V2
request becomes a body they already read: one numeric input as `application/x-npy` (its dtype and
shape intact, no JSON round trip), BYTES or several inputs as JSON (several: an object of name ->
nested list, which the tensor stacks bind by input name). The answer becomes outputs: an NPY answer
is one tensor, a JSON object one tensor per key, any other JSON value one tensor, and an answer that
is no tensor (mixed JSON, text) one BYTES element holding it.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import numpy as np
import orjson

from serving.errors import ValidationError
from serving.open_inference import datatypes
from serving.protocol import CSV, JSON, NPY, OCTET_STREAM, V2_HEADER_LENGTH
from serving.runtimes.codecs import encode, npy_decode, npy_encode
from serving.runtimes.tensor_metadata import TensorMetadata

DEFAULT_OUTPUT = "output-0"  # the name of a model's one output where the model does not name it


# The protocol's JSON documents this server answers with (Open Inference Protocol v2, REST; gRPC has
# the same fields).
class ServerMetadata(TypedDict):
    """`$metadata_server_response`."""

    name: str
    version: str
    extensions: list[str]


class ModelMetadata(TypedDict):
    """`$metadata_model_response`."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class OutputParameters(TypedDict):
    binary_data_size: int  # the binary tensor extension: the output's bytes follow the JSON


class ResponseOutput(TypedDict):
    """`$response_output`: one output tensor, its `data` inline or its bytes after the JSON
    (`parameters`)."""

    name: str
    datatype: str
    shape: list[int]
    parameters: NotRequired[OutputParameters]
    # flat, row-major: numbers as the array (orjson writes it), BYTES as text
    data: NotRequired[np.ndarray | list[str]]


class ResponseNames(TypedDict, total=False):
    model_version: str
    id: str  # the request's


class InferResponse(ResponseNames):
    """`$inference_response`."""

    model_name: str
    outputs: list[ResponseOutput]


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool | None  # its `parameters.binary_data`; None: the request's `binary_data_output`


@dataclass
class InferRequest:
    """A parsed V2 inference request: its inputs as arrays, in the order given."""

    inputs: list[tuple[str, np.ndarray]]
    id: str | None = None
    outputs: list[RequestedOutput] = field(default_factory=list)  # empty: every output
    binary_output: bool = False  # `parameters.binary_data_output`


def parse_request(body: bytes, header_length: str | None) -> InferRequest:
    """The request's JSON (with the binary tensor extension: the first `header_length` bytes) and
    its tensors."""
    raw = memoryview(body)
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise ValidationError(
                f"{V2_HEADER_LENGTH} {header_length!r} is not a length within the body's {len(body)}"
            )
        split = int(header_length)
        head, binary = raw[:split], raw[split:]
    else:
        head, binary = raw, raw[len(raw) :]
    try:
        document = orjson.loads(head)
    except orjson.JSONDecodeError as error:
        raise ValidationError(f"the inference request is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise ValidationError("the inference request must be a JSON object")
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ValidationError("inputs: a non-empty list of tensors is required")
    parsed: list[tuple[str, np.ndarray]] = []
    offset = 0
    for index, tensor in enumerate(inputs):
        where = f"inputs[{index}]"
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise ValidationError(
                f"{where}: an object with a name, a datatype and a shape is required"
            )
        name = tensor["name"]
        if any(name == seen for seen, _ in parsed):
            raise ValidationError(f"{where}: input {name!r} is given twice")
        shape = datatypes.checked_shape(tensor.get("shape"), f"{where}.shape")
        datatype = str(tensor.get("datatype"))
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise ValidationError(
                    f"{where}.parameters.binary_data_size {size!r} runs past the request's body"
                )
            array = datatypes.from_binary(
                binary[offset : offset + size], datatype, shape, f"{where}"
            )
            offset += size
        elif "data" in tensor:
            array = datatypes.from_json(tensor["data"], datatype, shape, f"{where}.data")
        else:
            raise ValidationError(f"{where}: data (or parameters.binary_data_size) is required")
        parsed.append((name, array))
    if offset != len(binary):
        raise ValidationError(
            f"the body carries {len(binary) - offset} bytes of binary data that no input claims"
        )
    parameters = document.get("parameters") or {}
    request_id = document.get("id")
    return InferRequest(
        parsed,
        id=request_id if isinstance(request_id, str) else None,
        outputs=_requested(document.get("outputs")),
        binary_output=bool(parameters.get("binary_data_output", False))
        if isinstance(parameters, dict)
        else False,
    )


def _requested(outputs: Any) -> list[RequestedOutput]:
    if outputs is None:
        return []
    if not isinstance(outputs, list):
        raise ValidationError("outputs: a list of {name} objects is expected")
    requested = []
    for index, output in enumerate(outputs):
        if not isinstance(output, dict) or not isinstance(output.get("name"), str):
            raise ValidationError(f"outputs[{index}]: an object with a name is required")
        binary = (output.get("parameters") or {}).get("binary_data")
        requested.append(RequestedOutput(output["name"], None if binary is None else bool(binary)))
    return requested


def container_body(request: InferRequest, body_type: str) -> tuple[bytes, str]:
    """The body (and its content type) a container reads the request's inputs from; `body_type`:
    what it reads one numeric tensor as (its signature's `content_type`: NPY, CSV, or JSON)."""
    if len(request.inputs) == 1 and request.inputs[0][1].dtype != object:
        array = request.inputs[0][1]
        if body_type == NPY:
            return npy_encode(array), NPY
        if body_type == CSV and array.ndim <= 2:
            return encode(array, CSV)  # the rows a CSV answer of this server's stacks carries
    values = {name: _jsonable(array) for name, array in request.inputs}
    # several inputs: TF Serving's columnar document, which every stack reads by input name
    document = next(iter(values.values())) if len(values) == 1 else {"inputs": values}
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY), JSON


def _jsonable(array: np.ndarray) -> Any:
    if array.dtype == object:
        return (
            [item.decode("utf-8", "replace") for item in array.reshape(-1)]
            if array.ndim <= 1
            else [_jsonable(row) for row in array]
        )
    return np.ascontiguousarray(array)


def answer_tensors(
    body: bytes, content_type: str | None, names: list[str]
) -> list[tuple[str, np.ndarray]]:
    """A container's answer as named outputs; `names`: the model's declared outputs (one answer
    takes the first)."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    kind = JSON if kind.endswith("+json") else kind
    single = names[0] if len(names) == 1 else DEFAULT_OUTPUT
    if kind == NPY:
        try:
            return [(single, npy_decode(body))]
        except ValueError:
            pass  # not an array NumPy reads without pickles: passed on as bytes below
    elif kind == CSV:
        try:
            return [(single, np.loadtxt(io.StringIO(body.decode()), delimiter=",", ndmin=1))]
        except ValueError:
            pass  # not numbers: passed on as bytes below
    elif kind == JSON:
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            value = None
        if (
            isinstance(value, dict)
            and list(value) == ["outputs"]
            and isinstance(value["outputs"], dict)
        ):
            value = next(iter(value.values()))  # TF Serving's {"outputs": {name: ...}}
        if isinstance(value, dict) and value:
            return [(str(key), _tensor(item)) for key, item in value.items()]
        if value is not None:
            return [(single, _tensor(value))]
    return [(single, _one_element(body))]


def _tensor(value: Any) -> np.ndarray:
    """A JSON value as a tensor: numbers or strings of a rectangular shape; anything else its JSON
    text."""
    try:
        array = np.asarray(value)
    except ValueError:  # ragged
        array = np.asarray(None, dtype=object)
    if array.dtype.kind in "biuf":
        return array
    if array.dtype.kind == "U":
        return (
            np.vectorize(str.encode, otypes=[object])(array) if array.size else array.astype(object)
        )
    return _one_element(json.dumps(value).encode())


def _one_element(data: bytes) -> np.ndarray:
    array = np.empty(1, dtype=object)
    array[0] = data
    return array


def chosen_outputs(
    model: str, request: InferRequest, outputs: list[tuple[str, np.ndarray]]
) -> list[tuple[str, np.ndarray, bool | None]]:
    """The outputs the request asked for (all when it names none), each with its `binary_data`
    choice."""
    if not request.outputs:
        return [(name, array, None) for name, array in outputs]
    by_name = dict(outputs)
    missing = [wanted.name for wanted in request.outputs if wanted.name not in by_name]
    if missing:
        raise ValidationError(
            f"outputs: {', '.join(repr(m) for m in missing)} is not an output of model {model} "
            f"(its outputs: {', '.join(by_name)})"
        )
    return [(wanted.name, by_name[wanted.name], wanted.binary) for wanted in request.outputs]


def encode_response(
    model: str,
    version: str | None,
    request: InferRequest,
    chosen: list[tuple[str, np.ndarray, bool | None]],
) -> tuple[bytes, dict[str, str]]:
    """The V2 inference response (JSON, with binary outputs after it where asked) and its
    headers."""
    documents: list[ResponseOutput] = []
    blobs = []
    for name, array, binary in chosen:
        tensor: ResponseOutput = {
            "name": name,
            "datatype": datatypes.datatype_of(array),
            "shape": list(array.shape),
        }
        if request.binary_output if binary is None else binary:
            blob = datatypes.to_binary(array)
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            tensor["data"] = datatypes.to_json(array)
        documents.append(tensor)
    named: ResponseNames = {}
    if version is not None:
        named["model_version"] = version
    if request.id is not None:
        named["id"] = request.id
    response: InferResponse = {"model_name": model, **named, "outputs": documents}
    head = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return head, {"content-type": JSON}
    return b"".join([head, *blobs]), {
        "content-type": OCTET_STREAM,
        V2_HEADER_LENGTH: str(len(head)),
    }
