"""`Client` and `AsyncClient`: the same methods over httpx, one blocking, one async.

Each call is written once, as a generator that yields what it needs done (send this
request, sleep this long) and receives the outcome; each client only drives those
generators with its own I/O. So retries, signing and error mapping cannot drift apart
between the two.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from serving import protocol
from serving.client import _core
from serving.client._core import InvokeResult, RetryPolicy
from serving.client.credentials import Authenticator, resolve
from serving.client.exceptions import (
    ConnectionFailed,
    ServingClientError,
    ValidationError,
    WaiterError,
)
from serving.client.replies import EndpointDescription, EndpointSummary, InvokeEndpointResponse

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
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
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
                sent = "" if isinstance(outcome, _NOT_SENT) else " (the request may have been processed)"
                raise ConnectionFailed(
                    f"{method} {self.base_url}{path} failed after {attempt} attempt(s): "
                    f"{type(outcome).__name__}: {outcome}{sent}",
                    retry_attempts=attempt - 1,
                )
            if self.retry.should_retry_status(attempt, outcome.status_code):
                yield _Sleep(self.retry.delay(attempt, outcome.headers.get("retry-after")))
                continue
            _core.raise_for_answer(outcome.status_code, outcome.headers, outcome.content, attempt - 1)
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
        return _core.result_from_response(answer.status_code, answer.headers, answer.content, answer.attempts)

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
                    f"endpoint {name} Failed: {(description or {}).get('FailureReason')}", last_description=description
                )
            if time.monotonic() + poll_interval > deadline:
                raise WaiterError(_core.describe_timeout(name, timeout, description), last_description=description)
            yield _Sleep(poll_interval)

    def _ping_flow(self) -> Flow:
        outcome = yield _Send("GET", protocol.PING_PATH, {}, b"")
        return not isinstance(outcome, Exception) and outcome.status_code == 200


def _answer(response: httpx.Response) -> _Answer:
    return _Answer(response.status_code, response.headers, response.content)


class Client(_Base):
    """Blocking client of a serving endpoint server (httpx, pooled connections).

    Authentication, in this order: `api_key` (bearer); `aws_access_key_id` +
    `aws_secret_access_key` (SigV4); `profile_name`; the `SERVING_API_KEY` environment variable;
    AWS credentials from the environment or shared files (SigV4, like boto3); else none.
    `sign=False` never authenticates; `sign=True` requires AWS credentials. The signing region is
    `region_name`, the profile's or `AWS_DEFAULT_REGION`, else us-east-1 (the server's
    `SERVING_REGION` must match).

        from serving.client import Client
        with Client("http://127.0.0.1:8080") as client:
            print(client.invoke("mce-demo", [[5.1, 3.5, 1.4, 0.2]], target="iris").body)
    """

    def __init__(self, base_url: str | None = None, **options: Any) -> None:
        super().__init__(base_url, **options)
        self._http = httpx.Client(**self._options)

    def _run(self, flow: Flow) -> Any:
        step = next(flow)
        while True:
            try:
                if isinstance(step, _Sleep):
                    time.sleep(step.seconds)
                    step = flow.send(None)
                    continue
                try:
                    response = self._http.request(step.method, step.path, headers=step.headers, content=step.body)
                    outcome: Any = _answer(response)
                except httpx.TransportError as error:
                    outcome = error
                step = flow.send(outcome)
            except StopIteration as stop:
                return stop.value

    def invoke(
        self,
        endpoint: str,
        data: Any,
        *,
        target: str | None = None,
        model: str | None = None,
        content_type: str | None = None,
        accept: str | None = None,
        custom_attributes: str | None = None,
        inference_id: str | None = None,
        variant: str | None = None,
    ) -> InvokeResult:
        """Invoke `endpoint` with `data` (bytes, str, dict/list, numpy array, pandas DataFrame).

        `target`: the container (Direct endpoints); `model`: TargetModel (MultiModel containers);
        raises a `ServingClientError` subclass for every error answer.
        """
        return self._run(
            self._invoke_flow(
                endpoint, data, target, model, content_type, accept, custom_attributes, inference_id, variant
            )
        )

    def invoke_endpoint(self, **arguments: Any) -> InvokeEndpointResponse:
        """boto3's `sagemaker-runtime` `invoke_endpoint`: same keywords, same response dict."""
        endpoint, body, options = _core.boto3_arguments(arguments)
        return self.invoke(endpoint, body, **options).to_boto3()

    def list_endpoints(self) -> list[EndpointSummary]:
        return self._run(self._get_json_flow("/endpoints"))["Endpoints"]

    def describe_endpoint(self, name: str) -> EndpointDescription:
        return self._run(self._describe_flow(name))

    def wait_until_in_service(
        self, name: str, *, timeout: float = 600.0, poll_interval: float = 1.0
    ) -> EndpointDescription:
        """Poll until `name` is InService (returns its description); WaiterError if it Fails or
        times out."""
        return self._run(self._wait_flow(name, timeout, poll_interval))

    def ping(self) -> bool:
        """True when every endpoint on the server is InService (`GET /ping`)."""
        return self._run(self._ping_flow())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncClient(_Base):
    """The asyncio twin of `Client`: same constructor, same methods, awaited.

    async with AsyncClient("http://127.0.0.1:8080") as client:
        result = await client.invoke("mce-demo", [[5.1, 3.5, 1.4, 0.2]], target="iris")
    """

    def __init__(self, base_url: str | None = None, **options: Any) -> None:
        super().__init__(base_url, **options)
        self._http = httpx.AsyncClient(**self._options)

    async def _run(self, flow: Flow) -> Any:
        step = next(flow)
        while True:
            try:
                if isinstance(step, _Sleep):
                    await asyncio.sleep(step.seconds)
                    step = flow.send(None)
                    continue
                try:
                    response = await self._http.request(step.method, step.path, headers=step.headers, content=step.body)
                    outcome: Any = _answer(response)
                except httpx.TransportError as error:
                    outcome = error
                step = flow.send(outcome)
            except StopIteration as stop:
                return stop.value

    async def invoke(
        self,
        endpoint: str,
        data: Any,
        *,
        target: str | None = None,
        model: str | None = None,
        content_type: str | None = None,
        accept: str | None = None,
        custom_attributes: str | None = None,
        inference_id: str | None = None,
        variant: str | None = None,
    ) -> InvokeResult:
        """See `Client.invoke`."""
        return await self._run(
            self._invoke_flow(
                endpoint, data, target, model, content_type, accept, custom_attributes, inference_id, variant
            )
        )

    async def invoke_endpoint(self, **arguments: Any) -> InvokeEndpointResponse:
        """See `Client.invoke_endpoint`."""
        endpoint, body, options = _core.boto3_arguments(arguments)
        return (await self.invoke(endpoint, body, **options)).to_boto3()

    async def list_endpoints(self) -> list[EndpointSummary]:
        return (await self._run(self._get_json_flow("/endpoints")))["Endpoints"]

    async def describe_endpoint(self, name: str) -> EndpointDescription:
        return await self._run(self._describe_flow(name))

    async def wait_until_in_service(
        self, name: str, *, timeout: float = 600.0, poll_interval: float = 1.0
    ) -> EndpointDescription:
        """See `Client.wait_until_in_service`."""
        return await self._run(self._wait_flow(name, timeout, poll_interval))

    async def ping(self) -> bool:
        return await self._run(self._ping_flow())

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


__all__ = ["AsyncClient", "Client", "ServingClientError"]
