"""TensorFlow Serving's REST JSON, byte for byte: the `:predict` request it reads and the answer it
writes.

TF Serving (`tensorflow_serving/util/json_tensor.cc`) writes its answers with rapidjson's
PrettyWriter (4-space indent, arrays of one instance on one line in the row format, every value on
its own line in the columnar format) and its own float formatting (`%g`, then full precision when
that does not round trip, `.0` appended to whole numbers). `PrettyJson` replays that writer so that
a client comparing bytes sees what TF Serving sends. Outputs are written in name order (TF Serving's
order is that of a protobuf map, which is unspecified).
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np

INSTANCES, INPUTS, SIGNATURE = "instances", "inputs", "signature_name"
PREDICTIONS, OUTPUTS = "predictions", "outputs"
ROW, COLUMNAR = "row", "columnar"
BYTES_SUFFIX = "_bytes"  # a string output named so is written as {"b64": ...}


class TfsRequestError(ValueError):
    """The request is not one TF Serving's `:predict` accepts (it answers 400 with this text)."""


class PrettyJson:
    """rapidjson's PrettyWriter, as TF Serving drives it: values are pre-formatted JSON tokens."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.levels: list[list[Any]] = []  # [in_array, values so far]
        self.single_line = False  # rapidjson's kFormatSingleLineArray

    def _indent(self) -> None:
        self.parts.append(" " * 4 * len(self.levels))

    def _prefix(self) -> None:
        if not self.levels:
            return
        level = self.levels[-1]
        if level[0]:
            if level[1]:
                self.parts.append(", " if self.single_line else ",")
            if not self.single_line:
                self.parts.append("\n")
                self._indent()
        else:
            if level[1]:
                self.parts.append(",\n" if level[1] % 2 == 0 else ": ")
            else:
                self.parts.append("\n")
            if level[1] % 2 == 0:
                self._indent()
        level[1] += 1

    def value(self, token: str) -> None:
        self._prefix()
        self.parts.append(token)

    def start(self, array: bool) -> None:
        self._prefix()
        self.parts.append("[" if array else "{")
        self.levels.append([array, 0])

    def end(self) -> None:
        array, count = self.levels.pop()
        if count and (not array or not self.single_line):
            self.parts.append("\n")
            self._indent()
        self.parts.append("]" if array else "}")

    def text(self) -> bytes:
        return "".join(self.parts).encode("utf-8", "surrogateescape")


def string_token(text: str | bytes) -> str:
    """A JSON string as rapidjson writes it: control characters escaped (upper-case hex), the rest
    raw UTF-8."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    short = {
        '"': '\\"',
        "\\": "\\\\",
        "\b": "\\b",
        "\f": "\\f",
        "\n": "\\n",
        "\r": "\\r",
        "\t": "\\t",
    }
    out = []
    for char in text:
        if char in short:
            out.append(short[char])
        elif ord(char) < 0x20:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def decimal_token(value: float, single: bool) -> str:
    """TF Serving's WriteDecimal: six significant digits unless that loses the value, `.0` on whole
    numbers."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "-Infinity" if value < 0 else "Infinity"
    text = "%g" % value
    back = float(np.float32(float(text))) if single else float(text)
    if back != value:
        text = "%.*g" % (9 if single else 17, value)
    if "." not in text and "e" not in text:
        text += ".0"
    return text


def _write_values(writer: PrettyJson, array: np.ndarray, as_b64: bool) -> None:
    if array.ndim:
        writer.start(True)
        for item in array:
            _write_values(writer, np.asarray(item, dtype=array.dtype), as_b64)
        writer.end()
        return
    value = array.item()
    kind = array.dtype.kind
    if kind == "f":
        writer.value(decimal_token(float(value), array.dtype.itemsize <= 4))
    elif kind == "b":
        writer.value("true" if value else "false")
    elif kind in "iu":
        writer.value(str(int(value)))
    elif as_b64:
        raw = value if isinstance(value, bytes) else str(value).encode()
        writer.start(False)
        writer.value(string_token("b64"))
        writer.value(string_token(base64.b64encode(raw).decode()))
        writer.end()
    else:
        writer.value(string_token(value if isinstance(value, (bytes, str)) else str(value)))


def predictions_json(outputs: dict[str, np.ndarray]) -> bytes:
    """The row-format answer `{"predictions": [...]}`: one entry per instance, an object when
    several outputs."""
    batch = -1
    for name, array in outputs.items():
        if array.ndim == 0:
            raise TfsRequestError(f"Tensor name: {name} has no shape information ")
        if batch >= 0 and array.shape[0] != batch:
            raise TfsRequestError(
                f"Tensor name: {name} has inconsistent batch size: {array.shape[0]} expecting: {batch}"
            )
        batch = array.shape[0]
    writer = PrettyJson()
    writer.start(False)
    writer.value(string_token(PREDICTIONS))
    writer.start(True)
    several = len(outputs) > 1
    for item in range(batch):
        if several:
            writer.start(False)
        writer.single_line = True
        for name, array in outputs.items():
            if several:
                writer.value(string_token(name))
            _write_values(
                writer, array[item], name.endswith(BYTES_SUFFIX) and array.dtype.kind in "SOU"
            )
        writer.single_line = False
        if several:
            writer.end()
    writer.end()
    writer.end()
    return writer.text()


def outputs_json(outputs: dict[str, np.ndarray]) -> bytes:
    """The columnar answer `{"outputs": ...}`: the whole tensor, or an object of tensors by name."""
    writer = PrettyJson()
    writer.start(False)
    writer.value(string_token(OUTPUTS))
    several = len(outputs) > 1
    if several:
        writer.start(False)
    for name, array in outputs.items():
        if several:
            writer.value(string_token(name))
        _write_values(writer, array, name.endswith(BYTES_SUFFIX) and array.dtype.kind in "SOU")
    if several:
        writer.end()
    writer.end()
    return writer.text()


def error_json(message: str) -> bytes:
    """TF Serving's error answer `{"error": ...}`."""
    writer = PrettyJson()
    writer.start(False)
    writer.value(string_token("error"))
    writer.value(string_token(message))
    writer.end()
    return writer.text()


