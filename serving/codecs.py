"""Content types the default handlers understand: JSON, CSV and NPY.

Decoding never unpickles (`allow_pickle=False`), and every malformed or unsupported
payload becomes a `ValidationError` that names the content type.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import numpy as np

from serving.errors import ValidationError

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
SUPPORTED = (JSON, CSV, NPY)
DEFAULT_ACCEPT = JSON


def media_type(content_type: str | None) -> str:
    """The bare media type: `Text/CSV; charset=utf-8` -> `text/csv`."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def decode(body: bytes, content_type: str | None) -> Any:
    """Turn a request body into Python/NumPy data according to its content type."""
    kind = media_type(content_type)
    try:
        if kind == JSON:
            return json.loads(body)
        if kind == CSV:
            rows = [row for row in csv.reader(io.StringIO(body.decode("utf-8"))) if row]
            return np.array(rows, dtype=np.float64)
        if kind == NPY:
            return np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, UnicodeDecodeError, EOFError) as error:
        raise ValidationError(f"request body is not valid {kind}: {error}") from None
    raise ValidationError(
        f"unsupported content type {content_type or '(none)'!r}; supported: {', '.join(SUPPORTED)}"
    )


def choose_accept(accept: str | None) -> str:
    """The response type for an Accept header (first supported entry, JSON for */*)."""
    if not accept:
        return DEFAULT_ACCEPT
    for entry in accept.split(","):
        kind = media_type(entry)
        if kind in SUPPORTED:
            return kind
        if kind in ("*/*", "application/*"):
            return DEFAULT_ACCEPT
    raise ValidationError(f"unsupported Accept {accept!r}; supported: {', '.join(SUPPORTED)}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


def encode(value: Any, accept: str | None) -> tuple[bytes, str]:
    """Serialize a prediction for the requested Accept type; returns (body, content type)."""
    kind = choose_accept(accept)
    if kind == JSON:
        return json.dumps(_jsonable(value), separators=(",", ":")).encode(), JSON
    array = np.asarray(value)
    if kind == NPY:
        if array.dtype == object:
            raise ValidationError("prediction cannot be encoded as application/x-npy (mixed types)")
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        return buffer.getvalue(), NPY
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in array.reshape(-1, 1) if array.ndim <= 1 else array.reshape(array.shape[0], -1):
        writer.writerow(row.tolist())
    return out.getvalue().encode(), CSV
