"""What the sync and async clients share: payload codecs, request building, response
parsing and the retry policy. No I/O happens here, so both clients behave the same.
"""

from __future__ import annotations

import io
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from serving.client.exceptions import ServingClientError, error_from_response
from serving.client.replies import InvokeEndpointResponse
from serving.protocol import (  # the wire protocol's header names, shared with the server
    CSV,
    CUSTOM_ATTRIBUTES,
    INFERENCE_ID,
    INVOKED_VARIANT,
    JSON,
    NAME_PATTERN,
    NPY,
    OCTET_STREAM,
    TARGET_CONTAINER,
    TARGET_MODEL,
    TARGET_VARIANT,
)

# --- payloads ------------------------------------------------------------------------------


def encode_payload(data: Any, content_type: str | None) -> tuple[bytes, str]:
    """Request body and content type for `data`.

    bytes → as given (`application/octet-stream` unless told); str → UTF-8 (`text/csv` unless told);
    numpy array → NPY; pandas DataFrame → CSV without header or index (SageMaker's convention);
    anything else JSON-serializable (dict, list, numbers) → JSON. An explicit `content_type` that
    names JSON, CSV or NPY encodes a Python object that way.
    """
    media = (content_type or "").split(";")[0].strip().lower()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data), content_type or OCTET_STREAM
    if isinstance(data, str):
        return data.encode("utf-8"), content_type or CSV
    if _is_dataframe(data) and media in ("", CSV):
        return data.to_csv(header=False, index=False).encode("utf-8"), content_type or CSV
    if _is_ndarray(data) and media in ("", NPY):
        import numpy as np

        buffer = io.BytesIO()
        np.save(buffer, data, allow_pickle=False)
        return buffer.getvalue(), content_type or NPY
    if media == CSV:
        return _csv(data).encode("utf-8"), content_type or CSV
    if media == NPY:
        import numpy as np

        buffer = io.BytesIO()
        np.save(buffer, np.asarray(data), allow_pickle=False)
        return buffer.getvalue(), content_type or NPY
    if _is_ndarray(data) or _is_dataframe(data):
        data = data.tolist() if _is_ndarray(data) else data.to_numpy().tolist()
    try:
        return json.dumps(data, default=_json_default).encode("utf-8"), content_type or JSON
    except TypeError as error:
        raise TypeError(
            f"cannot encode a {type(data).__name__} payload: pass bytes, str, a numpy array, "
            f"a pandas DataFrame or JSON-serializable data ({error})"
        ) from None


def decode_payload(body: bytes, content_type: str | None) -> Any:
    """The response body as Python: JSON → objects, NPY → numpy array, text (CSV, plain) → str, else
    bytes."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media == JSON or media.endswith("+json"):
        return json.loads(body) if body else None
    if media == NPY:
        import numpy as np

        return np.load(io.BytesIO(body), allow_pickle=False)
    if media.startswith("text/"):
        return body.decode("utf-8", "replace")
    return body


def _is_ndarray(data: Any) -> bool:
    return type(data).__module__ == "numpy" and type(data).__name__ == "ndarray"


def _is_dataframe(data: Any) -> bool:
    return type(data).__name__ == "DataFrame" and hasattr(data, "to_csv")


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays inside a dict
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _csv(data: Any) -> str:
    rows = data.tolist() if hasattr(data, "tolist") else data
    if rows and not isinstance(rows[0], (list, tuple)):
        rows = [rows]
    return "".join(",".join(str(v) for v in row) + "\n" for row in rows)


# --- requests and results ---------------------------------------------------------------------


def invocation_path(endpoint: str) -> str:
    if not isinstance(endpoint, str) or not re.match(NAME_PATTERN, endpoint):
        raise ValueError(
            f"endpoint name {endpoint!r} is not valid: 1-63 letters, digits and hyphens, "
            "starting and ending with a letter or digit"
        )
    return f"/endpoints/{quote(endpoint)}/invocations"


def invocation_headers(
    content_type: str,
    accept: str | None,
    target: str | None,
    model: str | None,
    variant: str | None,
    custom_attributes: str | None,
    inference_id: str | None,
) -> dict[str, str]:
    headers = {"Content-Type": content_type}
    for name, value in (
        (TARGET_CONTAINER, target),
        (TARGET_MODEL, model),
        (TARGET_VARIANT, variant),
        (CUSTOM_ATTRIBUTES, custom_attributes),
        (INFERENCE_ID, inference_id),
    ):
        if value is not None:
            headers[name] = value
    headers["Accept"] = accept or "*/*"
    return headers


@dataclass
class InvokeResult:
    """One invocation's answer: the decoded body and what came with it."""

    body: Any  # decoded by content type (see decode_payload)
    content_type: str
    invoked_variant: str | None
    custom_attributes: str | None
    raw: bytes = field(repr=False)
    status_code: int = 200
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    retry_attempts: int = 0

    def to_boto3(self) -> InvokeEndpointResponse:
        """The dict boto3's `invoke_endpoint` returns, with a botocore StreamingBody as `Body`."""
        from botocore.response import StreamingBody

        response: InvokeEndpointResponse = {
            "Body": StreamingBody(io.BytesIO(self.raw), len(self.raw)),
            "ContentType": self.content_type,
            "InvokedProductionVariant": self.invoked_variant,
            "ResponseMetadata": {
                "HTTPStatusCode": self.status_code,
                "HTTPHeaders": dict(self.headers),
                "RetryAttempts": self.retry_attempts,
            },
        }
        if self.custom_attributes is not None:
            response["CustomAttributes"] = self.custom_attributes
        return response


