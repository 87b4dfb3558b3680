"""`Client` and `AsyncClient`: the same methods over httpx, one blocking, one async.

Each only drives the calls `_flows` writes once, with its own I/O.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from serving.client import _core
from serving.client._core import InvokeResult
from serving.client._flows import Flow, _Answer, _Base, _Sleep
from serving.client.exceptions import ServingClientError
from serving.client.replies import EndpointDescription, EndpointSummary, InvokeEndpointResponse


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
                    response = self._http.request(
                        step.method, step.path, headers=step.headers, content=step.body
                    )
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
                endpoint,
                data,
                target,
                model,
                content_type,
                accept,
                custom_attributes,
                inference_id,
                variant,
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
                    response = await self._http.request(
                        step.method, step.path, headers=step.headers, content=step.body
                    )
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
                endpoint,
                data,
                target,
                model,
                content_type,
                accept,
                custom_attributes,
                inference_id,
                variant,
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
