"""A server of unary gRPC calls on asyncio's loop: the gateway's `--grpc-port`.

grpcio's own server spends most of a small call's CPU in its native core and poller, about three times
what the HTTP/1.1 door costs (docs/benchmarks/bench_open_inference.md). A unary call is one request
message and one answer, so this server speaks only that part of HTTP/2 (`grpc_connection`) and hands each
call's message and metadata to an `async` handler, which answers bytes or raises `GrpcAbort`.

What it enforces (each bounded before a call's message is held): calls at once across connections
(`max_calls`, more are answered RESOURCE_EXHAUSTED at their headers), a message's size
(`max_message`), a header list's size (`max_header_bytes`), streams per connection, and the output a
peer that does not read may make it buffer (reading stops until it reads).
"""

from __future__ import annotations

import asyncio
import ssl

from serving.http.grpc_calls import GrpcAbort, GrpcCall, GrpcLimits, Handler, StatusCode
from serving.http.grpc_connection import Connection

__all__ = ["GrpcAbort", "GrpcCall", "GrpcLimits", "GrpcServer", "Handler", "StatusCode"]


class GrpcServer:
    """The methods of one service, served on a TCP port (TLS with `ssl`, offering ALPN `h2`)."""

    def __init__(self, service: str, handlers: dict[str, Handler], limits: GrpcLimits) -> None:
        self.prefix = f"/{service}/"
        self.handlers = handlers
        self.limits = limits
        self.calls = 0  # running, all connections together
        self.connections: set[Connection] = set()
        self.server: asyncio.Server | None = None
        self.stopping = False

    def handler(self, path: str) -> Handler | None:
        if not path.startswith(self.prefix):
            return None
        return self.handlers.get(path[len(self.prefix) :])

    async def start(
        self, host: str, port: int, *, reuse_port: bool = False, tls: ssl.SSLContext | None = None
    ) -> int:
        """Listen in the running loop; the port bound (port 0: the kernel's choice)."""
        if tls is not None:
            tls.set_alpn_protocols(["h2"])
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: Connection(self),
            host,
            port,
            reuse_port=reuse_port or None,
            ssl=tls,
            backlog=1024,
        )
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls at once (GOAWAY), give those running `grace_s` to finish, then cancel them
        and close every connection."""
        self.stopping = True
        if self.server is not None:
            self.server.close()
        for connection in list(self.connections):
            connection.go_away()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self.calls and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.close()
        if self.server is not None:
            await self.server.wait_closed()
