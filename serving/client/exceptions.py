"""The SDK's exceptions: one per error code of the endpoint's wire protocol, under one base.

Each carries what the server said (`code`, `status_code`, `message`, the parsed body) and a
`response` dict shaped like botocore's `ClientError.response`, so code that inspects boto3
errors (`err.response["Error"]["Code"]`) reads these the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from serving.protocol import (
    CONTAINER_HOSTNAME,
    ERROR_STATUS,
    ERROR_TYPE_HEADER,
    LOG_STREAM_ARN,
    ORIGINAL_MESSAGE,
    ORIGINAL_STATUS_CODE,
    ErrorCode,
)


class ServingClientError(Exception):
    """Base of every error the SDK raises."""

    code = "ServingClientError"

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        retry_attempts: int = 0,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.body = dict(body or {})
        self.headers = dict(headers or {})
        self.retry_attempts = retry_attempts

    @property
    # botocore's shape, plus whatever the error body carries: open
    def response(self) -> dict[str, Any]:
        """botocore's `ClientError.response` shape: Error, ResponseMetadata and the body's extra
        fields."""
        extra = {k: v for k, v in self.body.items() if k not in ("__type", "message")}
        return {
            "Error": {"Code": self.code, "Message": self.message},
            "ResponseMetadata": {
                "HTTPStatusCode": self.status_code,
                "HTTPHeaders": self.headers,
                "RetryAttempts": self.retry_attempts,
            },
            **extra,
        }

    def __str__(self) -> str:
        status = f" ({self.status_code})" if self.status_code is not None else ""
        return f"{self.code}{status}: {self.message}"


class ValidationError(ServingClientError):
    """400: unknown endpoint or container, bad header, payload too large, a MultiModel TargetModel
    not found."""

    code = ErrorCode.VALIDATION


class AccessDenied(ServingClientError):
    """403: the caller is not allowed (policy), or could not be authenticated (the subclasses)."""

    code = ErrorCode.ACCESS_DENIED


class UnrecognizedClient(AccessDenied):
    """403: the access key id or API key is not one the endpoint knows."""

    code = ErrorCode.UNRECOGNIZED_CLIENT


class InvalidSignature(AccessDenied):
    """403: the Signature V4 did not verify (wrong secret, clock skew, another region)."""

    code = ErrorCode.INVALID_SIGNATURE


class MissingAuthenticationToken(AccessDenied):
    """403: the endpoint requires authentication and the request carried none."""

    code = ErrorCode.MISSING_AUTHENTICATION_TOKEN


class ModelError(ServingClientError):
    """424: the container answered an error (its model failed, or refused the input: 415 unsupported
    content type, 400 malformed body, 500 exception); says which container, what it answered, and
    where its logs are."""

    code = ErrorCode.MODEL_ERROR

    @property
    def original_status_code(self) -> int | None:
        return self.body.get(ORIGINAL_STATUS_CODE)

    @property
    def original_message(self) -> str | None:
        return self.body.get(ORIGINAL_MESSAGE)

    @property
    def container_hostname(self) -> str | None:
        return self.body.get(CONTAINER_HOSTNAME)

    @property
    def log_stream_arn(self) -> str | None:
        """Where the failing container's process writes its output (a file on its replica's
        node)."""
        return self.body.get(LOG_STREAM_ARN)


class ModelNotReady(ServingClientError):
    """429: the container has no ready replica yet or is at its concurrency limit (retried by
    default)."""

    code = ErrorCode.MODEL_NOT_READY


class UnknownOperation(ServingClientError):
    """404/405: no operation of the server has that path and method."""

    code = ErrorCode.UNKNOWN_OPERATION


class ServiceUnavailable(ServingClientError):
    """503: the endpoint cannot take requests (Failed, or the server is unavailable); retried by
    default."""

    code = ErrorCode.SERVICE_UNAVAILABLE


class InternalFailure(ServingClientError):
    """500: an unexpected failure inside the endpoint server."""

    code = ErrorCode.INTERNAL_FAILURE


class UnknownServerError(ServingClientError):
    """An error answer whose code this SDK does not know (a proxy's HTML page, a newer server)."""

    code = "UnknownError"


class ConnectionFailed(ServingClientError):
    """The server could not be reached (refused, DNS, reset before an answer, timeout)."""

    code = "ConnectionFailed"


class WaiterError(ServingClientError):
    """An endpoint did not become InService: it Failed, or the wait timed out."""

    code = "WaiterError"

    def __init__(self, message: str, *, last_description: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.last_description = dict(last_description or {})


_BY_CODE: dict[str, type[ServingClientError]] = {
    cls.code: cls
    for cls in (
        ValidationError,
        AccessDenied,
        UnrecognizedClient,
        InvalidSignature,
        MissingAuthenticationToken,
        ModelError,
        ModelNotReady,
        UnknownOperation,
        ServiceUnavailable,
        InternalFailure,
    )
}
_BY_STATUS: dict[int, type[ServingClientError]] = {
    ERROR_STATUS[cls.code]: cls
    for cls in (
        ValidationError,
        AccessDenied,
        ModelError,
        ModelNotReady,
        InternalFailure,
        ServiceUnavailable,
    )
}
# what proxies in front of a server answer
_BY_STATUS.update({502: ServiceUnavailable, 504: ServiceUnavailable})


def error_from_response(
    status_code: int, headers: Mapping[str, str], content: bytes, retry_attempts: int = 0
) -> ServingClientError:
    """The exception for an error answer: by its `__type` (or `x-amzn-ErrorType`), else by its
    status."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        body = json.loads(content) if content else {}
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    code = (
        str(body.get("__type") or lowered.get(ERROR_TYPE_HEADER.lower(), ""))
        .split(":")[0]
        .rsplit("#", 1)[-1]
    )
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status_code, UnknownServerError)
    message = str(
        body.get("message")
        or body.get("Message")
        or content[:500].decode("utf-8", "replace")
        or f"HTTP {status_code}"
    )
    return cls(
        message,
        status_code=status_code,
        body=body,
        headers=dict(headers),
        retry_attempts=retry_attempts,
    )


__all__ = [
    "AccessDenied",
    "ConnectionFailed",
    "InternalFailure",
    "InvalidSignature",
    "MissingAuthenticationToken",
    "ModelError",
    "ModelNotReady",
    "ServiceUnavailable",
    "ServingClientError",
    "UnknownOperation",
    "UnknownServerError",
    "UnrecognizedClient",
    "ValidationError",
    "WaiterError",
    "error_from_response",
]
