"""The invocation routes served without Starlette's middleware stack.

Starlette's two exception middlewares, its route walk and the route's exception wrapper, each
wrapping `send` again, cost CPU on every invocation, in the gateway and in each container
(docs/benchmarks/bench_hot_path.md). `HotPath` hands an invocation route (InvokeEndpoint's, Open
Inference's infer) straight to its handler and answers what it raises with the app's own exception
handlers, so the answers are the app's own; every other request, and every other scope type, goes to
the app unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send


class HotPath:
    """ASGI app: `routes` served directly, anything else by `app` (whose first routes they must be,
    in this order).

    Being first, a hot route is what the app would have chosen for every request taken here. What
    sending the answer raises is left to the server, as Starlette would once the answer has started:
    the hot routes answer with a plain `Response`, whose only failure is a connection gone, where no
    answer can arrive."""

    def __init__(
        self, app: Starlette, routes: Sequence[Route], handlers: Mapping[Any, Callable]
    ) -> None:
        if list(app.routes[: len(routes)]) != list(routes):
            raise ValueError("the hot routes must be the app's first routes")
        self.app = app
        self.routes = tuple(routes)
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for route in self.routes:
                match, child = route.matches(scope)
                if match is Match.FULL:
                    scope["app"] = self.app
                    scope.update(child)
                    await self._serve(route.endpoint, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _serve(self, endpoint: Callable, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except Exception as error:
            handler = self._handler(error)
            if handler is None:
                raise
            response = await handler(request, error)
            if self.handlers.get(Exception) is handler:
                # As Starlette's ServerErrorMiddleware: answer, then raise, so that the server logs
                # the bug.
                await response(scope, receive, send)
                raise
        await response(scope, receive, send)

    def _handler(self, error: Exception) -> Callable[[Request, Exception], Any] | None:
        """The handler the app would use: the most specific class of the error that has one."""
        for cls in type(error).__mro__:
            if cls in self.handlers:
                return self.handlers[cls]
        return None
