"""serving.gateway.async_invocations without Ray: the queue bound, RequestTTLSeconds, the failure
object.

The invocation pipeline is replaced by a stand-in whose `run` waits for the test to release it (the
real pipeline is exercised end to end in tests/integration/test_async_invocations.py); S3 is moto's
ThreadedMotoServer, a real HTTP server on loopback speaking the S3 API, since no cloud is reachable
here.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import boto3
import pytest
from moto.server import ThreadedMotoServer
from starlette.applications import Starlette
from starlette.testclient import TestClient

from serving import protocol
from serving.access.policies import ACTION_INVOKE_ASYNC
from serving.config.async_inference import AsyncInferenceConfig
from serving.errors import ModelError
from serving.gateway.admission import Admission, EndpointRoute, InvocationResult
from serving.gateway.async_invocations import AsyncInvocations
from serving.gateway.async_jobs import job_from_request
from serving.settings import ServerSettings

WAIT_S = 10


@pytest.fixture(scope="module")
def s3():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket="jobs")
    client.put_object(Bucket="jobs", Key="in/x.json", Body=b"[1, 2]")
    yield client
    server.stop()


class Pipeline:
    """Stands in for Invocations: admits every request for `route`; `run` answers once released."""

    def __init__(self, route: EndpointRoute, fail: bool = False) -> None:
        self.route, self.fail = route, fail
        # the routing table a gateway that takes a job over reads
        self.endpoints = {route.name: route}
        self.release = threading.Event()
        self.actions: list[str | None] = []
        self.ran: list[tuple[bytes, dict]] = []

    async def admit(self, request, trace, action=None):
        self.actions.append(action)
        return Admission(self.route, self.route.containers, None, None)

    async def body_of(self, request, admission, trace):
        return b"".join([chunk async for chunk in request.body()])

    async def run(self, admission, body, headers, trace, timeout=None):
        await asyncio.to_thread(self.release.wait, WAIT_S)
        self.ran.append((body, dict(headers)))
        if self.fail:
            raise ModelError(
                "Received server error (500) from container only",
                container="only",
                original_status=500,
                original_message="boom",
            )
        return InvocationResult(b"answer to " + bytes(body), "application/json")


def serve(
    pipeline: Pipeline, s3, clock=time.monotonic, **settings
) -> tuple[TestClient, AsyncInvocations]:
    handler = AsyncInvocations(
        ServerSettings(**settings),
        pipeline,
        head=lambda request: None,  # type: ignore[arg-type]
        client=lambda url: s3,
        clock=clock,
    )
    return TestClient(Starlette(routes=handler.routes())), handler


def route(concurrency: int = 1) -> EndpointRoute:
    config = AsyncInferenceConfig.model_validate(
        {
            "ClientConfig": {"MaxConcurrentInvocationsPerInstance": concurrency},
            "OutputConfig": {"S3OutputPath": "s3://jobs/out", "S3FailurePath": "s3://jobs/failed"},
            "InputConfig": {"S3InputPath": "s3://jobs/in"},
        }
    )
    return EndpointRoute("e", "Direct", ("only",), async_inference=config)


def read(s3, key: str) -> bytes:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return s3.get_object(Bucket="jobs", Key=key)["Body"].read()
        except s3.exceptions.NoSuchKey:
            assert time.monotonic() < deadline, f"{key} was not written"
            time.sleep(0.05)


def test_a_job_reads_its_input_and_writes_its_answer(s3) -> None:
    pipeline = Pipeline(route())
    pipeline.release.set()
    client, _ = serve(pipeline, s3)
    with client:
        response = client.post(
            "/endpoints/e/async-invocations",
            headers={
                protocol.INPUT_LOCATION: "s3://jobs/in/x.json",
                protocol.ASYNC_CONTENT_TYPE: "application/json",
                protocol.ASYNC_ACCEPT: "text/csv",
                protocol.INFERENCE_ID: "job-1",
            },
        )
        assert response.status_code == 202
        assert response.json() == {"InferenceId": "job-1"}
        assert response.headers[protocol.OUTPUT_LOCATION] == "s3://jobs/out/job-1.out"
        assert response.headers[protocol.FAILURE_LOCATION] == "s3://jobs/failed/job-1-error.out"
        assert read(s3, "out/job-1.out") == b"answer to [1, 2]"
    assert pipeline.actions == [ACTION_INVOKE_ASYNC]
    body, headers = pipeline.ran[0]
    assert headers == {
        "content-type": "application/json",
        "accept": "text/csv",
        protocol.INFERENCE_ID: "job-1",
    }


def test_a_full_queue_answers_429_and_frees_up(s3) -> None:
    pipeline = Pipeline(route(concurrency=1))
    client, handler = serve(pipeline, s3, async_max_queued=1)
    with client:
        ask = lambda: client.post(
            "/endpoints/e/async-invocations",
            headers={protocol.INPUT_LOCATION: "s3://jobs/in/x.json"},
        )
        assert [ask().status_code for _ in range(2)] == [202, 202]  # one running, one waiting
        refused = ask()
        assert refused.status_code == 429 and refused.json()["__type"] == "ThrottlingException"
        pipeline.release.set()
        deadline = time.monotonic() + WAIT_S
        while handler.lanes["e"].admitted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ask().status_code == 202


def test_an_expired_request_is_failed_without_running(s3) -> None:
    pipeline = Pipeline(route(concurrency=1))
    now = [1000.0]
    client, _ = serve(pipeline, s3, clock=lambda: now[0])
    with client:
        ask = lambda ttl: client.post(
            "/endpoints/e/async-invocations",
            headers={protocol.INPUT_LOCATION: "s3://jobs/in/x.json", protocol.REQUEST_TTL: ttl},
        ).json()["InferenceId"]
        first, second = ask("60"), ask("60")  # the second waits behind the first
        now[0] += 61
        pipeline.release.set()
        assert read(s3, f"out/{first}.out") == b"answer to [1, 2]"  # it was running: it finishes
        failure = json.loads(read(s3, f"failed/{second}-error.out"))
    assert (
        failure["__type"] == "ServiceUnavailable" and "RequestTTLSeconds (60)" in failure["message"]
    )
    assert len(pipeline.ran) == 1


def test_a_model_failure_is_written_as_the_error_document(s3) -> None:
    pipeline = Pipeline(route(), fail=True)
    pipeline.release.set()
    client, _ = serve(pipeline, s3)
    with client:
        inference_id = client.post(
            "/endpoints/e/async-invocations",
            headers={protocol.INPUT_LOCATION: "s3://jobs/in/x.json"},
        ).json()["InferenceId"]
        assert str(uuid.UUID(inference_id)) == inference_id
        failure = json.loads(read(s3, f"failed/{inference_id}-error.out"))
    assert failure == {
        "__type": "ModelError",
        "message": "Received server error (500) from container only",
        "OriginalStatusCode": 500,
        "OriginalMessage": "boom",
        "ContainerHostname": "only",
    }


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "InputLocation"),
        ({protocol.INPUT_LOCATION: "s3://jobs/out/job-1.out"}, "S3InputPath"),
        ({protocol.INPUT_LOCATION: "s3://jobs/in/../out/job-1.out"}, "'..'"),
        ({protocol.INPUT_LOCATION: "s3://jobs/in"}, "S3InputPath"),
        ({protocol.INPUT_LOCATION: "https://jobs.s3.amazonaws.com/in/x.json"}, "s3://"),
        (
            {protocol.INPUT_LOCATION: "s3://jobs/in/x.json", protocol.INFERENCE_ID: "../x"},
            "segments",
        ),
        (
            {protocol.INPUT_LOCATION: "s3://jobs/in/x.json", protocol.REQUEST_TTL: "59"},
            "RequestTTLSeconds",
        ),
        (
            {protocol.INPUT_LOCATION: "s3://jobs/in/x.json", protocol.INVOCATION_TIMEOUT: "3601"},
            "InvocationTimeoutSeconds",
        ),
        (
            {protocol.INPUT_LOCATION: "s3://jobs/in/x.json", protocol.OUTPUT_FILENAME: "a..b"},
            "Filename",
        ),
        (
            {
                protocol.INPUT_LOCATION: "s3://jobs/in/x.json",
                protocol.OUTPUT_PATH_EXTENSION: "a/../b",
            },
            "S3OutputPathExtension",
        ),
    ],
)
def test_requests_are_checked_before_202(s3, headers: dict, reason: str) -> None:
    pipeline = Pipeline(route())
    client, handler = serve(pipeline, s3)
    with client:
        response = client.post("/endpoints/e/async-invocations", headers=headers)
    assert response.status_code == 400 and response.json()["__type"] == "ValidationError"
    assert reason in response.json()["message"]
    assert not handler.lanes


def test_an_endpoint_without_the_config_is_refused(s3) -> None:
    client, _ = serve(Pipeline(EndpointRoute("plain", "Direct", ("only",))), s3)
    with client:
        response = client.post(
            "/endpoints/plain/async-invocations",
            headers={protocol.INPUT_LOCATION: "s3://jobs/in/x.json"},
        )
    assert response.status_code == 400
    assert "Endpoint plain has no AsyncInferenceConfig" in response.json()["message"]


def test_output_extension_and_filename(s3) -> None:
    pipeline = Pipeline(route())
    pipeline.release.set()
    client, _ = serve(pipeline, s3)
    with client:
        response = client.post(
            "/endpoints/e/async-invocations",
            headers={
                protocol.INPUT_LOCATION: "s3://jobs/in/x.json",
                protocol.OUTPUT_PATH_EXTENSION: "2026/11",
                protocol.OUTPUT_FILENAME: "result.json",
            },
        )
        assert response.headers[protocol.OUTPUT_LOCATION] == "s3://jobs/out/2026/11/result.json"
        assert read(s3, "out/2026/11/result.json") == b"answer to [1, 2]"


def test_a_stopping_gateway_fails_its_unfinished_requests_where_callers_look(s3) -> None:
    pipeline = Pipeline(route(concurrency=1))
    client, handler = serve(pipeline, s3)
    with client:
        ask = lambda: client.post(
            "/endpoints/e/async-invocations",
            headers={protocol.INPUT_LOCATION: "s3://jobs/in/x.json"},
        ).json()["InferenceId"]
        running, waiting = ask(), ask()
        client.portal.call(handler.after.close)  # what the gateway's lifespan does when it stops
        # (the stand-in's thread, which cancelling its coroutine cannot stop)
        pipeline.release.set()
    for inference_id in (running, waiting):
        failure = json.loads(read(s3, f"failed/{inference_id}-error.out"))
        assert failure["__type"] == "ServiceUnavailable" and "submit it again" in failure["message"]
    assert pipeline.ran == []


class MemoryJournal:
    """The Journal protocol over a dict shared by 'gateways' (Ray's key-value store in production:
    serving/ray_wing/async_journal.py, exercised by the gateway-kill test in tests/integration)."""

    def __init__(self, store: dict, owner: str) -> None:
        self.store, self.owner = store, owner

    def record(self, key, entry):
        self.store[key] = {**entry, "key": key, "owner": self.owner}

    def remove(self, key):
        self.store.pop(key, None)

    def take_orphans(self):
        taken = [dict(entry) for entry in self.store.values() if entry["owner"] != self.owner]
        for entry in taken:
            self.store[entry["key"]]["owner"] = self.owner
        return taken


def test_a_job_is_recorded_before_the_202_and_forgotten_once_answered(s3) -> None:
    pipeline, store = Pipeline(route()), {}
    client, handler = serve(pipeline, s3)
    handler.journal = MemoryJournal(store, "first")
    with client:
        response = client.post(
            "/endpoints/e/async-invocations",
            headers={
                protocol.INPUT_LOCATION: "s3://jobs/in/x.json",
                protocol.INFERENCE_ID: "journaled",
            },
        )
        assert response.status_code == 202
        # recorded before the answer: the job is still waiting for its release
        [entry] = store.values()
        assert entry["inference_id"] == "journaled" and entry["output"] == [
            "jobs",
            "out/journaled.out",
        ]
        pipeline.release.set()
        assert read(s3, "out/journaled.out") == b"answer to [1, 2]"
        deadline = time.monotonic() + WAIT_S
        while store and time.monotonic() < deadline:
            time.sleep(0.05)
    assert store == {}


def test_another_gateway_finishes_a_silent_gateways_job_once(s3) -> None:
    # The first gateway admits a job and dies before running it (its task never runs here); the
    # second takes it over from the journal and writes its answer. A job whose answer was written
    # before its gateway died is only forgotten, not run again.
    store = {}
    silent = MemoryJournal(store, "dead")
    first = Pipeline(route())
    _, dead = serve(first, s3)
    admission = Admission(first.route, first.route.containers, None, None)
    job = job_from_request(
        admission,
        {protocol.INPUT_LOCATION: "s3://jobs/in/x.json", protocol.INFERENCE_ID: "orphan"},
        b"",
        dead.clock(),
    )
    silent.record(job.key, job.entry())
    done = job_from_request(
        admission,
        {protocol.INPUT_LOCATION: "s3://jobs/in/x.json", protocol.INFERENCE_ID: "done"},
        b"",
        dead.clock(),
    )
    silent.record(done.key, done.entry())
    s3.put_object(Bucket="jobs", Key="out/done.out", Body=b"written before the gateway died")

    second = Pipeline(route())
    second.release.set()
    client, handler = serve(second, s3)
    handler.journal = MemoryJournal(store, "alive")
    with client:
        taken = client.portal.call(handler.take_over)
        assert taken == 1
        assert read(s3, "out/orphan.out") == b"answer to [1, 2]"
    assert read(s3, "out/done.out") == b"written before the gateway died"
    assert len(second.ran) == 1
