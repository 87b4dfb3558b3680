"""Error types of the data and control planes, and their one wire shape.

Every error carries its SageMaker error code and HTTP status; `wire_error` is the
only place that turns one into the `{"__type", "message"}` body botocore parses.
No web framework is imported here on purpose.
"""

from __future__ import annotations

import json
import re
from typing import Any

from serving.protocol import (
    CONTAINER_HOSTNAME,
    ERROR_STATUS,
    ERROR_TYPE_HEADER,
    HEADERS_TOO_LARGE_STATUS,
    JSON,
    LOCAL_TFS_PATH,
    LOG_STREAM_ARN,
    ORIGINAL_MESSAGE,
    ORIGINAL_STATUS_CODE,
    UNSUPPORTED_MEDIA_TYPE_STATUS,
    ErrorCode,
)

# An error's wire document: `__type`, `message`, and the fields its kind adds (a ModelError's
# original status, a throttle's retry hint ...): open, each kind has its own.
ErrorJson = dict[str, Any]


class ServingError(Exception):
    """Base of every error the endpoint reports to a caller."""

    code = ErrorCode.INTERNAL_FAILURE
    status = ERROR_STATUS[code]

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra

    def body(self) -> ErrorJson:
        """The JSON document sent to the caller."""
        return {"__type": self.code, "message": self.message, **self.extra}

    def wire_headers(self) -> dict[str, str]:
        """Headers its protocol adds to the answer, beside the error type's."""
        return {}

    @property
    def counted_status(self) -> int:
        """The status the 4XX/5XX error metrics count it under (ModelError: what the model
        answered)."""
        return self.status


class ValidationError(ServingError):
    """The request is malformed: unknown endpoint/hostname, bad header, bad payload."""

    code = ErrorCode.VALIDATION
    status = ERROR_STATUS[code]


class UnknownOperationError(ServingError):
    """No operation of this server has that path and method (404; 405 for a known path with another
    method)."""

    code = ErrorCode.UNKNOWN_OPERATION
    status = ERROR_STATUS[code]

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class HeadersTooLargeError(ValidationError):
    """The request line and headers exceed the server's size or count limit (HTTP 431, code
    ValidationError)."""

    status = HEADERS_TOO_LARGE_STATUS


class UnsupportedFormatError(ValidationError):
    """A content type or Accept the decoders and encoders lack: a container answers it with 415, as
    the toolkits' `UnsupportedFormatError` (the caller sees ModelError, OriginalStatusCode 415)."""

    status = UNSUPPORTED_MEDIA_TYPE_STATUS


class RequestTimeoutError(ServingError):
    """The client sent its request too slowly (S3's code; botocore retries it as transient)."""

    code = ErrorCode.REQUEST_TIMEOUT
    status = ERROR_STATUS[code]


class ThrottlingError(ServingError):
    """The gateway is holding as much unverified request data as it allows; retry shortly (botocore
    backs off)."""

    code = ErrorCode.THROTTLING
    status = ERROR_STATUS[code]


class AccessDeniedError(ServingError):
    """The caller may not invoke this endpoint, container or model."""

    code = ErrorCode.ACCESS_DENIED
    status = ERROR_STATUS[code]


class UnrecognizedClientError(ServingError):
    """The access key id or API key is not one the endpoint knows."""

    code = ErrorCode.UNRECOGNIZED_CLIENT
    status = ERROR_STATUS[code]


class InvalidSignatureError(ServingError):
    """The Signature V4 does not verify: wrong secret, tampered request, wrong scope, outside the
    time window."""

    code = ErrorCode.INVALID_SIGNATURE
    status = ERROR_STATUS[code]


class MissingAuthenticationTokenError(ServingError):
    """The endpoint requires authentication and the request carries none it can use."""

    code = ErrorCode.MISSING_AUTHENTICATION_TOKEN
    status = ERROR_STATUS[code]


class ModelNotReadyError(ServingError):
    """The container is not ready yet or is shedding load; retry later."""

    code = ErrorCode.MODEL_NOT_READY
    status = ERROR_STATUS[code]


class ModelError(ServingError):
    """The container or its model failed; names the container and what it said."""

    code = ErrorCode.MODEL_ERROR
    status = ERROR_STATUS[code]

    def __init__(
        self,
        message: str,
        *,
        container: str,
        original_status: int,
        original_message: str,
        log_stream: str | None = None,
        counted_as: int | None = None,
        **extra: Any,
    ) -> None:
        fields: ErrorJson = {
            ORIGINAL_STATUS_CODE: original_status,
            ORIGINAL_MESSAGE: original_message,
            CONTAINER_HOSTNAME: container,
        }
        if log_stream:
            fields[LOG_STREAM_ARN] = log_stream
        super().__init__(message, **fields, **extra)
        self.container = container
        self.original_status = original_status
        self.original_message = original_message
        self.log_stream = log_stream
        # where the model gave no status of its own (a timeout): what to count
        self.counted_as = counted_as

    @property
    def counted_status(self) -> int:
        """The model's own status, as SageMaker's Invocation4XXErrors / Invocation5XXErrors count a
        ModelError."""
        return self.counted_as or self.original_status


