"""Live changes over HTTP: `PUT /endpoints/{name}` (create or update from a spec), `DELETE
/endpoints/{name}`.

What `serving apply` and `serving delete` call when the server runs embedded (the Ray instance is
the server's own, so nothing else can reach its control plane). Every call needs the server's
control token (`Authorization: Bearer <token>`), whatever address the server binds: a spec chooses
code to run and what its sandbox may read, so deploying one is the operator's power, not a caller's.
`serving up` writes the token to a file only its user can read (`control_token_file`). No Ray here:
the gateway passes in what applies and deletes. Errors are raised; the app's handler answers them
(`serving.http.responses`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.config.spec import EndpointSpec, SpecError, parse_spec
from serving.errors import (
    AccessDeniedError,
    MissingAuthenticationTokenError,
    ValidationError,
)
from serving.http.bodies import read_bounded
from serving.http.responses import json_response

__all__ = ["MAX_SPEC_BYTES", "ControlRoutes", "control_token_file"]

MAX_SPEC_BYTES = 1_000_000


def control_token_file(port: int) -> Path:
    """Where `serving up` leaves the control token of the server on `port` (mode 0600, in a 0700
    folder)."""
    base = os.environ.get("SERVING_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".serving")
    return Path(base) / f"control-token-{port}"


class ControlRoutes:
    """The HTTP face of `serving apply` / `serving delete`."""

    def __init__(
        self,
        token: str,
        apply: Callable[[EndpointSpec], int],
        delete: Callable[[str], bool],
        describe: Callable[[str], Mapping[str, Any] | None],
    ) -> None:
        self._token = token
        self._apply, self._delete, self._describe = apply, delete, describe

    def routes(self) -> list[Route]:
        return [
            Route("/endpoints/{name}", self.put, methods=["PUT"]),
            Route("/endpoints/{name}", self.delete, methods=["DELETE"]),
        ]

    async def put(self, request: Request) -> Response:
        self._authorize(request)
        name = request.path_params["name"]
        body = await _read(request)
        try:
            document = json.loads(body)
            spec = parse_spec(document)
        # bad JSON, or a spec that does not validate (SpecError names the fields)
        except ValueError as error:
            kind = "spec" if isinstance(error, SpecError) else "JSON"
            raise ValidationError(f"invalid {kind}: {error}") from None
        if spec.EndpointName != name:
            raise ValidationError(
                f"the spec's EndpointName {spec.EndpointName!r} is not {name!r} (the URL's)"
            )
        existed = self._describe(name) is not None
        try:
            generation = await asyncio.to_thread(self._apply, spec)
        # refused while planned (a model's code/requirements.txt: control.runtime_env)
        except SpecError as error:
            raise ValidationError(f"invalid spec: {error}") from None
        return json_response(
            {
                "EndpointName": name,
                "EndpointStatus": "Updating" if existed else "Creating",
                "Generation": generation,
            }
        )

    async def delete(self, request: Request) -> Response:
        self._authorize(request)
        name = request.path_params["name"]
        if not await asyncio.to_thread(self._delete, name):
            raise ValidationError(f"Could not find endpoint {name}.")
        return json_response({"EndpointName": name, "EndpointStatus": "Deleting"})

    def _authorize(self, request: Request) -> None:
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise MissingAuthenticationTokenError(
                "changing endpoints needs the server's control token: 'Authorization: Bearer <token>' "
                "(serving up writes it to ~/.serving/control-token-PORT)"
            )
        if not hmac.compare_digest(presented.strip().encode(), self._token.encode()):
            raise AccessDeniedError("the control token is not this server's")


async def _read(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    return bytes(
        await read_bounded(request.stream(), MAX_SPEC_BYTES, _too_large, declared=declared)
    )


def _too_large(size: int | None) -> ValidationError:
    return ValidationError(f"a spec may be at most {MAX_SPEC_BYTES} bytes")
