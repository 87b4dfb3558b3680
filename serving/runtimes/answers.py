"""What a user's hook may return, made into an answer: bytes and a content type, the way SageMaker's
model servers take it (bytes or str, `(body, content_type)`, a Flask-style response, a NumPy array,
a list or dict), or a stream of such parts from a generator."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from serving.runtimes import codecs, toolkit
from serving.runtimes.context import InvocationContext

__all__ = ["answer_chunks", "is_stream", "normalize"]


def answer_chunks(
    result: Any, accept: str, context: InvocationContext
) -> tuple[Iterator[bytes], str]:
    """A hook's result as the chunks of its answer (one, unless it is a stream) and their content
    type."""
    if is_stream(result):
        parts = (normalize(item, accept, context) for item in result)
        return _chunks(parts), context.response_content_type or _first_type(accept)
    body, response_type = normalize(result, accept, context)
    return iter((body,)), response_type


def is_stream(value: Any) -> bool:
    """A generator or other one-shot iterator (not a container like a list, an array or a
    string)."""
    return isinstance(value, Iterator) and not isinstance(
        value, (str, bytes, bytearray, memoryview)
    )


def _chunks(parts: Iterable[tuple[bytes, str]]) -> Iterator[bytes]:
    for body, _ in parts:
        if body:
            yield body


def _first_type(accept: str) -> str:
    return toolkit.parse_accept(accept)[0] if accept else codecs.DEFAULT_ACCEPT


def normalize(result: Any, accept: str, context: InvocationContext) -> tuple[bytes, str]:
    """What a hook returned, as (body, content type), the way SageMaker's model servers take it:
    bytes or str; `(body, content_type)`; a Flask-style response (`worker.Response`: body, mimetype,
    status); a NumPy array (encoded for the Accept); a list or dict (JSON, as MMS serializes it)."""
    content_type = context.response_content_type or accept
    if isinstance(result, tuple) and len(result) == 2:
        result, content_type = result
    elif _is_response(result):
        content_type = (
            getattr(result, "mimetype", None)
            or getattr(result, "content_type", None)
            or content_type
        )
        status = getattr(result, "status_code", 200)
        if isinstance(status, int) and status != 200:
            context.set_response_status(status)
        result = result.get_data() if callable(getattr(result, "get_data", None)) else result.body
    if isinstance(result, (np.ndarray, np.generic)):
        encoded, content_type = toolkit.default_output(result, content_type)
        result = encoded
    elif isinstance(result, (list, dict)):
        result = json.dumps(result, indent=2, default=lambda value: value.tolist())
    if isinstance(result, str):
        result = result.encode()
    if not isinstance(result, (bytes, bytearray, memoryview)):
        raise TypeError(
            "output_fn must return bytes, str, (body, content_type), a response object, a NumPy array, a list "
            f"or a dict; got {type(result).__name__}"
        )
    return bytes(result), str(content_type)


def _is_response(value: Any) -> bool:
    return (callable(getattr(value, "get_data", None)) or hasattr(value, "body")) and (
        hasattr(value, "mimetype") or hasattr(value, "content_type")
    )
