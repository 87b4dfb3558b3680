"""The data port of a container replica: SageMaker's container contract over HTTP.

Each replica answers `POST /invocations` and `GET /ping` like a SageMaker model
container, so the router reaches it with one plain HTTP hop instead of Ray Serve's
slower handle path (see docs/performance.md for the measurements behind this).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving import protocol
from serving.errors import ServingError, wire_error
from serving.multimodel import MultiModelHandler
from serving.runtimes import InvocationContext, Runtime

logger = logging.getLogger("serving.container")



def _error_response(error: ServingError) -> Response:
    status, headers, body = wire_error(error)
    return Response(body, status_code=status, headers=headers)


class ContainerApp:
    """ASGI app wrapping one loaded runtime, or a MultiModel container's models (the router bounds
    how many requests reach it)."""

    def __init__(self, runtime: Runtime | None, hostname: str, models: MultiModelHandler | None = None,
                 model_latency: Callable[[float], None] | None = None) -> None:
        """`model_latency(seconds)` receives each SingleModel invocation's model time (MultiModel: the
        handler reports it, since only it can leave out the load)."""
        if (runtime is None) == (models is None):
            raise ValueError("give a runtime (SingleModel) or models (MultiModel)")
        self.runtime = runtime
        self.model_latency = model_latency
        self.models = models
        self.hostname = hostname
        self.in_flight = 0
        self.invocations = 0
        self.app = Starlette(
            routes=[
                Route("/invocations", self.invoke, methods=["POST"]),
                Route("/ping", self.ping, methods=["GET"]),
            ]
        )

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)

    async def ping(self, request: Request) -> Response:
        return Response(b"", status_code=200)

    async def invoke(self, request: Request) -> Response:
        self.in_flight += 1
        self.invocations += 1
        try:
            body = await request.body()
            headers = request.headers
            context = InvocationContext(
                custom_attributes=headers.get(protocol.CUSTOM_ATTRIBUTES),
                target_model=headers.get(protocol.TARGET_MODEL),
                inference_id=headers.get(protocol.INFERENCE_ID),
            )
            if self.models is not None:
                out, content_type = await self.models.ainvoke(body, headers.get("content-type"), headers.get("accept"), context)
            else:
                started = time.perf_counter()
                out, content_type = self.runtime.invoke(body, headers.get("content-type"), headers.get("accept"), context)
                if self.model_latency is not None:
                    self.model_latency(time.perf_counter() - started)
            response_headers = {"content-type": content_type}
            if context.response_custom_attributes:
                response_headers[protocol.CUSTOM_ATTRIBUTES] = context.response_custom_attributes
            return Response(out, headers=response_headers)
        except ServingError as error:
            return _error_response(error)
        except Exception as error:  # the model failed: report it, keep serving
            logger.exception("container %s: invocation failed", self.hostname)
            status, headers, body = wire_error(ServingError(f"{type(error).__name__}: {error}"))
            return Response(body, status_code=status, headers=headers)
        finally:
            self.in_flight -= 1
