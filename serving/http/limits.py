"""What one HTTP client may cost the server before an app sees its request: connections, heads, slow
reads.

uvicorn's httptools protocol, which BackgroundServer runs, bounds none of these (no header size or
count limit, no timeout for a request's head or body, no cap on connections that never complete
their headers), and no option of uvicorn, httptools or uvloop adds them, so
`LimitedHttpToolsProtocol` does, inside uvicorn's own protocol object. The limits, their settings
and defaults: docs/api.md and docs/security.md.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, fields
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.errors import (
    HeadersTooLargeError,
    RequestTimeoutError,
    ServingError,
    wire_error,
)
from serving.http import limit_defaults as default
from serving.http.one_write import HeldHeadTransport

__all__ = ["HttpLimits", "LimitedHttpToolsProtocol"]


@dataclass(frozen=True)
class HttpLimits:
    """The limits of one server; the defaults are ServerSettings' (chosen, and explained, there)."""

    max_connections: int | None = default.MAX_CONNECTIONS  # None: no cap
    max_header_bytes: int = default.MAX_HEADER_BYTES
    max_header_count: int = default.MAX_HEADER_COUNT
    header_timeout_s: float = default.HEADER_TIMEOUT_S
    body_idle_timeout_s: float = default.BODY_IDLE_TIMEOUT_S
    body_timeout_s: float = default.BODY_TIMEOUT_S

    @classmethod
    def from_settings(cls, settings: Any) -> HttpLimits:
        """The limits named as this class's fields, from any object with those attributes (the
        ServerSettings: not imported here, so a container process serves with the defaults without
        loading pydantic's settings)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    def protocol(self) -> type[asyncio.Protocol]:
        """The protocol class to give uvicorn (`http=`) to enforce these limits."""
        return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": self})


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of `limits`:

    - a connection over `max_connections` is closed as soon as it is accepted (there is no request
      to answer yet);
    - a head (request line and headers) over `max_header_bytes` or `max_header_count` is answered
      431 and the connection closed, without waiting for (or keeping) the rest of it;
    - a head not complete `header_timeout_s` after its first byte (after the connection opened, for
      the first request) is answered 408, or with no byte of it received the connection is just
      closed;
    - a body that pauses longer than `body_idle_timeout_s`, or is not complete `body_timeout_s`
      after its headers, is answered 408 unless a response has started, and the connection closed:
      the app sees a disconnect.

    Answers are in the documented error shape (`serving.errors.wire_error`). Between requests, a
    keep-alive connection is governed by uvicorn's `timeout_keep_alive`. Timers exist only while a
    request spans more than one read, so requests that arrive whole cost none."""

    limits = HttpLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._done = False  # closed by a limit: whatever still arrives is ignored
        self._over_capacity = False  # closed on arrival; uvicorn never saw the connection
        # until the end of a request's headers (then again once its body is complete)
        self._in_head = True
        self._in_body = False  # from the end of its headers to the end of its body
        self._head_started = False  # a byte of the next request has been parsed
        self._head_received = 0  # bytes received while in the head
        self._head_bytes = self._head_count = 0  # the head as parsed: target, headers
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_started = self._body_seen = 0.0

    # --- connections ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        cap = self.limits.max_connections
        if cap is not None and len(self.connections) >= cap:
            self._over_capacity = self._done = True
            transport.close()
            return
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timers()
        if not self._over_capacity:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        if self._in_head:
            self._head_received += len(data)
        elif self._in_body:
            self._body_seen = self.loop.time()
        super().data_received(data)
        if self._done:
            return
        if self._in_head and (self._head_received or self._head_started):
            # no end of the head yet, and already too long
            if self._head_received > self.limits.max_header_bytes:
                self._refuse(self._too_large())
            elif self._head_timer is None:
                self._head_timer = self.loop.call_later(
                    self.limits.header_timeout_s, self._head_timed_out
                )
        elif self._in_body and self._body_timer is None:
            self._body_started = self._body_seen = self.loop.time()
            self._body_timer = self.loop.call_later(
                min(self.limits.body_idle_timeout_s, self.limits.body_timeout_s), self._body_check
            )

    def send_400_response(self, msg: str) -> None:
        # after a refusal the parser may still fail on what follows: it has been answered
        if not self._done:
            super().send_400_response(msg)

    # --- parser callbacks -------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_started = True
        self._head_bytes = self._head_count = 0

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._done:
            return
        self._head_count += 1
        self._head_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if self._head_count > self.limits.max_header_count:
            self._refuse(
                HeadersTooLargeError(
                    f"the request has more than {self.limits.max_header_count} headers (SERVING_MAX_HEADER_COUNT)"
                )
            )
        elif self._head_bytes > self.limits.max_header_bytes:
            self._refuse(self._too_large())
        else:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head, self._in_body, self._head_started = False, True, False
        self._cancel_head_timer()
        if self._done:
            return
        if self._head_bytes > self.limits.max_header_bytes:  # a long target with few headers
            self._refuse(self._too_large())
            return
        earlier = self.cycle
        super().on_headers_complete()
        # a new request: its response's head goes out with its body (http.one_write)
        if self.cycle is not earlier:
            self.cycle.transport = HeldHeadTransport(self.transport, self.loop)  # type: ignore[assignment]

    def on_body(self, body: bytes) -> None:
        if not self._done:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_head, self._in_body, self._head_received = True, False, 0
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if not self._done:
            super().on_message_complete()

    # --- timers and refusals ----------------------------------------------------------------------

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._done or not self._in_head:
            return
        if self._head_received or self._head_started:
            self._refuse(
                RequestTimeoutError(
                    f"the request's headers did not arrive within {self.limits.header_timeout_s:g} s (SERVING_HEADER_TIMEOUT_S)"
                )
            )
        else:  # nothing of a request: nothing to answer
            self._done = True
            self.transport.close()

    def _body_check(self) -> None:
        self._body_timer = None
        if self._done or not self._in_body:
            return
        limits, now = self.limits, self.loop.time()
        # the app has not taken what arrived, so we are not reading: not the client's pause
        if self.flow.read_paused:
            self._body_seen = now
        if now >= self._body_started + limits.body_timeout_s:
            self._refuse(
                RequestTimeoutError(
                    f"the request body did not arrive within {limits.body_timeout_s:g} s (SERVING_BODY_TIMEOUT_S)"
                ),
                body=True,
            )
        elif now >= self._body_seen + limits.body_idle_timeout_s:
            self._refuse(
                RequestTimeoutError(
                    f"no byte of the request body arrived for {limits.body_idle_timeout_s:g} s (SERVING_BODY_IDLE_TIMEOUT_S)"
                ),
                body=True,
            )
        else:
            wake = min(
                self._body_started + limits.body_timeout_s,
                self._body_seen + limits.body_idle_timeout_s,
            )
            self._body_timer = self.loop.call_at(wake, self._body_check)

    def _too_large(self) -> HeadersTooLargeError:
        return HeadersTooLargeError(
            f"the request line and headers exceed {self.limits.max_header_bytes} bytes (SERVING_MAX_HEADER_BYTES)"
        )

    def _refuse(self, error: ServingError, body: bool = False) -> None:
        """Answer `error` where the connection is free for an answer, and close it.

        A head is answered only when no earlier response on the connection is under way; a body only
        when the app has not started its response (then the app sees a disconnect).
        """
        self._done = True
        self._stop_timers()
        cycle = self.cycle
        free = cycle is None or (not cycle.response_started if body else cycle.response_complete)
        if free and not self.transport.is_closing():
            status, headers, content = wire_error(error)
            lines = [b"HTTP/1.1 %d %s" % (status, HTTPStatus(status).phrase.encode())]
            lines += [name + b": " + value for name, value in self.server_state.default_headers]
            lines += [f"{name}: {value}".encode("latin-1") for name, value in headers.items()]
            lines += [b"content-length: %d" % len(content), b"connection: close", b"", content]
            self.transport.write(b"\r\n".join(lines))
        self.transport.close()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _stop_timers(self) -> None:
        self._cancel_head_timer()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
