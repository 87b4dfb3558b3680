"""What a caller is told when a container fails an invocation: SageMaker's shapes for a container's
answers.

SageMaker reports every non-2xx answer of a model container as `ModelError` 424 with the container's
status (`OriginalStatusCode`), its message (`OriginalMessage`) and where its logs are
(`LogStreamArn`); only the platform's own refusals keep their code (a MultiModel TargetModel that
does not exist is a `ValidationError`). A container marks those with a header
(`protocol.PLATFORM_ERROR`), so no code a model raises passes for them.
"""

from __future__ import annotations

from serving.errors import (
    PASS_THROUGH_CODES,
    ModelError,
    ServingError,
    error_from_wire,
    message_from_wire,
)
from serving.gateway.transport import HopResponse


def timed_out(container: str, timeout: float) -> ModelError:
    return ModelError(
        f"Your invocation timed out while waiting for a response from container {container} ({timeout:g} s).",
        container=container,
        original_status=408,
        original_message="invocation timeout",
        # the model never answered: the server's failure (5XX), never the caller's (4XX)
        counted_as=504,
    )


def container_failure(
    endpoint: str,
    container: str,
    position: int,
    length: int,
    response: HopResponse,
) -> ServingError:
    """What the caller is told of a container's error answer: the platform's own refusals (marked by
    the container, never by a code a model could raise) as they are, everything else as SageMaker
    reports it: ModelError 424 with the container's status and message, and where its logs are."""
    where = (
        f"container {container}"
        if length == 1
        else f"container {container} (position {position} of {length})"
    )
    if response.platform:
        reported = error_from_wire(response.body)
        if reported is not None and reported.code in PASS_THROUGH_CODES:
            reported.message = f"{where}: {reported.message}"
            return reported
    original = message_from_wire(response.body)
    kind = "client" if response.status < 500 else "server"
    see = f" See {response.log_stream} for more information." if response.log_stream else ""
    return ModelError(
        f'Received {kind} error ({response.status}) from {where} with message "{original}".{see}',
        container=container,
        original_status=response.status,
        original_message=original,
        log_stream=response.log_stream,
    )
