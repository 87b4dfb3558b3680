"""AWS event-stream messages (`application/vnd.amazon.eventstream`), as
InvokeEndpointWithResponseStream sends them.

botocore ships the parser (`botocore.eventstream.EventStreamBuffer`) but no encoder, and the
maintained encoder (`awscrt`) is a native library whose Python API exposes it only inside its RPC
client; the framing is small and documented, so it is written here. A message: a prelude (total
length, headers length, CRC32 of those 8 bytes), the headers (name length, name, value type 7 =
string, value length, value), the payload, and a CRC32 of all that precedes it, integers big-endian.
Used both by a container answering a streaming hop and by the gateway answering the caller, so the
hop carries SageMaker's own framing. No web framework here.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable

from serving.protocol import (
    JSON,
    OCTET_STREAM,
    STREAM_ERROR_CODE,
    STREAM_FAILURE_EVENT,
    STREAM_MODEL_ERROR_EVENT,
    STREAM_PAYLOAD_EVENT,
)

_STRING = 7  # header value type: a UTF-8 string with a 2-byte length
MAX_HEADERS_LENGTH = 128 * 1024  # botocore's parser refuses more
MAX_PAYLOAD_LENGTH = 24 * 1024 * 1024  # ... and refuses a larger payload: longer parts are split


def encode_message(headers: Iterable[tuple[str, str]], payload: bytes) -> bytes:
    """One event-stream message with string headers."""
    encoded = bytearray()
    for name, value in headers:
        key, text = name.encode(), value.encode()
        encoded += struct.pack(">B", len(key)) + key + struct.pack(">BH", _STRING, len(text)) + text
    if len(encoded) > MAX_HEADERS_LENGTH or len(payload) > MAX_PAYLOAD_LENGTH:
        raise ValueError("event-stream message too large")
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + bytes(encoded) + payload
    return message + struct.pack(">I", zlib.crc32(message))


def payload_parts(data: bytes) -> list[bytes]:
    """`PayloadPart` events carrying `data` (one, or several when it exceeds a message's payload
    limit)."""
    headers = (
        (":event-type", STREAM_PAYLOAD_EVENT),
        (":content-type", OCTET_STREAM),
        (":message-type", "event"),
    )
    view = memoryview(data)
    pieces = [
        view[at : at + MAX_PAYLOAD_LENGTH] for at in range(0, len(data), MAX_PAYLOAD_LENGTH)
    ] or [view]
    return [encode_message(headers, bytes(piece)) for piece in pieces]


def model_stream_error(error_code: str, message: str) -> bytes:
    """A `ModelStreamError` exception event: the model's stream failed after it began (botocore
    raises it)."""
    return _exception(STREAM_MODEL_ERROR_EVENT, {"Message": message, STREAM_ERROR_CODE: error_code})


def internal_stream_failure(message: str) -> bytes:
    """An `InternalStreamFailure` exception event: the endpoint itself failed mid-stream."""
    return _exception(STREAM_FAILURE_EVENT, {"Message": message})


def _exception(kind: str, document: dict[str, str]) -> bytes:
    headers = ((":exception-type", kind), (":content-type", JSON), (":message-type", "exception"))
    return encode_message(headers, json.dumps(document).encode())
