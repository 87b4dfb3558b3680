"""The benchmark's floor: one model called in-process behind a bare Starlette app.

Run by bench_invoke and bench_harness in a subprocess (and by hand as `serving loadtest`'s baseline,
docs/loadtest.md):

    python -m loadtests.harness.floor_server MODEL.joblib

It binds 127.0.0.1 on a free port, prints that port on its first stdout line, and
serves `POST /invocations` with the same JSON our endpoint takes (`[[...]]` rows in,
the predictions as a JSON list out) and `GET /ping`. uvicorn with httptools and
uvloop, no access log: the cheapest honest way to put this model behind HTTP in
Python, i.e. what any Python serving stack pays at least.
"""

from __future__ import annotations

import json
import socket
import sys

import joblib
import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def build_app(model) -> Starlette:
    async def invocations(request: Request) -> Response:
        rows = np.asarray(json.loads(await request.body()))
        body = json.dumps(model.predict(rows).tolist(), separators=(",", ":"))
        return Response(body, media_type="application/json")

    async def ping(request: Request) -> Response:
        return Response(b"")

    return Starlette(
        routes=[Route("/invocations", invocations, methods=["POST"]), Route("/ping", ping)]
    )


def main() -> None:
    model = joblib.load(sys.argv[1])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(
        build_app(model),
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