class ContainerError(ServingError):
    """A container's answer for a failure of its model, runtime or handler, sent with the
    container's own status; the router reports it to the caller as ModelError 424 with that status
    as OriginalStatusCode.

    `of(error)` gives the status AWS's inference toolkits give: an exception carrying an integer
    `status_code` (their `BaseInferenceToolkitError` shape: `status_code`, `message`, `phrase`) its
    own, a `ServingError` its status (415 unsupported content type, 400 malformed body), anything
    else 500.
    """

    code = ErrorCode.MODEL_ERROR

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status

    @classmethod
    def of(cls, error: BaseException) -> ContainerError:
        if isinstance(error, ContainerError):
            return error
        if isinstance(error, ServingError):
            return cls(error.message, error.status)
        status = getattr(error, "status_code", None)
        if isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 599:
            message = getattr(error, "message", None)
            return cls(
                str(message if message is not None else error)[:MAX_ORIGINAL_MESSAGE], status
            )
        return cls(failure_message(error), ERROR_STATUS[ErrorCode.INTERNAL_FAILURE])


class ContainerAnswerError(ServingError):
    """A framework container's own error answer, sent as it is (status, body, content type), not in
    our wire shape: SageMaker's TensorFlow Serving container answers `{"error": ...}` bodies of its
    own, which the router reports as ModelError with that status and body as OriginalStatusCode and
    OriginalMessage."""

    def __init__(self, status: int, body: bytes, content_type: str = JSON) -> None:
        super().__init__(body.decode("utf-8", "replace"))
        self.status = status
        self.raw = body
        self.content_type = content_type


class ServiceUnavailableError(ServingError):
    """The endpoint cannot take requests at all (starting, failed, shutting down)."""

    code = ErrorCode.SERVICE_UNAVAILABLE
    status = ERROR_STATUS[code]


class InternalFailureError(ServingError):
    """A bug or an unexpected failure inside the endpoint itself."""

    code = ErrorCode.INTERNAL_FAILURE
    status = ERROR_STATUS[code]


class ApiValidationError(ServingError):
    """A control-plane API request that cannot be done as asked (SageMaker's
    ValidationException)."""

    code = ErrorCode.API_VALIDATION
    status = ERROR_STATUS[code]


class ResourceLimitExceededError(ServingError):
    """A control-plane request that needs more than this runtime can place (SageMaker's
    ResourceLimitExceeded)."""

    code = ErrorCode.RESOURCE_LIMIT_EXCEEDED
    status = ERROR_STATUS[code]


class ResourceInUseError(ServingError):
    """A resource another one still depends on (SageMaker's ResourceInUse)."""

    code = ErrorCode.RESOURCE_IN_USE
    status = ERROR_STATUS[code]


class ObjectNotFoundError(ServingError):
    """Application Auto Scaling's ObjectNotFoundException: no such scalable target or policy."""

    code = ErrorCode.OBJECT_NOT_FOUND
    status = ERROR_STATUS[code]


class UnknownApiOperationError(ServingError):
    """An X-Amz-Target this server does not implement."""

    code = ErrorCode.UNKNOWN_API_OPERATION
    status = 400


# A container's platform answers (marked with protocol.PLATFORM_ERROR) that the router passes
# through as they are, as SageMaker reports them; every other error a container answers is a
# ModelError.
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


MAX_ORIGINAL_MESSAGE = 1024  # characters of a container's error message kept as OriginalMessage

# an absolute POSIX path (not a/b, not text/csv)
_PATH = re.compile(r"(?<![\w.~-])/[^\s'\"(),;<>\[\]]+")


# A tensorflow container's own TF Serving route, with the token that lets a caller use it
# (`context.rest_uri`).
_CAPABILITY_URL = re.compile(
    rf"(?:[a-z]+://[^\s'\"/]+)?{re.escape(LOCAL_TFS_PATH)}/[^\s'\"]*", re.IGNORECASE
)


def without_capabilities(text: str) -> str:
    """`text` with every URL of a container's TF Serving route (and its token) replaced by
    `<rest_uri>`: requests' errors name the URL they failed on, and answers and logs are read by
    others than the model's own code."""
    return _CAPABILITY_URL.sub("<rest_uri>", text)


def failure_message(error: BaseException, limit: int = 1000) -> str:
    """`Type: message` of an unexpected failure for a caller: no paths of this machine, no traceback
    blocks.

    Frameworks put both in their messages (TorchScript and TensorFlow embed tracebacks, OSError its
    file).
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
    headers = {ERROR_TYPE_HEADER: error.code, "content-type": JSON}
    headers.update(error.wire_headers())
    return error.status, headers, json.dumps(error.body()).encode()


def message_from_wire(body: bytes) -> str:
    """The message of an error answer: its JSON `message` (or `Message`), else its text."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        message = doc.get("message", doc.get("Message"))
        if isinstance(message, str):
            return message[:MAX_ORIGINAL_MESSAGE]
    return bytes(body[:MAX_ORIGINAL_MESSAGE]).decode("utf-8", "replace")


def error_from_wire(body: bytes) -> ServingError | None:
    """Rebuild an error that a container sent in the wire shape, or None."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("__type") not in _BY_CODE:
        return None
    return _BY_CODE[doc["__type"]](str(doc.get("message", "")))
