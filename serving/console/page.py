"""The console's HTTP face on every gateway: `GET /console` (the page), its assets (scripts and
styles shipped in this package, nothing from elsewhere) and two JSON routes, each read in one call
to the control plane (`read`, which the gateway passes in: no Ray here).

Every answer, the page and its assets included, first passes `access` (docs/console.md), and
carries a strict Content-Security-Policy, `nosniff`, no referrer; the JSON is not cached.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving import protocol
from serving.console.access import ConsoleAccess, Viewer
from serving.console.overview import ConsoleJson, visible
from serving.errors import AccessDeniedError, ValidationError

__all__ = ["ASSETS", "CONTENT_SECURITY_POLICY", "ConsoleRoutes", "Read"]

# what the control plane is asked: None for the overview, else one endpoint's name
Read = Callable[[str | None], Awaitable[ConsoleJson | None]]
# the files a browser may fetch, with their media types: a name outside it is no file
ASSETS = {
    "console.js": protocol.JAVASCRIPT,
    "console.css": protocol.STYLESHEET,
    "uPlot.iife.min.js": protocol.JAVASCRIPT,
    "uPlot.min.css": protocol.STYLESHEET,
}
PAGE = "console.html"
# nothing from outside the server, no inline script or style, no framing, no form posted elsewhere
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS = {
    protocol.CONTENT_SECURITY_POLICY_HEADER: CONTENT_SECURITY_POLICY,
    protocol.CONTENT_TYPE_OPTIONS_HEADER: protocol.NO_SNIFF,
    protocol.REFERRER_POLICY_HEADER: protocol.NO_REFERRER,
}


def asset_bytes(name: str) -> bytes:
    """One of the package's console files (installed with it: pyproject's package data)."""
    return (resources.files("serving.console") / "assets" / name).read_bytes()


class ConsoleRoutes:
    """`GET /console`, its assets and its data."""

    def __init__(self, access: ConsoleAccess, read: Read) -> None:
        self.access, self.read = access, read
        self.files = {name: asset_bytes(name) for name in [PAGE, *ASSETS]}

    def routes(self) -> list[Route]:
        return [
            Route(protocol.CONSOLE_PATH, self.page, methods=["GET"]),
            Route(protocol.CONSOLE_ASSET_PATH, self.asset, methods=["GET"]),
            Route(protocol.CONSOLE_OVERVIEW_PATH, self.overview, methods=["GET"]),
            Route(protocol.CONSOLE_ENDPOINT_PATH, self.endpoint, methods=["GET"]),
        ]

    def _viewer(self, request: Request) -> Viewer:
        client = request.client.host if request.client is not None else None
        return self.access.viewer(request.headers, client)

    async def page(self, request: Request) -> Response:
        self._viewer(request)
        return _answer(self.files[PAGE], protocol.HTML)

    async def asset(self, request: Request) -> Response:
        self._viewer(request)
        name = request.path_params["name"]
        if name not in ASSETS:
            raise ValidationError(f"the console has no asset {name[:80]!r}")
        return _answer(self.files[name], ASSETS[name])

    async def overview(self, request: Request) -> Response:
        viewer = self._viewer(request)
        document = await self.read(None)
        assert document is not None  # the overview always is
        return _json(visible(document, viewer.may_describe))

    async def endpoint(self, request: Request) -> Response:
        viewer = self._viewer(request)
        name = request.path_params["name"]
        if not viewer.may_describe(name):
            raise AccessDeniedError(
                f"User: {viewer.principal} is not authorized to perform: sagemaker:DescribeEndpoint on "
                f"endpoint {name}"
            )
        document = await self.read(name)
        if document is None:
            raise ValidationError(f"Could not find endpoint {name}.")
        return _json(document)


def _answer(body: bytes, media_type: str) -> Response:
    return Response(body, media_type=media_type, headers=SECURITY_HEADERS)


def _json(document: ConsoleJson) -> Response:
    body = json.dumps(document, separators=(",", ":"), allow_nan=False).encode()
    return Response(
        body,
        media_type=protocol.JSON,
        headers={**SECURITY_HEADERS, protocol.CACHE_CONTROL_HEADER: protocol.NO_STORE},
    )
