"""InvokeEndpointAsync: admit now, answer 202, run the invocation later and leave its answer in S3.

`POST /endpoints/{name}/async-invocations` goes through the invocation pipeline's checks
(`Invocations.admit`: the same authentication, the IAM action `sagemaker:InvokeEndpointAsync`, the
chain, the headers), then its own: the endpoint has an AsyncInferenceConfig, the InputLocation lies
under its `InputConfig.S3InputPath`, the ids and limits are SageMaker's. It answers 202 with the
InferenceId and where the answer or the failure will be. The job then waits in the endpoint's
bounded queue, at most MaxConcurrentInvocationsPerInstance of them run at once through the same
pipeline (`Invocations.run`), and the last container's answer is written to
`<S3OutputPath>/<InferenceId>.out`, or the failure to `<S3FailurePath>/<InferenceId>-error.out`.

Each admitted job is recorded in a `Journal` (Ray's key-value store, `ray_wing.async_journal`)
before the 202 and forgotten once its answer or failure is written, so a gateway that is killed
loses none: another one takes over the jobs of a gateway gone silent and finishes each once
(docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from serving import protocol
from serving.access.policies import ACTION_INVOKE_ASYNC
from serving.access.sigv4 import RawRequest
from serving.errors import (
    InternalFailureError,
    ServiceUnavailableError,
    ServingError,
    ThrottlingError,
    ValidationError,
    wire_error,
)
from serving.gateway.admission import InvocationRequest
from serving.gateway.after_answer import AfterAnswer
from serving.gateway.async_jobs import (
    Job,
    Journal,
    Lane,
    TakenEntry,
    job_from_entry,
    job_from_request,
)
from serving.gateway.entry import invocation_frame
from serving.gateway.invocation import Invocations
from serving.http.responses import error_response
from serving.metrics.invocations import InvocationTrace
from serving.s3 import Clients, S3Location
from serving.settings import ServerSettings
from serving.tracing import spans as tracing

__all__ = ["AsyncInvocations"]

ASYNC_OPERATION = protocol.RUNTIME_OPERATIONS["async-invocations"]
ASYNC_RUN_OPERATION = f"{ASYNC_OPERATION} run"  # its own trace, linked to the admission's

logger = logging.getLogger("serving.gateway.async")

# a stopping gateway's unfinished jobs get this long to write their failure objects
CLOSE_GRACE_S = 10.0


class AsyncInvocations:
    """Serves `POST /endpoints/{name}/async-invocations` over the invocation pipeline."""

    KIND = "async"

    def __init__(
        self,
        settings: ServerSettings,
        invocations: Invocations,
        head: Callable[[Request], RawRequest],
        client: Callable[[str | None], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        journal: Journal | None = None,
        after: AfterAnswer | None = None,
    ) -> None:
        """`journal`: where admitted jobs outlive this gateway; None keeps them in memory only (a
        killed gateway loses them). `after`: the gateway's after-the-answer runner, which runs the
        jobs (bounded by their endpoints' queues here) and, when the gateway stops, cancels them
        (each writes its failure object within CLOSE_GRACE_S)."""
        self.settings, self.invocations, self.head, self.clock = settings, invocations, head, clock
        self.journal = journal
        self.after = after if after is not None else AfterAnswer()
        self.after.register(self.KIND, None, grace_s=CLOSE_GRACE_S)
        # one S3 client per store URL (serving.s3's, unless a test gives its own)
        self._client = Clients(client)
        self.lanes: dict[str, Lane] = {}

    def routes(self) -> list[Route]:
        return [Route(protocol.ASYNC_INVOCATIONS_PATH, self.invoke_async, methods=["POST"])]

    async def invoke_async(self, request: Request) -> Response:
        trace = InvocationTrace()
        invocation = InvocationRequest(
            request.path_params["name"], request.headers, request.stream, lambda: self.head(request)
        )
        async with invocation_frame(
            trace,
            "InvokeEndpointAsync",
            (ClientDisconnect,),
            carrier=request.headers,
            operation=ASYNC_OPERATION,
        ) as frame:
            admission = await self.invocations.admit(invocation, trace, action=ACTION_INVOKE_ASYNC)
            body = await self.invocations.body_of(invocation, admission, trace)
            job = job_from_request(admission, request.headers, body, self.clock())
            job.link = tracing.current_carrier()  # its run's trace links to this one
            lane = self._reserve(job)
            try:
                await self._record(job)
            except BaseException:
                lane.admitted -= 1
                raise
            self._enqueue(lane, job)
            frame.defer()  # admitted: its run counts it (`_invoke`), once
        if frame.aborted:
            return Response(status_code=499)
        if frame.error is not None:
            response = error_response(frame.error)
            if not trace.body_read:
                response.headers["connection"] = "close"
        else:
            response = Response(
                json.dumps({"InferenceId": job.inference_id}).encode(),
                status_code=202,
                media_type=protocol.JSON,
                headers={
                    protocol.OUTPUT_LOCATION: job.output.uri,
                    protocol.FAILURE_LOCATION: job.failure.uri,
                },
            )
        if frame.span is not None:
            response.headers[protocol.TRACE_ID] = frame.span.trace_id
        return response

    # --- admission --------------------------------------------------------------------------------
    def _reserve(self, job: Job, bounded: bool = True) -> Lane:
        """A place in the endpoint's queue, if it has room for one more job (else
        ThrottlingError)."""
        name = job.admission.endpoint.name
        concurrency = job.config.ClientConfig.MaxConcurrentInvocationsPerInstance
        lane = self.lanes.get(name)
        # new, or its config changed: new jobs, new bound
        if lane is None or lane.concurrency != concurrency:
            lane = self.lanes[name] = Lane(asyncio.Semaphore(concurrency), concurrency)
        if bounded and lane.admitted >= concurrency + self.settings.async_max_queued:
            raise ThrottlingError(
                f"endpoint {name} already holds {lane.admitted} InvokeEndpointAsync requests, as many as it queues "
                f"({self.settings.async_max_queued} waiting, SERVING_ASYNC_MAX_QUEUED, plus {concurrency} running); "
                "retry later"
            )
        lane.admitted += 1
        return lane

    async def _record(self, job: Job) -> None:
        if self.journal is None:
            return
        try:
            await asyncio.to_thread(self.journal.record, job.key, job.entry())
        except Exception as error:
            logger.error("async invocation %s could not be recorded: %s", job.inference_id, error)
            raise ServiceUnavailableError(
                "the request could not be recorded durably, so it was not accepted; retry shortly"
            ) from None

    async def _forget(self, job: Job) -> None:
        if self.journal is None:
            return
        try:
            await asyncio.to_thread(self.journal.remove, job.key)
        # it stays recorded: a gateway that takes it over finds its answer written
        except Exception as error:
            logger.error(
                "async invocation %s could not be removed from the journal: %s",
                job.inference_id,
                error,
            )

    def _enqueue(self, lane: Lane, job: Job) -> None:
        what = f"async invocation {job.inference_id} of endpoint {job.admission.endpoint.name}"
        # never dropped: "async" has no bound here
        self.after.submit(self.KIND, lambda: self._run(lane, job), what)

    # --- the job ----------------------------------------------------------------------------------
    async def _run(self, lane: Lane, job: Job) -> None:
        try:
            async with lane.slots:
                await self._invoke(job)
        # the gateway is stopping (`close`): say so where the caller looks
        except asyncio.CancelledError:
            stopped = ServiceUnavailableError(
                "the endpoint server stopped before this request finished; submit it again"
            )
            await self._write_failure(self._client(job.config.S3EndpointUrl), job, stopped)
            await self._forget(job)
            raise
        else:  # a bug of ours raises: the runner logs it; the caller finds neither object
            await self._forget(job)
        finally:
            lane.admitted -= 1

    # --- taking over a silent gateway's jobs ------------------------------------------------------
    async def take_over(self) -> int:
        """Run the jobs of gateways gone silent (call once the routing table is loaded); returns how
        many."""
        if self.journal is None:
            return 0
        taken = 0
        for entry in await asyncio.to_thread(self.journal.take_orphans):
            try:
                taken += await self._resume(entry)
            except Exception:
                logger.exception(
                    "async invocation %s could not be taken over", entry.get("inference_id")
                )
        return taken

    async def _resume(self, entry: TakenEntry) -> int:
        output, failure = S3Location(*entry["output"]), S3Location(*entry["failure"])
        client = self._client(entry["s3_endpoint_url"])
        if await self._written_since(
            client, output, entry["admitted_at"]
        ) or await self._written_since(client, failure, entry["admitted_at"]):
            await asyncio.to_thread(self.journal.remove, entry["key"])  # type: ignore[union-attr]
            # its gateway wrote the answer, then died before forgetting it: finished once already
            return 0
        route = self.invocations.endpoints.get(entry["endpoint"])
        config = route.async_inference if route is not None else None
        if route is None or config is None:
            gone = f"endpoint {entry['endpoint']} was deleted or lost its AsyncInferenceConfig before this request ran"
            _, _, body = wire_error(ServiceUnavailableError(gone + "; submit it again"))
            await self._put(client, failure, body, protocol.JSON)
            await asyncio.to_thread(self.journal.remove, entry["key"])  # type: ignore[union-attr]
            return 0
        job = job_from_entry(entry, route, config, self.clock())
        # admitted once already: beyond the bound if need be
        self._enqueue(self._reserve(job, bounded=False), job)
        logger.info(
            "async invocation %s of endpoint %s taken over from a silent gateway",
            job.inference_id,
            route.name,
        )
        return 1

    async def _written_since(self, client: Any, place: S3Location, since: float) -> bool:
        from botocore.exceptions import ClientError

        try:
            head = await asyncio.to_thread(client.head_object, Bucket=place.bucket, Key=place.key)
        except ClientError:
            return False
        return head["LastModified"].timestamp() >= since - 1.0  # S3's times are whole seconds

    async def _invoke(self, job: Job) -> None:
        admission = job.admission
        endpoint = admission.endpoint
        trace = InvocationTrace(endpoint=endpoint.name, mode=endpoint.mode, chain=admission.chain)
        trace.multi_model, trace.body_read = endpoint.multi_model, True
        client = self._client(job.config.S3EndpointUrl)
        result = None
        async with invocation_frame(
            trace, "an async invocation's run", operation=ASYNC_RUN_OPERATION, link=job.link
        ) as frame:
            waited = self.clock() - job.admitted
            if waited > job.ttl:
                raise ServiceUnavailableError(
                    f"the request expired: it waited {waited:.0f} s in the queue, longer than its "
                    f"RequestTTLSeconds ({job.ttl})"
                )
            body = (
                await self._read(client, job.source) if job.source is not None else job.body or b""
            )
            result = await self.invocations.run(
                admission, body, job.headers, trace, timeout=job.timeout
            )
        if frame.error is not None or result is None:
            await self._write_failure(
                client, job, frame.error or InternalFailureError("the run gave no answer")
            )
            return
        try:
            await self._put(client, job.output, result.body, result.content_type)
        except ServingError as error:
            await self._write_failure(client, job, error)

    async def _read(self, client: Any, source: S3Location) -> bytes:
        limit = self.settings.async_max_input_bytes

        def read() -> bytes:
            response = client.get_object(Bucket=source.bucket, Key=source.key)
            with response["Body"] as stream:
                if int(response.get("ContentLength") or 0) > limit:
                    raise ValidationError(
                        f"InputLocation {source.uri} holds more than {limit} bytes"
                    )
                data = stream.read(limit + 1)
            if len(data) > limit:
                raise ValidationError(f"InputLocation {source.uri} holds more than {limit} bytes")
            return data

        return await self._s3(f"read InputLocation {source.uri}", read)

    async def _put(self, client: Any, place: S3Location, body: bytes, content_type: str) -> None:
        await self._s3(
            f"write {place.uri}",
            lambda: client.put_object(
                Bucket=place.bucket, Key=place.key, Body=body, ContentType=content_type
            ),
        )

    async def _write_failure(self, client: Any, job: Job, error: ServingError) -> None:
        """The failure object: the error document InvokeEndpoint would have answered with (a
        container's own answer is in it, as OriginalStatusCode and OriginalMessage)."""
        _, _, body = wire_error(error)
        try:
            await self._put(client, job.failure, body, protocol.JSON)
        except ServingError as failed:
            logger.error(
                "async invocation %s: its failure could not be written either: %s",
                job.inference_id,
                failed,
            )

    async def _s3(self, what: str, call: Callable[[], Any]) -> Any:
        """One blocking S3 call off the event loop; a failure of the store as a ServingError naming
        it."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return await asyncio.to_thread(call)
        except ClientError as error:
            info = error.response.get("Error", {})
            raise ValidationError(
                f"cannot {what}: {info.get('Code')}: {info.get('Message')}"
            ) from None
        except BotoCoreError as error:
            raise ServiceUnavailableError(f"cannot {what}: {error}") from None
