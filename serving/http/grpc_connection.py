"""One HTTP/2 connection of `GrpcServer`: frames in, each unary call handed to its handler once its
message is whole, answers out under the peer's flow control (RFC 9113; gRPC's mapping onto it:
grpc/doc/PROTOCOL-HTTP2.md).

A call's answer is one socket write (its headers, message and trailers) when the peer's windows allow,
as they do for any answer under the 64 KiB a stream starts with. A protocol error ends the connection
with GOAWAY; a stream's own error ends that stream only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from serving.http import h2
from serving.http.grpc_calls import GrpcAbort, GrpcCall, StatusCode
from serving.http.grpc_heads import ANSWER_HEADERS, read_head, refusal, status_answer, trailers
from serving.http.grpc_streams import STREAM_WINDOW, Outbox, Stream

if TYPE_CHECKING:
    from serving.http.grpc_server import GrpcServer

log = logging.getLogger(__name__)

CONNECTION_WINDOW = 1 << 24
# streams a peer may reset in one second (the "rapid reset" flood, CVE-2023-44487)
RESETS_PER_SECOND = 200


class Connection(asyncio.Protocol):
    """The server side of one HTTP/2 connection."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.limits = server.limits
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.preface = False
        self.blocks = h2.HeaderBlocks(self.limits.max_header_bytes, read_head)
        self.block_limit = 2 * self.limits.max_header_bytes  # a header block's bytes, compressed
        # a header block awaiting CONTINUATION: its stream, its HEADERS frame's flags, its bytes
        self.continuing: tuple[int, int, bytearray] | None = None
        self.streams: dict[int, Stream] = {}
        self.last_stream = 0
        self.outbox = Outbox()
        self.recv_window = CONNECTION_WINDOW
        self.resets, self.resets_since = 0, 0.0
        self.going_away = False

    # --- the transport's callbacks ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if len(self.server.connections) >= self.limits.max_connections:
            transport.close()  # as the HTTP port: closed as soon as accepted
            return
        self.server.connections.add(self)
        ours = {
            h2.MAX_CONCURRENT_STREAMS: self.limits.max_streams,
            h2.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            h2.MAX_HEADER_LIST_SIZE: self.limits.max_header_bytes,
        }
        self._write(h2.settings(ours) + h2.window_update(0, CONNECTION_WINDOW - h2.DEFAULT_WINDOW))
        if self.server.stopping:
            self.go_away()

    def data_received(self, data: bytes) -> None:
        try:
            if self.buffer:
                self.buffer += data
                del self.buffer[: self._frames(memoryview(self.buffer))]
            else:  # the usual case: frames read from `data` itself, a partial one kept
                view = memoryview(data)
                if (used := self._frames(view)) < len(data):
                    self.buffer += view[used:]
        except h2.PeerError as error:
            log.debug("gRPC connection closed: %s", error)
            self._write(h2.goaway(self.last_stream, error.code, str(error)))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        for stream in list(self.streams.values()):
            self._abandon(stream)
        self.transport = None

    def pause_writing(self) -> None:
        # a peer that does not read its answers (or pings' acks) makes us read nothing more
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    # --- the server's calls -----------------------------------------------------------------------
    def go_away(self) -> None:
        """No new streams (the server stops): those open may finish."""
        self.going_away = True
        self._write(h2.goaway(self.last_stream, h2.NO_ERROR))
        if not self.streams:
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # --- frames in --------------------------------------------------------------------------------
    def _frames(self, view: memoryview) -> int:
        """Handle the whole frames in `view`: the bytes they took. No frame's handler keeps a slice
        of `view` (DATA's payload is copied into its call's message)."""
        at, end = 0, len(view)
        if not self.preface:
            if view[: len(h2.PREFACE)] != h2.PREFACE[:end]:
                raise h2.PeerError(h2.PROTOCOL_ERROR, "not HTTP/2's connection preface")
            if end < len(h2.PREFACE):
                return 0
            self.preface, at = True, len(h2.PREFACE)
        while end - at >= 9 and self.transport is not None and not self.transport.is_closing():
            length = int.from_bytes(view[at : at + 3], "big")
            if length > h2.DEFAULT_FRAME_SIZE:  # the largest we advertise (the default)
                raise h2.PeerError(h2.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
            if end - at - 9 < length:
                break
            kind, flags = view[at + 3], view[at + 4]
            stream = int.from_bytes(view[at + 5 : at + 9], "big") & 0x7FFFFFFF
            payload = view[at + 9 : at + 9 + length]
            at += 9 + length
            if kind == h2.DATA and self.continuing is None:
                self._data(flags, stream, payload)
            else:
                self._frame(kind, flags, stream, bytes(payload))
        return at

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if self.continuing is not None and kind != h2.CONTINUATION:
            raise h2.PeerError(h2.PROTOCOL_ERROR, "a header block was interrupted")
        if kind == h2.HEADERS:  # DATA never comes here: `_frames` hands it to `_data`
            self._headers(flags, stream, payload)
        elif kind == h2.CONTINUATION:
            self._continuation(flags, stream, payload)
        elif kind == h2.WINDOW_UPDATE:
            self._window_update(stream, payload)
        elif kind == h2.SETTINGS:
            self._settings(flags, stream, payload)
        elif kind == h2.PING:
            if stream != 0 or len(payload) != 8:
                raise h2.PeerError(h2.PROTOCOL_ERROR, "a malformed PING frame")
            if not flags & h2.ACK:
                self._write(h2.frame(h2.PING, h2.ACK, 0, payload))
        elif kind == h2.RST_STREAM:
            self._reset(stream, payload)
        elif kind == h2.GOAWAY:
            if stream != 0:
                raise h2.PeerError(h2.PROTOCOL_ERROR, "a GOAWAY frame off stream 0")
            self.going_away = True
            if not self.streams:
                self.close()
        elif kind == h2.PRIORITY:
            if stream == 0:
                raise h2.PeerError(h2.PROTOCOL_ERROR, "a PRIORITY frame on stream 0")
        elif kind == h2.PUSH_PROMISE:
            raise h2.PeerError(h2.PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        # any other type is an extension's: ignored (RFC 9113 §5.5)

    def _headers(self, flags: int, stream: int, payload: bytes) -> None:
        if stream == 0 or stream % 2 == 0:
            raise h2.PeerError(h2.PROTOCOL_ERROR, f"HEADERS on stream {stream}")
        payload = h2.unpad(flags, payload)
        if flags & h2.PRIORITY_FLAG:
            payload = payload[5:]
        if flags & h2.END_HEADERS:
            self._request_head(flags, stream, payload)
        else:
            self.continuing = (stream, flags, bytearray(payload))
            self._check_block(self.continuing[2])

    def _continuation(self, flags: int, stream: int, payload: bytes) -> None:
        if self.continuing is None or self.continuing[0] != stream:
            raise h2.PeerError(h2.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block = self.continuing[2]
        block += payload
        self._check_block(block)
        if flags & h2.END_HEADERS:
            _, first_flags, _ = self.continuing
            self.continuing = None
            self._request_head(first_flags, stream, bytes(block))

    def _check_block(self, block: bytearray) -> None:
        if len(block) > self.block_limit:  # the CONTINUATION flood
            raise h2.PeerError(h2.ENHANCE_YOUR_CALM, "a header block over the limit")

    def _request_head(self, flags: int, stream: int, block: bytes) -> None:
        head = self.blocks.decode(block)  # always: the table must stay in step with the peer's
        if stream <= self.last_stream:  # trailers, or a stream already answered or reset
            known = self.streams.get(stream)
            if known is not None and not known.remote_closed:
                if flags & h2.END_STREAM:
                    self._request_ends(known)
                else:
                    self._end(known, h2.PROTOCOL_ERROR)
            return
        self.last_stream = stream
        if self.going_away or len(self.streams) >= self.limits.max_streams:
            self._write(h2.rst_stream(stream, h2.REFUSED_STREAM))  # the client may retry it
            return
        handler = self.server.handler(head.path)
        full = self.server.calls >= self.limits.max_calls
        if (refused := refusal(head, handler is not None, full)) is not None:
            status, message, extra = refused
            self._write(status_answer(stream, status, message, extra, flags & h2.END_STREAM))
            return
        assert handler is not None  # `refusal` answered UNIMPLEMENTED otherwise
        call = GrpcCall(head.path[len(self.server.prefix) :], head.metadata)
        state = Stream(stream, handler, call, self.outbox.initial_window)
        self.streams[stream] = state
        self.server.calls += 1
        if head.timeout is not None:
            state.timer = asyncio.get_running_loop().call_later(head.timeout, self._deadline, state)
        if flags & h2.END_STREAM:
            self._request_ends(state)

    def _data(self, flags: int, stream: int, payload: memoryview) -> None:
        if stream == 0:
            raise h2.PeerError(h2.PROTOCOL_ERROR, "DATA on stream 0")
        self.recv_window -= len(payload)  # padding counts (§6.9.1)
        if self.recv_window < 0:
            raise h2.PeerError(h2.FLOW_CONTROL_ERROR, "DATA past the connection's window")
        if self.recv_window < CONNECTION_WINDOW // 2:
            self._write(h2.window_update(0, CONNECTION_WINDOW - self.recv_window))
            self.recv_window = CONNECTION_WINDOW
        state = self.streams.get(stream)
        if state is None:
            if stream > self.last_stream:
                raise h2.PeerError(h2.PROTOCOL_ERROR, f"DATA on idle stream {stream}")
            return  # a stream already answered or reset: its late frames are ignored (§5.1)
        if state.remote_closed:
            self._end(state, h2.STREAM_CLOSED)
            return
        state.recv_window -= len(payload)
        if state.recv_window < 0:
            self._end(state, h2.FLOW_CONTROL_ERROR)
            return
        state.body += h2.unpad(flags, payload)
        limit = self.limits.max_message
        if len(state.body) > limit + 5:
            message = f"Received message larger than max ({len(state.body) - 5} vs. {limit})"
            self._abort(state, StatusCode.RESOURCE_EXHAUSTED, message)
        elif flags & h2.END_STREAM:
            self._request_ends(state)
        elif state.recv_window < STREAM_WINDOW // 2:
            self._write(h2.window_update(stream, STREAM_WINDOW - state.recv_window))
            state.recv_window = STREAM_WINDOW

    def _request_ends(self, state: Stream) -> None:
        state.remote_closed = True
        body, state.body = state.body, bytearray()
        if len(body) < 5 or len(body) != 5 + int.from_bytes(body[1:5], "big"):
            self._abort(state, StatusCode.INTERNAL, "a unary call's request is one whole message")
        elif body[0]:
            self._abort(state, StatusCode.INTERNAL, "a compressed message without grpc-encoding")
        else:
            message = bytes(memoryview(body)[5:])
            state.task = asyncio.get_running_loop().create_task(self._run(state, message))

    def _window_update(self, stream: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise h2.PeerError(h2.FRAME_SIZE_ERROR, "a WINDOW_UPDATE frame not 4 bytes")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream == 0:
            self.outbox.window += increment
            if increment == 0 or self.outbox.window > h2.MAX_WINDOW:
                raise h2.PeerError(h2.FLOW_CONTROL_ERROR, "a bad connection window update")
        else:
            if (state := self.streams.get(stream)) is None:
                return
            state.send_window += increment
            if increment == 0 or state.send_window > h2.MAX_WINDOW:
                self._end(state, h2.FLOW_CONTROL_ERROR)
                return
        self._unblock()

    def _settings(self, flags: int, stream: int, payload: bytes) -> None:
        if stream != 0:
            raise h2.PeerError(h2.PROTOCOL_ERROR, "a SETTINGS frame off stream 0")
        if flags & h2.ACK:
            return
        for key, value in h2.parse_settings(payload):
            if key == h2.INITIAL_WINDOW_SIZE:
                if value > h2.MAX_WINDOW:
                    raise h2.PeerError(h2.FLOW_CONTROL_ERROR, "an initial window too large")
                delta, self.outbox.initial_window = value - self.outbox.initial_window, value
                for state in self.streams.values():
                    state.send_window += delta
            elif key == h2.MAX_FRAME_SIZE:
                if not h2.DEFAULT_FRAME_SIZE <= value <= h2.MAX_FRAME_SIZE_LIMIT:
                    raise h2.PeerError(h2.PROTOCOL_ERROR, f"a max frame size of {value}")
                self.outbox.frame_size = value
        self._write(h2.frame(h2.SETTINGS, h2.ACK, 0))
        self._unblock()

    def _reset(self, stream: int, payload: bytes) -> None:
        if stream == 0 or len(payload) != 4:
            raise h2.PeerError(h2.PROTOCOL_ERROR, "a malformed RST_STREAM frame")
        if (state := self.streams.get(stream)) is None:
            return
        now = asyncio.get_running_loop().time()
        if now - self.resets_since > 1.0:
            self.resets, self.resets_since = 0, now
        self.resets += 1
        self._abandon(state)
        if self.resets > RESETS_PER_SECOND:
            raise h2.PeerError(h2.ENHANCE_YOUR_CALM, "too many streams reset")

    # --- calls ------------------------------------------------------------------------------------
    async def _run(self, state: Stream, message: bytes) -> None:
        try:
            self._answer(state, await state.handler(message, state.call))
        except GrpcAbort as abort:
            self._abort(state, abort.code, abort.message)
        except asyncio.CancelledError:
            pass  # reset, past its deadline, or the connection's end: answered by whoever cancelled
        except Exception as error:
            log.exception("gRPC method %s failed", state.call.method)
            self._abort(state, StatusCode.UNKNOWN, f"Exception calling application: {error}")
        finally:
            self._release(state)

    def _deadline(self, state: Stream) -> None:
        state.timer = None
        self._abort(state, StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    # --- frames out -------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _write_all(self, parts: list[bytes | memoryview]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(parts)  # one writev on uvloop, the message not copied

    def _abort(self, state: Stream, code: int, message: str) -> None:
        """End a call with `code` unless it already has an answer; its task, if any, is cancelled."""
        if state.done:
            return
        trailing = state.call.trailing
        self._write(status_answer(state.id, code, message, trailing, state.remote_closed))
        self._abandon(state)

    def _answer(self, state: Stream, message: bytes) -> None:
        if state.done:
            return
        trailing = trailers(StatusCode.OK, "", state.call.trailing)
        out, finished = self.outbox.answer(state, message, trailing, ANSWER_HEADERS)
        self._write_all(out)
        if finished:
            self._forget(state)  # after the write: forgetting the last stream may close

    def _unblock(self) -> None:
        out, finished = self.outbox.unblock()
        if out:
            self._write_all(out)
        for state in finished:
            self._forget(state)

    def _end(self, state: Stream, code: int) -> None:
        """End one stream with an HTTP/2 error (RST_STREAM)."""
        self._write(h2.rst_stream(state.id, code))
        self._abandon(state)

    # --- bookkeeping ------------------------------------------------------------------------------
    def _abandon(self, state: Stream) -> None:
        """Nothing more is written for this stream; its handler, if running, is cancelled."""
        state.done = True
        task = state.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        self._forget(state)

    def _forget(self, state: Stream) -> None:
        self.streams.pop(state.id, None)
        self.outbox.blocked.pop(state.id, None)
        if state.task is None or state.task.done():
            self._release(state)
        if self.going_away and not self.streams:
            self.close()

    def _release(self, state: Stream) -> None:
        """The call no longer counts against the server's `max_calls` (its handler has ended)."""
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        if state.counted:
            state.counted = False
            self.server.calls -= 1
