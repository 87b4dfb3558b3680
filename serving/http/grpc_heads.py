"""What a gRPC call's request headers say (`read_head`, as grpcio's servers read them), whether they
refuse the call before its message is read (`refusal`), and the header blocks that answer it (gRPC
over HTTP/2: grpc/doc/PROTOCOL-HTTP2.md)."""

from __future__ import annotations

import base64
from dataclasses import dataclass

from serving.http import h2
from serving.http.grpc_calls import StatusCode

MESSAGE_LIMIT = 4096  # bytes of a status's message sent (grpc-message)
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
ANSWER_HEADERS = h2.STATUS_200 + h2.CONTENT_TYPE_GRPC


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A request's header block as read: the call's parts, and its metadata as grpcio's servers give
    it (every field but the pseudo-headers, content-type, te and gRPC's own `grpc-*`)."""

    method: bytes | None
    path: str
    content_type: bytes
    timeout: float | None
    encoding: bytes | None
    metadata: tuple[tuple[str, str | bytes], ...]


def read_head(fields: h2.Fields) -> RequestHead:
    method = timeout = encoding = None
    path, content_type = "", b""
    metadata: list[tuple[str, str | bytes]] = []
    for name, value in fields:
        if name[:1] == b":":
            if name == b":path":
                path = value.decode("latin-1")
            elif name == b":method":
                method = value
        elif name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout = _timeout(value)
        elif name == b"grpc-encoding":
            encoding = value
        elif name != b"te" and not name.startswith(b"grpc-"):
            key = name.decode("latin-1")
            metadata.append(
                (key, _binary(value) if key.endswith("-bin") else value.decode("latin-1"))
            )
    return RequestHead(method, path, content_type, timeout, encoding, tuple(metadata))


def refusal(
    head: RequestHead, known: bool, full: bool
) -> tuple[int, str, tuple[tuple[str, str], ...]] | None:
    """How a call is answered before its message is read, if it is (its status, message and extra
    trailers; status -1: HTTP 415): `known`, whether its method is served; `full`, whether the
    server runs as many calls as it may."""
    if head.method != b"POST" or not head.content_type.startswith(b"application/grpc"):
        return (-1, "", ())  # not a gRPC call: HTTP 415, as grpcio's servers answer
    if not known:
        return (StatusCode.UNIMPLEMENTED, f"Method not found: {head.path}", ())
    if head.encoding not in (None, b"identity"):
        accept = (("grpc-accept-encoding", "identity"),)
        return (StatusCode.UNIMPLEMENTED, "only identity messages are accepted", accept)
    if full:
        return (StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!", ())
    return None


def _timeout(value: bytes) -> float | None:
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return None  # not gRPC's form: as no deadline (grpcio's servers do the same)
    return int(digits) * unit


def _binary(value: bytes) -> bytes:
    try:
        return base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)
    except ValueError:
        return value


def _percent(message: str) -> bytes:
    """grpc-message's encoding: printable ASCII but `%` as is, every other byte of UTF-8 as %XX."""
    raw = message.encode("utf-8", "replace")[:MESSAGE_LIMIT]
    return b"".join(
        bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte
        for byte in raw
    )


def trailers(code: int, message: str, trailing: tuple[tuple[str, str], ...]) -> bytes:
    block = h2.literal(b"grpc-status", str(code).encode())
    if message:
        block += h2.literal(b"grpc-message", _percent(message))
    for key, value in trailing:
        block += h2.literal(key.lower().encode("latin-1"), value.encode("latin-1", "replace"))
    return block


def status_answer(
    stream: int, code: int, message: str, extra: tuple[tuple[str, str], ...], ended: int
) -> bytes:
    """A call answered by its status alone ("Trailers-Only"), and the end of its request if the
    peer has not ended it (RST_STREAM NO_ERROR: §8.1)."""
    if code < 0:
        out = h2.frame(h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, stream, h2.status_only(415))
    else:
        block = ANSWER_HEADERS + trailers(code, message, extra)
        out = h2.frame(h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, stream, block)
    return out if ended else out + h2.rst_stream(stream, h2.NO_ERROR)
