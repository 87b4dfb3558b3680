"""A model's tensors as Open Inference metadata: what a stack reads of a loaded model
(`Runtime.model_tensors`), what a container answers the gateway (`Runtime.tensor_signature`), and
what the gateway shows a caller (`open_inference`). The field names are the Open Inference Protocol
v2's (`$metadata_tensor`)."""

from __future__ import annotations

from typing import NotRequired, TypedDict

__all__ = ["ModelTensors", "TensorMetadata", "TensorSignature"]


class TensorMetadata(TypedDict):
    """One tensor: `$metadata_tensor` of the protocol (its gRPC `TensorMetadata`)."""

    name: str
    datatype: str  # a V2 datatype: "FP32", "INT64", "BYTES", ...
    shape: list[int]  # -1: any size


class ModelTensors(TypedDict):
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class TensorSignature(ModelTensors):
    """What a container answers on its signature path: its tensors, and the content types that carry
    one tensor to its model and back."""

    content_type: str
    accept: str
    platform: NotRequired[str]  # the stack's name, added by the container's data port
