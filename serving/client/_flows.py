"""What `Client` and `AsyncClient` do, written once: each call is a generator that yields what it
needs done (`_Send` this request, `_Sleep` this long) and receives the outcome, so retries, signing
and error mapping cannot drift apart between the two. No I/O here; `_clients` drives the generators.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from serving import protocol
from serving.client import _core
from serving.client._core import RetryPolicy
from serving.client.credentials import Authenticator, resolve
from serving.client.exceptions import (
    ConnectionFailed,
    ValidationError,
    WaiterError,
)
from serving.client.replies import EndpointDescription

DEFAULT_URL = "http://127.0.0.1:8080"
# Read timeout above the server's default 60 s invocation timeout, so the server's answer wins.
DEFAULT_TIMEOUT = httpx.Timeout(70.0, connect=5.0)


@dataclass(frozen=True)
class _Send:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class _Sleep:
    seconds: float


@dataclass
class _Answer:
    status_code: int
    headers: Mapping[str, str]
    content: bytes
    attempts: int = 0  # retries before this answer


Flow = Generator[Any, Any, Any]
# Failures before the request was sent: safe to retry. Any other transport error may have
# reached the container (a read timeout, a reset mid-answer), so it is reported, not retried.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class _Base:
    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        profile_name: str | None = None,
        region_name: str | None = None,
        sign: bool | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        max_connections: int = 100,
        headers: Mapping[str, str] | None = None,
        transport: Any = None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("SERVING_URL") or DEFAULT_URL).rstrip("/")
        self.auth: Authenticator = resolve(
            api_key=api_key,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
            profile_name=profile_name,
            region_name=region_name,
            sign=sign,
        )
        self.retry = retry or RetryPolicy()
        self._options = dict(
            base_url=self.base_url,
            timeout=timeout,
            headers=dict(headers or {}),
            transport=transport,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r}, auth={self.auth!r})"

    # --- flows (no I/O) ---------------------------------------------------------------------
    def _request_flow(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Flow:
        """Send with signing per attempt and retries; returns the (final) successful answer."""
        attempt = 0
        while True:
            attempt += 1
            signed = {**headers, **self.auth.headers(method, self.base_url + path, headers, body)}
            outcome = yield _Send(method, path, signed, body)
            if isinstance(outcome, Exception):
                if isinstance(outcome, _NOT_SENT) and self.retry.should_retry_connect(attempt):
                    yield _Sleep(self.retry.delay(attempt))
                    continue
                sent = (
                    ""
                    if isinstance(outcome, _NOT_SENT)
                    else " (the request may have been processed)"
                )
                raise ConnectionFailed(
                    f"{method} {self.base_url}{path} failed after {attempt} attempt(s): "
                    f"{type(outcome).__name__}: {outcome}{sent}",
                    retry_attempts=attempt - 1,
                )
            if self.retry.should_retry_status(attempt, outcome.status_code):
                yield _Sleep(self.retry.delay(attempt, outcome.headers.get("retry-after")))
                continue
            _core.raise_for_answer(
                outcome.status_code, outcome.headers, outcome.content, attempt - 1
            )
            outcome.attempts = attempt - 1
            return outcome

    def _invoke_flow(
        self,
        endpoint: str,
        data: Any,
        target: str | None,
        model: str | None,
        content_type: str | None,
        accept: str | None,
        custom_attributes: str | None,
        inference_id: str | None,
        variant: str | None,
    ) -> Flow:
        path = _core.invocation_path(endpoint)
        body, content_type = _core.encode_payload(data, content_type)
        headers = _core.invocation_headers(
            content_type, accept, target, model, variant, custom_attributes, inference_id
        )
        answer = yield from self._request_flow("POST", path, headers, body)
        return _core.result_from_response(
            answer.status_code, answer.headers, answer.content, answer.attempts
        )

    def _get_json_flow(self, path: str) -> Flow:
        answer = yield from self._request_flow("GET", path, {"Accept": protocol.JSON}, b"")
        return _core.decode_payload(answer.content, protocol.JSON)

    def _describe_flow(self, name: str) -> Flow:
        _core.invocation_path(name)  # validates the name
        return (yield from self._get_json_flow(f"/endpoints/{name}"))

    def _wait_flow(self, name: str, timeout: float, poll_interval: float) -> Flow:
        deadline = time.monotonic() + timeout
        description: EndpointDescription | None = None
        while True:
            try:
                description = yield from self._describe_flow(name)
            except ValidationError:  # not registered yet: deploying is asynchronous
                description = None
            status = (description or {}).get("EndpointStatus")
            if status == "InService":
                return description
            if status == "Failed":
                raise WaiterError(
                    f"endpoint {name} Failed: {(description or {}).get('FailureReason')}",
                    last_description=description,
                )
            if time.monotonic() + poll_interval > deadline:
                raise WaiterError(
                    _core.describe_timeout(name, timeout, description), last_description=description
                )
            yield _Sleep(poll_interval)

    def _ping_flow(self) -> Flow:
        outcome = yield _Send("GET", protocol.PING_PATH, {}, b"")
        return not isinstance(outcome, Exception) and outcome.status_code == 200
