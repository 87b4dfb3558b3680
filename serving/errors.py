"""Error types of the data and control planes, and their one wire shape.

Every error carries its SageMaker error code and HTTP status; `wire_error` is the
only place that turns one into the `{"__type", "message"}` body botocore parses.
No web framework is imported here on purpose.
"""

from __future__ import annotations

import json
import re
from typing import Any

ERROR_TYPE_HEADER = "x-amzn-ErrorType"


class ServingError(Exception):
    """Base of every error the endpoint reports to a caller."""

    code = "InternalFailure"
    status = 500

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """The JSON document sent to the caller."""
        return {"__type": self.code, "message": self.message, **self.extra}


class ValidationError(ServingError):
    """The request is malformed: unknown endpoint/hostname, bad header, bad payload."""

    code = "ValidationError"
    status = 400


class HeadersTooLargeError(ValidationError):
    """The request line and headers exceed the server's size or count limit (HTTP 431, code ValidationError)."""

    status = 431


class RequestTimeoutError(ServingError):
    """The client sent its request too slowly (S3's code; botocore retries it as transient)."""

    code = "RequestTimeout"
    status = 408


class ThrottlingError(ServingError):
    """The gateway is holding as much unverified request data as it allows; retry shortly (botocore backs off)."""

    code = "ThrottlingException"
    status = 429


class AccessDeniedError(ServingError):
    """The caller may not invoke this endpoint, container or model."""

    code = "AccessDeniedException"
    status = 403


class UnrecognizedClientError(ServingError):
    """The access key id or API key is not one the endpoint knows."""

    code = "UnrecognizedClientException"
    status = 403


class InvalidSignatureError(ServingError):
    """The Signature V4 does not verify: wrong secret, tampered request, wrong scope, outside the time window."""

    code = "InvalidSignatureException"
    status = 403


class MissingAuthenticationTokenError(ServingError):
    """The endpoint requires authentication and the request carries none it can use."""

    code = "MissingAuthenticationTokenException"
    status = 403


class ModelNotReadyError(ServingError):
    """The container is not ready yet or is shedding load; retry later."""

    code = "ModelNotReadyException"
    status = 429


class ModelError(ServingError):
    """The container or its model failed; names the container and what it said."""

    code = "ModelError"
    status = 424

    def __init__(
        self,
        message: str,
        *,
        container: str,
        original_status: int,
        original_message: str,
        **extra: Any,
    ) -> None:
        super().__init__(
            message,
            OriginalStatusCode=original_status,
            OriginalMessage=original_message,
            ContainerHostname=container,
            **extra,
        )
        self.container = container
        self.original_status = original_status
        self.original_message = original_message


class ServiceUnavailableError(ServingError):
    """The endpoint cannot take requests at all (starting, failed, shutting down)."""

    code = "ServiceUnavailable"
    status = 503


class InternalFailureError(ServingError):
    """A bug or an unexpected failure inside the endpoint itself."""

    code = "InternalFailure"
    status = 500


# Raised inside a container replica: the router passes these through unchanged
# (they describe the caller's input), every other container failure is a ModelError.
PASS_THROUGH_CODES = frozenset({ValidationError.code, ModelNotReadyError.code})

_BY_CODE = {
    cls.code: cls
    for cls in (
        ValidationError,
        AccessDeniedError,
        ModelNotReadyError,
        ServiceUnavailableError,
        InternalFailureError,
    )
}


_PATH = re.compile(r"(?<![\w.~-])/[^\s'\"(),;<>\[\]]+")  # an absolute POSIX path (not a/b, not text/csv)


def failure_message(error: BaseException, limit: int = 1000) -> str:
    """`Type: message` of an unexpected failure for a caller: no paths of this machine, no traceback blocks.

    Frameworks put both in their messages (TorchScript and TensorFlow embed tracebacks, OSError its file).
    """
    kept, in_traceback = [], False
    for line in str(error).splitlines():
        stripped = line.strip()
        if stripped.startswith("Traceback"):
            in_traceback = True
            continue
        if in_traceback and (not stripped or line[:1].isspace()):
            continue  # frames and code excerpts are indented; the first flush line ends the block
        in_traceback = False
        if stripped:
            kept.append(stripped)
    text = _PATH.sub("<path>", " ".join(kept))
    return f"{type(error).__name__}: {text}"[:limit]


def wire_error(error: ServingError) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the response for `error`."""
    headers = {ERROR_TYPE_HEADER: error.code, "content-type": "application/json"}
    return error.status, headers, json.dumps(error.body()).encode()


def error_from_wire(body: bytes) -> ServingError | None:
    """Rebuild an error that a container sent in the wire shape, or None."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("__type") not in _BY_CODE:
        return None
    return _BY_CODE[doc["__type"]](str(doc.get("message", "")))
