"""What AWS's inference toolkits do with a request when the user's script leaves a step to them.

`sagemaker-inference-toolkit` (the PyTorch and multi-model containers) and `sagemaker-containers`
(the scikit-learn container) decode with `decoder.decode` and encode with `encoder.encode`: JSON
through `json.loads` / `json.dumps` (default separators, NumPy values through `tolist`), CSV through
`np.genfromtxt` / `np.savetxt(fmt="%s")`, NPY through `np.load` / `np.save`. A content type they do
not know is `UnsupportedFormatError`, answered with HTTP 415. These functions produce the same
values and bytes, with two safety differences: NPY never unpickles (the toolkit passes
`allow_pickle=True`) and bodies are size- and depth-checked first (`codecs`).
"""

from __future__ import annotations

import io
import json
import textwrap
from typing import Any

import numpy as np

from serving import errors
from serving.protocol import CSV, JSON, NPY
from serving.runtimes import codecs

NPZ = "application/x-npz"
UTF8_TYPES = (JSON, CSV)  # the toolkits hand a user input_fn these as str, everything else as bytes
ANY = "*/*"
ENCODABLE = (JSON, CSV, NPY)


class UnsupportedFormatError(errors.UnsupportedFormatError):
    """The toolkit's error for a content type no decoder/encoder knows, with its message; the
    container answers 415."""

    def __init__(self, content_type: str | None) -> None:
        super().__init__(
            textwrap.dedent(
                f"""Content type {content_type} is not supported by this framework.

            Please implement input_fn to to deserialize the request data or an output_fn to
            serialize the response. For more information, see the SageMaker Python SDK README."""
            )
        )
        self.status_code = self.status
        self.phrase = self.message


def request_data(body: bytes, content_type: str | None) -> bytes | str:
    """The body as the toolkits hand it to `input_fn`: `str` for exactly `application/json` /
    `text/csv`."""
    if content_type in UTF8_TYPES:
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise codecs.ValidationError(
                f"request body is not valid UTF-8 {content_type}: {error}"
            ) from None
    return body


def decode(data: bytes | str, content_type: str | None) -> Any:
    """`sagemaker_inference.decoder.decode`: JSON and CSV to NumPy arrays, NPY, NPZ (sparse)."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    try:
        if content_type == JSON:
            if codecs._too_deep(raw):
                raise ValueError(f"nested more than {codecs.MAX_JSON_DEPTH} levels")
            return np.array(json.loads(raw))
        if content_type == CSV:
            return np.genfromtxt(io.StringIO(raw.decode("utf-8")), delimiter=",")
        if content_type == NPY:
            codecs._check_npy(raw)
            return np.load(io.BytesIO(raw), allow_pickle=False)
        if content_type == NPZ:
            import scipy.sparse

            return scipy.sparse.load_npz(io.BytesIO(raw))
    except (ValueError, UnicodeDecodeError, EOFError, RecursionError, OSError) as error:
        raise codecs.ValidationError(f"request body is not valid {content_type}: {error}") from None
    raise UnsupportedFormatError(content_type)


def _tolist(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return json.JSONEncoder().default(value)


def encode(value: Any, content_type: str) -> bytes | str:
    """`sagemaker_inference.encoder.encode`: JSON and CSV as text, NPY as bytes."""
    if content_type == JSON:
        return json.dumps(value, default=_tolist)
    if content_type == CSV:
        stream = io.StringIO()
        np.savetxt(stream, value, delimiter=",", fmt="%s")
        return stream.getvalue()
    if content_type == NPY:
        array = np.asarray(value)
        if array.dtype == object:
            raise codecs.ValidationError(
                "prediction cannot be encoded as application/x-npy (mixed types)"
            )
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        return buffer.getvalue()
    raise UnsupportedFormatError(content_type)


def parse_accept(accept: str) -> list[str]:
    """`sagemaker_inference.utils.parse_accept`: the entries of an Accept header, spaces removed."""
    return accept.replace(" ", "").split(",")


def first_encodable(accept: str) -> str:
    """The first Accept entry the encoder knows, as the default `output_fn`s pick it."""
    for content_type in parse_accept(accept):
        if content_type in ENCODABLE:
            return content_type
    raise UnsupportedFormatError(accept)


def default_output(prediction: Any, accept: str) -> tuple[bytes | str, str]:
    """The inference toolkit's `default_output_fn`: encoded for the first supported Accept entry."""
    content_type = first_encodable(accept)
    return encode(prediction, content_type), content_type
