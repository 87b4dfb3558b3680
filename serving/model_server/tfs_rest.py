"""A tensorflow container's TF Serving REST API, for its own handlers'
`requests.post(context.rest_uri, ...)`.

SageMaker's TensorFlow Serving container gives `code/inference.py` a `context.rest_uri` on TF
Serving's REST port; scripts post their processed input there. Here the model runs in the container
process itself, so the data port serves that API under
`LOCAL_TFS_PATH/<nonce>/v1/models/<name>:predict`, where the nonce is 128 random bits made for one
invocation, valid only while that invocation runs (its handler's context is the only thing that
holds it), and the caller must be this machine (a loopback address or the data port's own address,
which is where a connection from this host to it comes from). The gateway's hop signature is not
needed: the nonce is the capability. A URL that leaks (a requests error names it; answers and logs
leave it out, `errors.without_capabilities`) is dead once its invocation ends. Anything else gets TF
Serving's 404.
"""

from __future__ import annotations

import ipaddress
import secrets
from functools import partial
from typing import Any

import anyio.to_thread
from anyio import CapacityLimiter
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.protocol import JSON, LOCAL_TFS_PATH

_NOT_FOUND = b'{"error": "Not Found"}'


class LocalRest:
    """The same-host-only TF Serving REST route of one runtime that offers `rest_call`, open to the
    nonce of an invocation while it runs."""

    def __init__(self, runtime: Any, data_url: str | None = None) -> None:
        self.runtime = runtime
        self.data_url = data_url
        self._live: set[str] = set()  # the nonces of the invocations running now
        self._limiter: CapacityLimiter | None = None

    def route(self) -> Route:
        return Route(
            LOCAL_TFS_PATH + "/{token}/v1/models/{rest:path}", self.handle, methods=["POST"]
        )

    def grant(self, request: Request) -> str:
        """`http://<data port address>/…/<nonce>` for the invocation `request` (until `revoke`): the
        data port's TCP address (a request that came over its Unix socket has none), else the
        address the gateway reached."""
        nonce = secrets.token_hex(16)
        self._live.add(nonce)
        if self.data_url is not None:
            return f"{self.data_url}{LOCAL_TFS_PATH}/{nonce}"
        host, port = request.scope["server"][:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}{LOCAL_TFS_PATH}/{nonce}"

    def revoke(self, url: str | None) -> None:
        """The invocation that was granted `url` has ended: its nonce opens nothing any more."""
        if url:
            self._live.discard(url.rsplit("/", 1)[1])

    async def handle(self, request: Request) -> Response:
        # A set lookup hashes the whole nonce: its time says nothing of how much of a guess was
        # right.
        if not (request.path_params["token"] in self._live and _same_host(request)):
            return Response(_NOT_FOUND, status_code=404, media_type=JSON)
        body = await request.body()
        if self._limiter is None:
            # one TF Serving call at a time, as the runtime expects
            self._limiter = CapacityLimiter(1)
        path = "/v1/models/" + request.path_params["rest"]
        status, out = await anyio.to_thread.run_sync(
            partial(self.runtime.rest_call, path, body), limiter=self._limiter
        )
        return Response(out, status_code=status, media_type=JSON)


def _same_host(request: Request) -> bool:
    if request.client is None:
        return False
    peer = request.client.host
    try:
        if ipaddress.ip_address(peer).is_loopback:
            return True
    except ValueError:
        return False
    return peer == request.scope["server"][0]


__all__ = ["LocalRest"]
