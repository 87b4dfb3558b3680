"""V2 gRPC messages in and out: a ModelInferRequest's tensors as arrays, outputs as raw contents,
metadata.

Inputs come as typed contents (the repeated field of their datatype) or as `raw_input_contents` (one
bytes value per input, laid out as the binary tensor extension's); outputs always leave as
`raw_output_contents`, as Triton's server answers, which every V2 gRPC client reads. Every malformed
message is a `ValidationError` naming the field.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from serving.errors import ValidationError
from serving.open_inference import datatypes
from serving.open_inference import grpc_messages_pb2 as pb
from serving.open_inference.codec import InferRequest, ModelMetadata, RequestedOutput
from serving.runtimes.tensor_metadata import TensorMetadata

# The InferTensorContents field that carries each datatype (FP16 has none: raw contents only)
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parse(message_type: Any, raw: bytes) -> Any:
    """A request message from its bytes, or a ValidationError naming the message."""
    try:
        return message_type.FromString(raw)
    except DecodeError:
        raise ValidationError(f"the {message_type.__name__} message could not be parsed") from None


def infer_request(message: pb.ModelInferRequest) -> InferRequest:
    """The message's inputs as arrays, in its order, with its id and requested outputs."""
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise ValidationError(
            f"raw_input_contents: {len(raw)} values for {len(message.inputs)} inputs (one per input, in order)"
        )
    if not message.inputs:
        raise ValidationError("inputs: at least one tensor is required")
    inputs: list[tuple[str, np.ndarray]] = []
    for index, tensor in enumerate(message.inputs):
        where = f"inputs[{index}]"
        if any(tensor.name == seen for seen, _ in inputs):
            raise ValidationError(f"{where}: input {tensor.name!r} is given twice")
        shape = datatypes.checked_shape(list(tensor.shape), f"{where}.shape")
        if raw:
            if tensor.HasField("contents"):
                raise ValidationError(f"{where}: contents and raw_input_contents are both given")
            array = datatypes.from_binary(
                memoryview(raw[index]), tensor.datatype, shape, f"raw_input_contents[{index}]"
            )
        else:
            array = _from_contents(tensor, shape, where)
        inputs.append((tensor.name, array))
    outputs = [RequestedOutput(output.name, None) for output in message.outputs]
    return InferRequest(inputs, id=message.id or None, outputs=outputs)


def _from_contents(
    tensor: pb.ModelInferRequest.InferInputTensor, shape: tuple[int, ...], where: str
) -> np.ndarray:
    dtype = datatypes.dtype_of(tensor.datatype, f"{where}.datatype")
    field = _CONTENTS.get(tensor.datatype)
    if field is None:
        raise ValidationError(
            f"{where}: {tensor.datatype} has no typed contents: send it in raw_input_contents"
        )
    values = getattr(tensor.contents, field)
    if len(values) != math.prod(shape):
        raise ValidationError(
            f"{where}.contents.{field}: {len(values)} elements given for shape {list(shape)} ({math.prod(shape)})"
        )
    if tensor.datatype == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    try:
        return np.array(values, dtype=dtype).reshape(shape)
    except OverflowError:
        raise ValidationError(
            f"{where}.contents.{field}: a value is out of {tensor.datatype}'s range"
        ) from None


def infer_response(
    model: str,
    version: str | None,
    request: InferRequest,
    outputs: list[tuple[str, np.ndarray, bool | None]],
) -> bytes:
    """The ModelInferResponse of the chosen outputs, their data in `raw_output_contents`."""
    response = pb.ModelInferResponse(
        model_name=model, model_version=version or "", id=request.id or ""
    )
    for name, array, _ in outputs:
        response.outputs.add(name=name, datatype=datatypes.datatype_of(array), shape=array.shape)
        response.raw_output_contents.append(datatypes.to_binary(array))
    return response.SerializeToString()


def metadata_response(document: ModelMetadata) -> bytes:
    """The ModelMetadataResponse of the document REST answers."""

    def tensors(items: list[TensorMetadata]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
        return [
            pb.ModelMetadataResponse.TensorMetadata(
                name=t["name"], datatype=t["datatype"], shape=t["shape"]
            )
            for t in items
        ]

    return pb.ModelMetadataResponse(
        name=document["name"],
        versions=document["versions"],
        platform=document["platform"],
        inputs=tensors(document["inputs"]),
        outputs=tensors(document["outputs"]),
    ).SerializeToString()