def result_from_response(
    status_code: int, headers: Mapping[str, str], content: bytes, attempts: int
) -> InvokeResult:
    lowered = {k.lower(): v for k, v in headers.items()}
    content_type = lowered.get("content-type", OCTET_STREAM)
    return InvokeResult(
        body=decode_payload(content, content_type),
        content_type=content_type,
        invoked_variant=lowered.get(INVOKED_VARIANT.lower()),
        custom_attributes=lowered.get(CUSTOM_ATTRIBUTES.lower()),
        raw=content,
        status_code=status_code,
        headers=dict(lowered),
        retry_attempts=attempts,
    )


BOTO3_ARGUMENTS = {  # invoke_endpoint keyword -> invoke keyword
    "ContentType": "content_type",
    "Accept": "accept",
    "CustomAttributes": "custom_attributes",
    "TargetModel": "model",
    "TargetVariant": "variant",
    "TargetContainerHostname": "target",
    "InferenceId": "inference_id",
}


def boto3_arguments(arguments: Mapping[str, Any]) -> tuple[str, Any, dict[str, str]]:
    """(endpoint, body, invoke keywords) from boto3-style keywords; unknown ones are refused by
    name."""
    unknown = set(arguments) - set(BOTO3_ARGUMENTS) - {"EndpointName", "Body"}
    if unknown:
        raise TypeError(
            f"invoke_endpoint() got unsupported arguments: {', '.join(sorted(unknown))}"
        )
    for required in ("EndpointName", "Body"):
        if required not in arguments:
            raise TypeError(f"invoke_endpoint() missing required argument: {required}")
    body = arguments["Body"]
    if hasattr(body, "read"):  # boto3 accepts a file-like Body too
        body = body.read()
    if not isinstance(body, (bytes, bytearray, str)):
        raise TypeError(
            "invoke_endpoint(Body=...) takes bytes, str or a file-like object, as boto3 does"
        )
    options: dict[str, str] = {
        BOTO3_ARGUMENTS[k]: v for k, v in arguments.items() if k in BOTO3_ARGUMENTS
    }
    # what boto3 sends when ContentType is not given
    options.setdefault("content_type", OCTET_STREAM)
    return arguments["EndpointName"], body, options


# --- retries ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """Retries with exponential backoff and full jitter, for throttling and unavailability only.

    An attempt is retried when the server answered one of `retry_on_status` (429 ModelNotReady,
    502/503/504 unavailable) or the connection could not be made. 4xx answers other than 429 are
    never retried, and neither is a connection lost after the request was sent (the invocation
    may have run). `max_attempts=1` turns retries off (`RetryPolicy.none()`), which is what
    non-idempotent use wants. Delay before retry n (1-based): uniform(0, min(max_delay,
    base_delay * 2**(n-1))), or the server's `Retry-After` when it is longer.
    """

    max_attempts: int = 4
    base_delay: float = 0.1
    max_delay: float = 5.0
    retry_on_status: frozenset[int] = frozenset({429, 502, 503, 504})
    retry_connect_errors: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (1 = no retries)")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("delays must not be negative")
        if any(400 <= s < 500 and s != 429 for s in self.retry_on_status):
            raise ValueError(
                "4xx answers other than 429 describe the request: retrying cannot help"
            )

    @classmethod
    def none(cls) -> RetryPolicy:
        return cls(max_attempts=1)

    def delay(
        self, retry: int, retry_after: str | None = None, rng: random.Random | None = None
    ) -> float:
        """Seconds to wait before retry number `retry` (1 = the first retry)."""
        cap = min(self.max_delay, self.base_delay * 2 ** (retry - 1))
        wait = (rng or random).uniform(0, cap)
        if retry_after:
            try:
                wait = max(wait, min(float(retry_after), self.max_delay))
            except ValueError:
                pass
        return wait

    def should_retry_status(self, attempt: int, status_code: int) -> bool:
        return attempt < self.max_attempts and status_code in self.retry_on_status

    def should_retry_connect(self, attempt: int) -> bool:
        return attempt < self.max_attempts and self.retry_connect_errors


def raise_for_answer(
    status_code: int, headers: Mapping[str, str], content: bytes, attempts: int
) -> None:
    if status_code >= 400:
        raise error_from_response(status_code, headers, content, retry_attempts=attempts)


def describe_timeout(name: str, seconds: float, description: Mapping[str, Any] | None) -> str:
    status = (description or {}).get("EndpointStatus", "not found")
    return f"endpoint {name} is not InService after {seconds:g} s (last status: {status})"


__all__ = ["InvokeResult", "RetryPolicy", "ServingClientError", "decode_payload", "encode_payload"]
