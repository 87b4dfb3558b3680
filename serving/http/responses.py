"""Where an error becomes a response: the one Starlette exception handler for `ServingError`, used
by every HTTP app of the server (the gateway's routes, a container's data port, the control routes).

Routes raise `ServingError`s; `serving_app` wires the handler in. A route that must see its own
answer (the invoke route counts each one) calls `error_response` itself — the same function.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from serving import protocol
from serving.errors import (
    InternalFailureError,
    ServingError,
    UnknownOperationError,
    ValidationError,
    wire_error,
)
from serving.http.hot_path import HotPath

logger = logging.getLogger("serving.http")


def error_response(error: ServingError) -> Response:
    """The documented error response: `{"__type", "message", ...}`, its status, and the error-type
    header."""
    status, headers, body = wire_error(error)
    return Response(body, status_code=status, headers=headers)


def json_response(document: Any, status: int = 200) -> Response:
    return Response(json.dumps(document).encode(), status_code=status, media_type=protocol.JSON)


async def _serving_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, ServingError)
    return error_response(error)


async def _unexpected(request: Request, error: Exception) -> Response:
    # A bug of ours: answer in the documented shape (Starlette still logs the traceback), keep
    # serving.
    logger.error("unexpected failure answering %s %s: %s", request.method, request.url.path, error)
    return error_response(InternalFailureError("internal failure in the endpoint server"))


_NOT_FOUND, _NOT_ALLOWED = 404, 405
_SHOWN_PATH = 200  # characters of a request's path repeated in an answer


async def _http_error(request: Request, error: Exception) -> Response:
    """Starlette's own refusals (no route, another method) in the documented shape, never its plain
    text."""
    assert isinstance(error, HTTPException)
    method, path = request.method, request.url.path[:_SHOWN_PATH]
    if error.status_code not in (_NOT_FOUND, _NOT_ALLOWED):
        return error_response(ValidationError(f"{method} {path}: {error.detail}"))
    operation = (
        protocol.RUNTIME_OPERATIONS.get(path.rstrip("/").rsplit("/", 1)[-1])
        if path.startswith("/endpoints/")
        else None
    )
    if error.status_code == _NOT_ALLOWED:
        what = f"{operation} is POST {path}" if operation else f"{path} does not take {method}"
        message = f"unknown operation {method} {path}: {what}"
    elif operation:
        message = (
            f"operation {operation} ({method} {path}) is not supported by this endpoint server"
        )
    else:
        message = f"unknown operation {method} {path}"
    response = error_response(UnknownOperationError(message, error.status_code))
    response.headers.update(error.headers or {})  # Allow, on 405
    return response


EXCEPTION_HANDLERS: dict[Any, Callable] = {
    ServingError: _serving_error,
    HTTPException: _http_error,
    Exception: _unexpected,
}


def serving_app(
    routes: Sequence[BaseRoute], lifespan: Callable | None = None, hot: Route | Sequence[Route] = ()
) -> ASGIApp:
    """A Starlette app whose errors leave in the documented shape. `hot`: the routes that carry
    invocations, served ahead of Starlette's middleware and route walk (`http.hot_path`), with the
    same answers."""
    fast = [hot] if isinstance(hot, Route) else list(hot)
    app = Starlette(
        routes=[*fast, *routes], lifespan=lifespan, exception_handlers=EXCEPTION_HANDLERS
    )
    return HotPath(app, fast, EXCEPTION_HANDLERS) if fast else app
