"""Run an ASGI app with uvicorn on its own thread and event loop.

Used inside Ray Serve replicas: the server must not share (or block) the loop
Ray uses to talk to its controller, and must bind before the replica reports ready.
Every server enforces `HttpLimits` (connections, request heads, slow clients; see
`serving._http_limits`), with ServerSettings' defaults unless told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading

import uvicorn

from serving.http.limits import HttpLimits

__all__ = ["BackgroundServer", "HttpLimits"]

# how often an idle server wakes: the `date` header's resolution (uvicorn wakes every 0.1 s)
TICK_S = 1.0


class _Server(uvicorn.Server):
    """uvicorn's server, woken once a second instead of ten times, and at once when asked to stop.

    uvicorn's main loop sleeps 0.1 s between checks of `should_exit`; its tick (the `date` header,
    which has one-second resolution anyway) needs a wake-up only once a second. Every container
    process and the gateway run one of these, so an idle endpoint pays those wake-ups per container
    (docs/benchmarks/bench_http_server.md)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            # on_tick counts tenths of a second: a multiple of 10 is a whole one
            counter = (counter + 10) % 864000
            should_exit = await self.on_tick(counter)

    def request_exit(self) -> None:
        """Stop accepting (from any thread): the main loop sees it now, not at its next tick."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                loop.call_soon_threadsafe(wake.set)


class BackgroundServer:
    """A uvicorn server bound at construction, serving on a daemon thread.

    `limits`: what one client may cost before the app sees its request; the defaults suit both the
    gateway and a container's data port (which only the gateway calls, with at most its own
    connection count).
    """

    def __init__(
        self,
        app,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: HttpLimits = HttpLimits(),
        sock: socket.socket | None = None,
        also: tuple[socket.socket, ...] = (),
        reuse_port: bool = False,
    ) -> None:
        """Bind `host:port`, or serve on `sock`, a socket already bound and listening (a container
        process inherits its data port from its supervisor, since it may not bind one itself).
        `also`: more listening sockets to serve (a data port's Unix socket, `local_socket`); `url`
        names only the first."""
        if sock is None:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # processes of this user that set it too share the port (the kernel spreads connections)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))  # raises at once if the port is taken
            sock.listen(2048)
        self.socket = sock
        self.also = also
        self.host, self.port = sock.getsockname()[:2]
        config = uvicorn.Config(
            # No WebSocket routes here: upgrades are refused rather than handed to a protocol the
            # limits skip.
            app,
            loop="none",
            http=limits.protocol(),
            ws="none",
            lifespan="on",
            access_log=False,
            # The peer is the TCP peer, whatever FORWARDED_ALLOW_IPS says: no proxy we set up stands
            # in front of these servers, so X-Forwarded-* could only let a peer claim an address it
            # does not have (docs/security.md). No `server: uvicorn` header either.
            proxy_headers=False,
            server_header=False,
            log_level="warning",
            timeout_keep_alive=75,
            timeout_graceful_shutdown=10,
        )
        self._server = _Server(config)
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"http-{self.port}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _run(self) -> None:
        try:
            import uvloop

            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
            runner = asyncio.Runner()
        with runner:
            runner.run(self._server.serve(sockets=[self.socket, *self.also]))

    def wait_started(self, timeout: float = 30.0) -> bool:
        """True once uvicorn accepts connections (or False after `timeout`)."""
        deadline = threading.Event()
        for _ in range(int(timeout / 0.01)):
            if self._server.started:
                return True
            if not self._thread.is_alive():
                return False
            deadline.wait(0.01)
        return self._server.started

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop accepting, let in-flight requests finish, then join the thread."""
        self._server.request_exit()
        self._thread.join(timeout)
        for listener in (self.socket, *self.also):
            listener.close()
