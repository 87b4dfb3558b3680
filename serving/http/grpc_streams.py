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
        "remote_closed", "task", "timer", "counted", "done", "pending", "trailers",
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
        self.pending = memoryview(b"")  # the answer's DATA not yet sent (flow control)
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
    ) -> tuple[bytes, bool]:
        """The frames to write now for an answer, and whether they end the call."""
        state.pending = memoryview(b"\x00" + len(message).to_bytes(4, "big") + message)
        state.trailers = trailers
        out = [h2.frame(h2.HEADERS, h2.END_HEADERS, state.id, headers)]
        finished = self.flush(state, out)
        return b"".join(out), finished

    def unblock(self) -> tuple[bytes, list[Stream]]:
        """What the windows now let out, and the calls it ends."""
        out: list[bytes] = []
        finished = [state for state in list(self.blocked.values()) if self.flush(state, out)]
        return b"".join(out), finished

    def flush(self, state: Stream, out: list[bytes]) -> bool:
        """Add to `out` what of the answer the windows allow, and its trailers once all is sent:
        whether it was."""
        pending = state.pending
        while pending:
            size = min(len(pending), state.send_window, self.window, self.frame_size)
            if size <= 0:
                self.blocked[state.id] = state
                state.pending = pending
                return False
            out.append(h2.frame(h2.DATA, 0, state.id, bytes(pending[:size])))
            pending = pending[size:]
            state.send_window -= size
            self.window -= size
        state.pending = pending
        self.blocked.pop(state.id, None)
        out.append(h2.frame(h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, state.id, state.trailers))
        if not state.remote_closed:
            out.append(h2.rst_stream(state.id, h2.NO_ERROR))
        state.done = True
        return True