def parse_predict(body: bytes) -> tuple[str, Any, str | None]:
    """(format, inputs, signature name) of a `:predict` body; `inputs` as `tensors.bind_inputs`
    takes them."""
    if not body.strip():
        raise TfsRequestError("JSON Parse error: The document is empty")
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise TfsRequestError(f"JSON Parse error: {error}") from None
    if not isinstance(document, dict):
        raise TfsRequestError(f"JSON Value: {json.dumps(document)} Is not object")
    signature = document.get(SIGNATURE)
    if signature is not None and not isinstance(signature, str):
        raise TfsRequestError(
            f"JSON Value: {json.dumps(document)} not formatted correctly. 'signature_name' key must be a string value."
        )
    if INSTANCES in document and INPUTS in document:
        raise TfsRequestError(
            f"JSON Value: {json.dumps(document)} Not formatted correctly expecting only one of 'inputs' or "
            "'instances' keys to exist "
        )
    if INSTANCES in document:
        instances = document[INSTANCES]
        if not isinstance(instances, list):
            raise TfsRequestError(
                f"JSON Value: {json.dumps(document)} Excepting 'instances' to be an list/array"
            )
        if not instances:
            raise TfsRequestError(
                f"JSON Value: {json.dumps(document)} No values in 'instances' array"
            )
        if all(isinstance(row, dict) and not _is_b64(row) for row in instances):
            names = list(instances[0])
            for number, row in enumerate(instances):
                if sorted(row) != sorted(names):
                    raise TfsRequestError(
                        f"Failed to process element: {number} of 'instances' list. JSON object: "
                        f"{json.dumps(row)} keys must be equal to: {','.join(sorted(names))}"
                    )
            return ROW, {name: [row[name] for row in instances] for name in names}, signature
        if any(isinstance(row, dict) and not _is_b64(row) for row in instances):
            raise TfsRequestError("Expecting value/list but got object in 'instances' list")
        return ROW, instances, signature
    if INPUTS in document:
        return COLUMNAR, document[INPUTS], signature
    raise TfsRequestError("Missing 'inputs' or 'instances' key")


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


__all__ = [
    "COLUMNAR",
    "ROW",
    "PrettyJson",
    "TfsRequestError",
    "decimal_token",
    "error_json",
    "outputs_json",
    "parse_predict",
    "predictions_json",
    "string_token",
]
