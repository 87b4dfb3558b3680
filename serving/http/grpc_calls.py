"""What a unary gRPC call is to its handler: the status codes, the abort, the call's metadata, and
the limits a server enforces (`grpc_server` serves them, `grpc_connection` speaks the wire)."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["GrpcAbort", "GrpcCall", "GrpcLimits", "Handler", "StatusCode"]


class StatusCode(enum.IntEnum):
    """gRPC's status codes (grpc/doc/statuscodes.md)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcAbort(Exception):
    """Ends a call with a status other than OK; `message` becomes its `grpc-message`."""

    def __init__(self, code: StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class GrpcCall:
    """What a handler knows of its call besides the message: the method, the caller's metadata
    (`-bin` keys' values as bytes, as grpcio gives them) and the trailing metadata to answer."""

    method: str
    metadata: tuple[tuple[str, str | bytes], ...]
    trailing: tuple[tuple[str, str], ...] = field(default=())

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self.metadata

    def set_trailing_metadata(self, pairs: tuple[tuple[str, str], ...]) -> None:
        self.trailing = tuple(pairs)


Handler = Callable[[bytes, GrpcCall], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """What one server lets callers make it hold."""

    max_calls: int = 64  # calls running at once, all connections together
    max_message: int = 4 * 1024 * 1024  # a request message's bytes
    max_header_bytes: int = 16_384  # a request's header list (RFC 9113's accounting: +32 a field)
    max_streams: int = 100  # streams one connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS)
    max_connections: int = 1024  # open connections; more are closed as soon as they are accepted
