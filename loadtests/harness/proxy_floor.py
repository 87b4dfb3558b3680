"""The benchmark's two-process floor: the cheapest honest Python proxy in front of the floor server.

Run by bench_invoke in a subprocess, once the floor (`loadtests.harness.floor_server`) serves:

    python -m loadtests.harness.proxy_floor FLOOR_PORT

It binds 127.0.0.1 on a free port, prints that port on its first stdout line, and forwards every
`POST /invocations` to the floor on 127.0.0.1:FLOOR_PORT (body, Content-Type and Accept), answering
with the floor's status, body and Content-Type. Server: uvicorn with httptools and uvloop and a bare
Starlette route, as the floor. Client: this project's hop client (`serving.gateway.hop_client`,
pooled keep-alive connections over TCP), the cheapest Python HTTP client measured here
(docs/benchmarks/bench_invoke.md).

Nothing else: no authentication, no routing table, no signed hop, no metrics, no limits. Our
endpoint puts its gateway in a process of its own in front of every container (the containers run
tenant code in a sandbox; the gateway holds the keys), so a request always crosses two processes.
This server measures what that alone costs on this machine, which no work of ours can remove; the
rest of the difference between our endpoint and the floor is ours.
"""

from __future__ import annotations

import socket
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.gateway.hop_client import HopClient

FORWARDED = ("content-type", "accept")


def build_app(upstream_port: int) -> Starlette:
    client = HopClient()

    async def invocations(request: Request) -> Response:
        body = await request.body()
        headers = {name: request.headers[name] for name in FORWARDED if name in request.headers}
        answer = await client.post("127.0.0.1", upstream_port, "/invocations", body, headers, 30)
        return Response(
            answer.body, status_code=answer.status, media_type=answer.headers.get("content-type")
        )

    async def ping(request: Request) -> Response:
        return Response(b"")

    return Starlette(
        routes=[Route("/invocations", invocations, methods=["POST"]), Route("/ping", ping)]
    )


def main() -> None:
    app = build_app(int(sys.argv[1]))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(
        app, loop="uvloop", http="httptools", lifespan="off", access_log=False, log_level="warning"
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
