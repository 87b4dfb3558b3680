"""OpenTelemetry traces exported over OTLP/HTTP by the session's real gateway to a real receiver
(`suite.otlp`, decoding with `opentelemetry-proto`): a Serial chain is one trace nesting gateway →
hop → attempt → the container's own steps under the caller's span; an Open Inference gRPC call and
a streamed call are one trace each; unsampled callers follow the configured ratio; the trace id in
the answer finds the trace and the container's log line. The span tree's every branch (retries,
refusals, links) is the unit tier's (tests/unit/test_tracing.py)."""

from __future__ import annotations

import math
import secrets
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton
from suite import endpoints
from suite.otlp import COLLECTOR_TOKEN, SAMPLED_RATIO, ReceivedSpan, Receiver

from serving import protocol

pytestmark = pytest.mark.integration

ENDPOINTS = {"it-serial": endpoints.serial}  # what `server` deploys for this module, by builder
CHAIN = ("preprocess", "classifier", "labels")
ROWS = [[5.1, 3.5, 1.4, 0.2], [6.3, 3.3, 6.0, 2.5]]
SERVER_KIND = 2  # OTLP's SPAN_KIND_SERVER


def caller() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def children(parent: ReceivedSpan, spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return sorted(
        (span for span in spans if span.parent_span_id == parent.span_id),
        key=lambda span: span.start_ns,
    )


def the_root(spans: list[ReceivedSpan]) -> ReceivedSpan:
    roots = [span for span in spans if span.kind == SERVER_KIND]
    assert len(roots) == 1, [span.name for span in spans]
    return roots[0]


def test_a_serial_chain_is_one_trace_at_the_collector(server, otlp_receiver: Receiver) -> None:
    traceparent, trace_id, span_id = caller()
    inference_id = f"chain-{uuid.uuid4()}"
    response = server.http.post(
        "/endpoints/it-serial/invocations",
        json=ROWS,
        headers={"traceparent": traceparent, protocol.INFERENCE_ID: inference_id},
    )
    assert response.status_code == 200, response.text
    assert response.headers[protocol.TRACE_ID] == trace_id

    spans = otlp_receiver.wait_for(trace_id, "InvokeEndpoint")
    root = the_root(spans)
    assert root.parent_span_id == span_id  # the caller's span
    assert root.attributes["serving.endpoint"] == "it-serial"
    assert root.attributes["serving.containers"] == CHAIN
    assert root.attributes["serving.inference_id"] == inference_id
    assert root.attributes["serving.status"] == 200
    assert root.resource["service.name"] == "serving-suite"
    assert root.resource["deployment.environment"] == "ci"
    # what the operator configured reached the collector: its path and its header
    assert otlp_receiver.paths == {"/v1/traces"}
    assert otlp_receiver.authorizations == {COLLECTOR_TOKEN}

    steps = children(root, spans)
    assert [span.name for span in steps] == ["authenticate", "read body"] + [
        f"hop {c}" for c in CHAIN
    ]
    for hop, container in zip(steps[2:], CHAIN, strict=True):
        assert hop.attributes["serving.container"] == container
        (attempt,) = children(hop, spans)
        assert attempt.attributes["serving.replica"].startswith("http")
        inside = children(attempt, spans)
        # the container's own steps, timed in its process and reported with its answer
        assert [span.name for span in inside][-3:] == ["decode", "predict", "encode"], inside
        assert attempt.start_ns <= inside[0].start_ns <= inside[-1].end_ns <= attempt.end_ns
        assert root.start_ns <= hop.start_ns <= hop.end_ns <= root.end_ns


def test_an_open_inference_grpc_call_is_one_trace(server, otlp_receiver: Receiver) -> None:
    traceparent, trace_id, span_id = caller()
    client = triton.InferenceServerClient(
        server.grpc_target, ssl=True, root_certificates=str(server.grpc_ca)
    )
    try:
        tensor = triton.InferInput("input-0", [2, 4], "FP64")
        tensor.set_data_from_numpy(np.array(ROWS, dtype=np.float64))
        client.infer("it-serial", [tensor], headers={"traceparent": traceparent}, client_timeout=30)
    finally:
        client.close()
    spans = otlp_receiver.wait_for(trace_id, "ModelInfer")
    root = the_root(spans)
    assert root.parent_span_id == span_id
    assert root.attributes["serving.protocol"] == "v2-grpc"
    assert [span.name for span in children(root, spans) if span.name.startswith("hop")] == [
        f"hop {c}" for c in CHAIN
    ]


def test_a_streamed_call_is_one_trace_ended_with_its_stream(
    server, otlp_receiver: Receiver
) -> None:
    traceparent, trace_id, _ = caller()
    with server.http.stream(
        "POST",
        "/endpoints/it-serial/invocations-response-stream",
        json=ROWS,
        headers={"traceparent": traceparent},
    ) as response:
        assert response.status_code == 200
        assert response.headers[protocol.TRACE_ID] == trace_id
        body = response.read()
        ended = time.time_ns()
    assert body
    spans = otlp_receiver.wait_for(trace_id, "InvokeEndpointWithResponseStream")
    root = the_root(spans)
    assert root.end_ns <= ended + 50_000_000  # ended when its stream did, not before the body
    assert len([span for span in spans if span.kind == SERVER_KIND]) == 1


def test_callers_without_a_trace_are_sampled_at_the_configured_ratio(
    server, otlp_receiver: Receiver
) -> None:
    calls = 400
    prefix = f"ratio-{uuid.uuid4().hex[:8]}-"

    def call(number: int) -> str:
        response = server.http.post(
            "/endpoints/it-serial/invocations",
            json=ROWS,
            headers={protocol.INFERENCE_ID: f"{prefix}{number}"},
        )
        assert response.status_code == 200, response.text
        return response.headers[protocol.TRACE_ID]  # sampled or not, the caller gets the id

    with ThreadPoolExecutor(4) as pool:
        trace_ids = list(pool.map(call, range(calls)))
    assert len(set(trace_ids)) == calls
    time.sleep(1.0)  # the batch processor's last export (OTEL_BSP_SCHEDULE_DELAY=100 ms)
    sampled = [
        root
        for root in otlp_receiver.roots("InvokeEndpoint")
        if str(root.attributes.get("serving.inference_id", "")).startswith(prefix)
    ]
    expected = calls * SAMPLED_RATIO
    sigma = math.sqrt(calls * SAMPLED_RATIO * (1 - SAMPLED_RATIO))
    assert abs(len(sampled) - expected) <= 3 * sigma, (len(sampled), expected, sigma)
    # each exported trace is one the caller was told of
    assert {root.trace_id for root in sampled} <= set(trace_ids)


def test_the_trace_id_finds_the_trace_and_the_containers_log_line(
    server, otlp_receiver: Receiver
) -> None:
    traceparent, trace_id, _ = caller()
    response = server.http.post(
        "/endpoints/it-serial/invocations",
        json=[[1.0, 2.0]],  # two features where the chain's scaler wants four: it fails
        headers={"traceparent": traceparent},
    )
    assert response.status_code == 424, response.text
    assert response.headers[protocol.TRACE_ID] == trace_id
    spans = otlp_receiver.wait_for(trace_id, "InvokeEndpoint")
    root = the_root(spans)
    assert root.attributes["serving.error_code"] == "ModelError"
    (failed,) = [span for span in children(root, spans) if span.name == "hop preprocess"]
    assert failed.status_code == 2  # STATUS_CODE_ERROR

    # the failing container's log stream names its file in Ray's logs folder
    import ray

    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    stream = response.json()["LogStreamArn"]
    log_file = logs / Path(stream).name
    deadline = time.monotonic() + 15
    while f"(trace {trace_id})" not in log_file.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"no log line with trace {trace_id} in {log_file}"
        time.sleep(0.2)
