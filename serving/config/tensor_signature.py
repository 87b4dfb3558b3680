"""A container's declared tensor signature (its TENSOR_SIGNATURE_ENV variable), checked when the
spec is read: Open Inference metadata shows it as given."""

from __future__ import annotations

import json

from serving.protocol import TENSOR_SIGNATURE_ENV, V2_DATATYPES

__all__ = ["check_tensor_signature"]


def check_tensor_signature(declared: str) -> None:
    """Refuse a TENSOR_SIGNATURE_ENV that Open Inference metadata could not show: JSON `{"inputs":
    [...], "outputs": [...]}`, each tensor `{"name": str, "datatype": a V2 datatype, "shape": [int
    >= -1, ...]}`."""
    try:
        document = json.loads(declared)
    except ValueError as error:
        raise ValueError(f"Environment {TENSOR_SIGNATURE_ENV} is not JSON: {error}") from None
    if not isinstance(document, dict) or not set(document) <= {"inputs", "outputs"}:
        raise ValueError(
            f'Environment {TENSOR_SIGNATURE_ENV} must be {{"inputs": [...], "outputs": [...]}}'
        )
    for side, tensors in document.items():
        for index, tensor in enumerate(tensors if isinstance(tensors, list) else [None]):
            where = f"Environment {TENSOR_SIGNATURE_ENV} {side}[{index}]"
            if not isinstance(tensor, dict) or set(tensor) != {"name", "datatype", "shape"}:
                raise ValueError(f'{where}: {{"name", "datatype", "shape"}} expected')
            shape = tensor["shape"]
            if not isinstance(tensor["name"], str) or tensor["datatype"] not in (
                *V2_DATATYPES,
                "BF16",
            ):
                raise ValueError(
                    f"{where}: a name and one of the datatypes {', '.join(V2_DATATYPES)}, BF16"
                )
            if not isinstance(shape, list) or not all(type(d) is int and d >= -1 for d in shape):
                raise ValueError(f"{where}: shape must be a list of integers, -1 for any size")
