"""V2 tensors as NumPy arrays and back: JSON `data` (row-major, flat or nested) and the binary
tensor extension.

A BYTES tensor is an object array of `bytes` here; in JSON its elements are strings, in binary each
element is a 4-byte little-endian length and its bytes (Triton's layout). Every malformed tensor is
a `ValidationError` naming the field (`inputs[0].data`, ...), found before anything large is
allocated: an element count is checked against the shape before data is read.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from serving.errors import ValidationError
from serving.protocol import V2_DATATYPES

# a shape that declares more elements than this is refused before data is read
MAX_ELEMENTS = 1 << 28


def dtype_of(datatype: str, field: str) -> np.dtype:
    """The NumPy dtype of a V2 datatype; an unknown one (BF16 among them: NumPy has none) is refused
    by name."""
    name = V2_DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if name is None:
        raise ValidationError(
            f"{field}: datatype {datatype!r} is not supported; supported: {', '.join(V2_DATATYPES)}"
        )
    return np.dtype(name)


def datatype_of(array: np.ndarray) -> str:
    """The V2 datatype of an array (text and bytes: BYTES)."""
    if array.dtype.kind in "USO":
        return "BYTES"
    for datatype, name in V2_DATATYPES.items():
        if name != "object" and array.dtype == np.dtype(name):
            return datatype
    raise ValidationError(f"an output of dtype {array.dtype} has no V2 datatype")


def checked_shape(shape: Any, field: str) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ValidationError(
            f"{field}: shape must be a list of non-negative integers, got {shape!r}"
        )
    if math.prod(shape) > MAX_ELEMENTS:
        raise ValidationError(f"{field}: shape {shape} declares more than {MAX_ELEMENTS} elements")
    return tuple(shape)


def from_json(data: Any, datatype: str, shape: tuple[int, ...], field: str) -> np.ndarray:
    """An input's JSON `data` (flat or nested, row-major) as an array of its datatype and shape.

    NumPy converts the whole list at once (C speed: a 1 MB tensor's JSON is 260,000 numbers); what
    it would let pass silently is refused after: text where numbers belong, fractions in an integer
    tensor, values outside its range."""
    dtype = dtype_of(datatype, field)
    if not isinstance(data, list):
        raise ValidationError(f"{field}: data must be a list")
    try:
        given = np.array(data, dtype=object if datatype == "BYTES" else None)
    except ValueError as error:  # ragged nesting
        raise ValidationError(f"{field}: data is not a rectangular array: {error}") from None
    if given.size != math.prod(shape):
        raise ValidationError(
            f"{field}: {given.size} elements given for shape {list(shape)} ({math.prod(shape)})"
        )
    if datatype == "BYTES":
        flat = given.reshape(-1)
        if not all(isinstance(item, str) for item in flat):
            raise ValidationError(f"{field}: BYTES elements must be strings in JSON")
        array = np.empty(flat.size, dtype=object)
        array[:] = [item.encode() for item in flat]
        return array.reshape(shape)
    allowed = {"b": "b", "u": "bui", "i": "bui", "f": "buif"}[dtype.kind]
    if given.size and given.dtype.kind not in allowed:
        raise ValidationError(f"{field}: {datatype} elements must be {_KIND_WORDS[dtype.kind]}")
    if dtype.kind in "iu" and given.size:
        bounds = np.iinfo(dtype)
        if given.min() < bounds.min or given.max() > bounds.max:
            raise ValidationError(
                f"{field}: elements do not fit {datatype} ({bounds.min} to {bounds.max})"
            )
    return given.astype(dtype, copy=False).reshape(shape)


_KIND_WORDS = {"b": "true or false", "u": "integers", "i": "integers", "f": "numbers"}


def to_json(array: np.ndarray) -> Any:
    """An output's `data`, flat and row-major: the array itself for numbers (orjson writes it,
    OPT_SERIALIZE_NUMPY), BYTES elements as text."""
    flat = np.ascontiguousarray(array.reshape(-1))
    if array.dtype.kind in "SOU":
        return [_text(item) for item in flat.tolist()]
    return flat


def _text(item: Any) -> str:
    if isinstance(item, bytes):
        try:
            return item.decode()
        except UnicodeDecodeError:
            raise ValidationError(
                "a BYTES output is not UTF-8 text: ask for it as binary data"
            ) from None
    return str(item)


def from_binary(raw: memoryview, datatype: str, shape: tuple[int, ...], field: str) -> np.ndarray:
    """An input's raw bytes (the binary tensor extension; gRPC's raw contents) as an array of its
    datatype and shape."""
    dtype = dtype_of(datatype, field)
    count = math.prod(shape)
    if datatype != "BYTES":
        if len(raw) != count * dtype.itemsize:
            raise ValidationError(
                f"{field}: its binary data is {len(raw)} bytes, shape {list(shape)} of {datatype} needs "
                f"{count * dtype.itemsize}"
            )
        return (
            np.frombuffer(raw, dtype=dtype.newbyteorder("<"))
            .astype(dtype, copy=False)
            .reshape(shape)
        )
    items, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise ValidationError(f"{field}: a BYTES element's 4-byte length is cut short")
        (size,) = struct.unpack_from("<I", raw, offset)
        if offset + 4 + size > len(raw):
            raise ValidationError(
                f"{field}: a BYTES element of {size} bytes runs past the tensor's binary data"
            )
        items.append(bytes(raw[offset + 4 : offset + 4 + size]))
        offset += 4 + size
    if len(items) != count:
        raise ValidationError(
            f"{field}: {len(items)} BYTES elements given for shape {list(shape)} ({count})"
        )
    array = np.empty(count, dtype=object)
    array[:] = items
    return array.reshape(shape)


def to_binary(array: np.ndarray) -> bytes:
    """An output's raw bytes: little-endian, row-major; BYTES elements each after their 4-byte
    length."""
    if array.dtype.kind in "USO":
        parts = []
        for item in array.reshape(-1).tolist():
            data = item if isinstance(item, bytes) else str(item).encode()
            parts += [struct.pack("<I", len(data)), data]
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
