"""DataCaptureConfig end to end: an unmodified boto3 client invokes, the gateway captures.

it-capture writes every call to a folder, it-capture-sampled 30% of them to the session's
S3-compatible server (moto), and it-capture-blocked to a destination that refuses every write (built
below).
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
import uuid
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from suite.endpoint_server import TINY
from suite.endpoints import python_container

pytestmark = pytest.mark.integration

# it-capture*: DataCaptureConfig (tests/integration/test_data_capture.py): every call to a folder,
# 30% to the session's S3-compatible server, and a destination that refuses every write (a file
# where its folder would be).
CAPTURE_BUCKET = "it-capture"


@pytest.fixture(scope="session")
def capture_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("capture")
    (root / "blocked").write_text("a file where the capture folder would be")
    return root


def _capture(name: str, handlers: dict[str, Path], percent: int, destination: str, **extra) -> dict:
    options = [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}]
    return {
        "EndpointName": name,
        "Containers": [python_container("echo", handlers, "echo", Resources=TINY)],
        "DataCaptureConfig": {
            "InitialSamplingPercentage": percent,
            "DestinationS3Uri": destination,
            "CaptureOptions": options,
            **extra,
        },
    }


def capture_all(handler_models: dict[str, Path], capture_root: Path) -> dict:
    """it-capture: every call, to a folder."""
    return _capture("it-capture", handler_models, 100, f"file://{capture_root / 'all'}")


def capture_sampled(handler_models: dict[str, Path], s3_models: str) -> dict:
    """it-capture-sampled: 30% of the calls, to the session's S3-compatible server."""
    destination = f"s3://{CAPTURE_BUCKET}/monitoring"
    return _capture("it-capture-sampled", handler_models, 30, destination, S3EndpointUrl=s3_models)


def capture_blocked(handler_models: dict[str, Path], capture_root: Path) -> dict:
    """it-capture-blocked: a destination that refuses every write (a file where its folder would
    be)."""
    return _capture("it-capture-blocked", handler_models, 100, str(capture_root / "blocked"))


ENDPOINTS = {
    "it-capture": capture_all,
    "it-capture-sampled": capture_sampled,
    "it-capture-blocked": capture_blocked,
}  # what `server` deploys for this module, by builder
# records are written about a second after their call; the bound keeps a broken gateway from hanging
WAIT_S = 30


@pytest.fixture(scope="module")
def runtime(server):
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )


def _data(part: dict) -> bytes:
    return base64.b64decode(part["data"]) if part["encoding"] == "BASE64" else part["data"].encode()


def _records(folder: Path, wanted: int) -> list[dict]:
    deadline = time.monotonic() + WAIT_S
    while True:
        found = [
            json.loads(line)
            for path in folder.rglob("*.jsonl")
            for line in path.read_text().splitlines()
        ]
        if len(found) >= wanted or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_every_call_is_one_record_that_decodes_to_the_bytes_sent_and_answered(
    server, runtime, capture_root
):
    sent = {}
    for n in range(40):
        inference_id = f"call-{n}-{uuid.uuid4().hex[:8]}"
        body = json.dumps({"n": n, "text": "é" * (n % 3)}).encode()
        answer = runtime.invoke_endpoint(
            EndpointName="it-capture",
            ContentType="application/json",
            Body=body,
            InferenceId=inference_id,
        )["Body"].read()
        sent[inference_id] = (body, answer)
    records = _records(capture_root / "all", len(sent))
    assert len(records) == len(sent)
    for document in records:
        body, answer = sent[document["eventMetadata"]["inferenceId"]]
        assert _data(document["captureData"]["endpointInput"]) == body
        assert _data(document["captureData"]["endpointOutput"]) == answer
        assert document["captureData"]["endpointInput"]["observedContentType"] == "application/json"
    paths = [
        p.relative_to(capture_root / "all").as_posix()
        for p in (capture_root / "all").rglob("*.jsonl")
    ]
    assert all(
        re.fullmatch(r"it-capture/AllTraffic/\d{4}/\d\d/\d\d/\d\d/[0-9a-f-]{46}\.jsonl", p)
        for p in paths
    )
    summary = server.client.describe_endpoint("it-capture")["DataCaptureConfig"]
    assert summary["CaptureStatus"] == "Started" and summary["CurrentSamplingPercentage"] == 100


def test_sampling_at_30_percent_writes_30_percent_within_three_standard_deviations(
    server, runtime, s3_models
):
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_models,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    s3.create_bucket(Bucket=CAPTURE_BUCKET)
    calls = 400
    for n in range(calls):
        runtime.invoke_endpoint(
            EndpointName="it-capture-sampled", ContentType="text/csv", Body=f"{n},1\n"
        )
    expected, spread = calls * 0.3, 3 * math.sqrt(calls * 0.3 * 0.7)
    deadline, count = time.monotonic() + WAIT_S, 0
    while time.monotonic() < deadline:
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=CAPTURE_BUCKET).get("Contents", [])]
        count = sum(
            len(s3.get_object(Bucket=CAPTURE_BUCKET, Key=k)["Body"].read().splitlines())
            for k in keys
        )
        if count >= expected - spread:
            time.sleep(2)  # the last flush
            break
        time.sleep(0.5)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=CAPTURE_BUCKET).get("Contents", [])]
    lines = [
        line
        for k in keys
        for line in s3.get_object(Bucket=CAPTURE_BUCKET, Key=k)["Body"].read().splitlines()
    ]
    assert abs(len(lines) - expected) <= spread, (len(lines), expected, spread)
    assert all(k.startswith("monitoring/it-capture-sampled/AllTraffic/") for k in keys)
    assert json.loads(lines[0])["captureData"]["endpointInput"]["encoding"] == "CSV"


def test_a_destination_that_refuses_writes_costs_no_call(server, runtime):
    for n in range(20):
        answer = runtime.invoke_endpoint(
            EndpointName="it-capture-blocked",
            ContentType="application/json",
            Body=json.dumps([n]).encode(),
        )
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
    pattern = re.compile(
        r'serving_data_capture_records_total\{[^}]*endpoint="it-capture-blocked"[^}]*'
        r'outcome="failed"[^}]*\} (\S+)'
    )
    deadline, failed = time.monotonic() + WAIT_S, 0.0
    while time.monotonic() < deadline:
        found = pattern.search(server.http.get("/metrics").text)
        failed = float(found.group(1)) if found else 0.0
        if failed >= 20:
            break
        time.sleep(0.5)
    assert failed >= 20
