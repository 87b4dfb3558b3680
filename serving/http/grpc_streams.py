"""A gRPC call's stream within its connection, and the answers' way out under the peer's flow
control (RFC 9113 §5.2: each DATA frame spends both the stream's window and the connection's)."""

from __future__ import annotations

import asyncio

from serving.http import h2
from serving.http.grpc_calls import GrpcCall, Handler

STREAM_WINDOW = 1 << 20  # what a call may send before its first WINDOW_UPDATE


class Stream:
    """One call: its request until whole, then its handler's task, then its answer until sent."""

    __slots__ = (
        "id", "handler", "call", "body", "recv_window", "send_window",
        "remote_closed", "task", "timer", "counted", "done", "pending", "left", "trailers",
    )  # fmt: skip

    def __init__(self, stream: int, handler: Handler, call: GrpcCall, send_window: int) -> None:
        self.id = stream
        self.handler = handler
        self.call = call
        self.body = bytearray()
        self.recv_window = STREAM_WINDOW
        self.send_window = send_window
        self.remote_closed = False  # the request has ended (END_STREAM)
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.counted = True  # holds one of the server's `max_calls`
        self.done = False  # answered, reset or abandoned: nothing more is written for it
        self.pending: list[memoryview] = []  # the answer's DATA not yet sent (flow control)
        self.left = 0  # bytes in `pending`
        self.trailers = b""


class Outbox:
    """The connection's send window and the answers waiting for the peer's windows to open."""

    def __init__(self) -> None:
        self.window = h2.DEFAULT_WINDOW  # the connection's
        self.initial_window = h2.DEFAULT_WINDOW  # each new stream's (the peer's SETTINGS)
        self.frame_size = h2.DEFAULT_FRAME_SIZE
        self.blocked: dict[int, Stream] = {}

    def answer(
        self, state: Stream, message: bytes, trailers: bytes, headers: bytes
    ) -> tuple[list[bytes | memoryview], bool]:
        """The buffers to write now for an answer (the message not copied), and whether they end
        the call."""
        state.pending = [memoryview(b"\x00" + len(message).to_bytes(4, "big")), memoryview(message)]
        state.left = 5 + len(message)
        state.trailers = trailers
        out: list[bytes | memoryview] = [h2.frame(h2.HEADERS, h2.END_HEADERS, state.id, headers)]
        finished = self.flush(state, out)
        return out, finished

    def unblock(self) -> tuple[list[bytes | memoryview], list[Stream]]:
        """What the windows now let out, and the calls it ends."""
        out: list[bytes | memoryview] = []
        finished = [state for state in list(self.blocked.values()) if self.flush(state, out)]
        return out, finished

    def flush(self, state: Stream, out: list[bytes | memoryview]) -> bool:
        """Add to `out` what of the answer the windows allow, and its trailers once all is sent:
        whether it was."""
        while state.left:
            size = min(state.left, state.send_window, self.window, self.frame_size)
            if size <= 0:
                self.blocked[state.id] = state
                return False
            out.append(h2.frame_header(h2.DATA, 0, state.id, size))
            _take(state.pending, size, out)
            state.left -= size
            state.send_window -= size
            self.window -= size
        self.blocked.pop(state.id, None)
        out.append(h2.frame(h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, state.id, state.trailers))
        if not state.remote_closed:
            out.append(h2.rst_stream(state.id, h2.NO_ERROR))
        state.done = True
        return True


def _take(parts: list[memoryview], size: int, out: list[bytes | memoryview]) -> None:
    """Move the first `size` bytes of `parts` to `out`, as slices."""
    while size:
        part = parts[0]
        if len(part) <= size:
            out.append(parts.pop(0))
            size -= len(part)
        else:
            out.append(part[:size])
            parts[0] = part[size:]
            size = 0
