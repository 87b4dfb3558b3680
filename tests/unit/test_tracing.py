"""serving.tracing: one OpenTelemetry trace per invocation, over the router and real containers on
loopback ports (test_router's harness), without Ray.

Spans are read back from the SDK's own in-memory exporter, installed by `spans.configure` in place of
the exporters the `OTEL_*` variables would name; everything else (sampler, resource) is the SDK's
reading of the environment, as in production. The export over OTLP to a real receiver is the
integration tier's (TRACING_NOTES.md).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from test_router import (  # noqa: F401  (fixtures)
    RouterFactory,
    client,
    containers,
    dead_url,
    endpoints,
    invoke,
    make_router,
    module_servers,
    servers,
    table,
)

from serving import protocol
from serving.access.decision import AUDIT_LOGGER, EndpointAccess, configure_audit_log
from serving.access.identities import load_identities
from serving.gateway.router import EndpointRoute
from serving.settings import ServerSettings
from serving.tracing import otel_sdk, spans

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing on, each span exported to memory as it ends; off again after the test."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    exporter = InMemorySpanExporter()
    assert spans.configure(exporter=exporter)
    yield exporter
    spans.shut_down()


def caller_context() -> tuple[str, str, str]:
    """A caller's W3C traceparent, with its trace id and span id."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in sorted(finished, key=lambda span: span.start_time or 0):
        named.setdefault(span.name, []).append(span)
    return named


def children(parent: ReadableSpan, finished: tuple[ReadableSpan, ...]) -> list[ReadableSpan]:
    """`parent`'s child spans in the order they started."""
    return sorted(
        (
            span
            for span in finished
            if span.parent is not None and span.parent.span_id == parent.context.span_id
        ),
        key=lambda span: span.start_time or 0,
    )


def the_root(finished: tuple[ReadableSpan, ...]) -> ReadableSpan:
    roots = [span for span in finished if span.kind == SpanKind.SERVER]
    assert len(roots) == 1, [span.name for span in finished]
    return roots[0]


def test_a_serial_chain_is_one_trace_joined_to_the_caller(
    exported: InMemorySpanExporter,
    client: httpx.Client,  # noqa: F811
    containers: dict[str, str],  # noqa: F811
) -> None:
    traceparent, trace_id, span_id = caller_context()
    response = invoke(
        client,
        "pipeline",
        headers={
            "traceparent": traceparent,
            "tracestate": "caller=kept",
            protocol.INFERENCE_ID: "find-me-42",
        },
    )
    assert response.status_code == 200, response.text
    assert response.headers[protocol.TRACE_ID] == trace_id

    finished = exported.get_finished_spans()
    assert {format(span.context.trace_id, "032x") for span in finished} == {trace_id}
    root = the_root(finished)
    assert root.name == "InvokeEndpoint"
    assert root.parent is not None and format(root.parent.span_id, "016x") == span_id
    assert root.parent.is_remote and root.context.trace_state.get("caller") == "kept"
    assert root.attributes is not None
    assert dict(root.attributes) == {
        spans.INFERENCE_ID: "find-me-42",
        spans.ENDPOINT: "pipeline",
        spans.CONTAINERS: ("scaler", "classifier", "labels"),
        spans.VARIANT: protocol.DEFAULT_VARIANT,
        spans.PROTOCOL: "sagemaker-runtime",
        spans.STATUS: 200,
    }
    assert root.resource.attributes["service.name"] == "serving"

    steps = children(root, finished)
    assert [span.name for span in steps] == [
        "authenticate",
        "read body",
        "hop scaler",
        "hop classifier",
        "hop labels",
    ]
    for position, (hop, container) in enumerate(
        zip(steps[2:], ("scaler", "classifier", "labels"), strict=True), start=1
    ):
        assert hop.attributes is not None
        assert hop.attributes[spans.CONTAINER] == container
        assert hop.attributes[spans.POSITION] == position
        assert hop.attributes[spans.STATUS] == 200
        (attempt,) = children(hop, finished)
        assert attempt.attributes is not None
        assert attempt.attributes[spans.REPLICA] == containers[container]
        assert attempt.attributes[spans.ATTEMPT] == 1
        assert attempt.attributes[spans.NODE] == "127.0.0.1"
        # the container's own steps, reported on its answer, inside the attempt and in order
        steps_in = children(attempt, finished)
        assert [span.name for span in steps_in][-3:] == ["decode", "predict", "encode"]
        for earlier, later in zip(steps_in, steps_in[1:], strict=False):
            assert earlier.end_time <= later.start_time  # type: ignore[operator]
        assert attempt.start_time <= steps_in[0].start_time  # type: ignore[operator]
        assert steps_in[-1].end_time <= attempt.end_time  # type: ignore[operator]
        # each hop lies inside the invocation, after the one before it
        assert root.start_time <= hop.start_time <= hop.end_time <= root.end_time  # type: ignore[operator]
    assert all(
        earlier.end_time <= later.start_time  # type: ignore[operator]
        for earlier, later in zip(steps, steps[1:], strict=False)
    )


def test_without_a_traceparent_the_gateway_starts_the_trace(
    exported: InMemorySpanExporter,
    client: httpx.Client,  # noqa: F811
) -> None:
    response = invoke(client, "single")
    assert response.status_code == 200, response.text
    root = the_root(exported.get_finished_spans())
    assert root.parent is None
    assert response.headers[protocol.TRACE_ID] == format(root.context.trace_id, "032x")


def test_a_refused_request_is_traced_and_answered_with_its_trace_id(
    exported: InMemorySpanExporter,
    client: httpx.Client,  # noqa: F811
) -> None:
    response = invoke(client, "direct")  # Direct with three containers: the target header is due
    assert response.status_code == 400, response.text
    root = the_root(exported.get_finished_spans())
    assert response.headers[protocol.TRACE_ID] == format(root.context.trace_id, "032x")
    assert root.attributes is not None
    assert root.attributes[spans.STATUS] == 400
    assert root.attributes[spans.ERROR_CODE] == response.headers["x-amzn-ErrorType"]
    assert root.status.status_code == StatusCode.UNSET  # the caller's mistake, not a failure


def test_a_failing_container_marks_its_hop_and_the_invocation(
    exported: InMemorySpanExporter,
    client: httpx.Client,  # noqa: F811
) -> None:
    response = invoke(client, "pipeline-boom")
    assert response.status_code == 424, response.text
    finished = exported.get_finished_spans()
    root = the_root(finished)
    hops = {span.name: span for span in children(root, finished) if span.name.startswith("hop")}
    assert list(hops) == ["hop scaler", "hop boom"]  # the chain ended at the failure
    boom = hops["hop boom"]
    assert boom.status.status_code == StatusCode.ERROR
    assert boom.attributes is not None and boom.attributes[spans.STATUS] >= 400
    assert root.attributes is not None
    assert root.attributes[spans.ERROR_CODE] == protocol.ErrorCode.MODEL_ERROR
    assert root.attributes[spans.STATUS] == boom.attributes[spans.STATUS]


def test_a_hop_refused_by_one_replica_shows_both_attempts(
    exported: InMemorySpanExporter,
    make_router: RouterFactory,  # noqa: F811
    containers: dict[str, str],  # noqa: F811
) -> None:
    route = EndpointRoute("single", "Direct", ("iris",))
    dead = dead_url()
    router, _ = make_router([route], {("single", "iris"): [dead, containers["iris"]]})
    # the transport rotates its first choice: within two requests one goes to the dead replica first
    for _ in range(2):
        assert invoke(router, "single").status_code == 200
    finished = exported.get_finished_spans()
    tried = [
        [
            (attempt.attributes or {}).get(spans.REPLICA)
            for attempt in children(hop, finished)
            if attempt.name == "attempt"
        ]
        for hop in by_name(finished)["hop iris"]
    ]
    assert [dead, containers["iris"]] in tried, tried
    refused = next(
        attempt
        for attempt in by_name(finished)["attempt"]
        if (attempt.attributes or {}).get(spans.REPLICA) == dead
    )
    assert refused.attributes is not None
    assert (refused.attributes[spans.ATTEMPT], refused.attributes[spans.OUTCOME]) == (1, "refused")


def test_an_endpoint_with_access_control_traces_authorize(
    exported: InMemorySpanExporter,
    make_router: RouterFactory,  # noqa: F811
    containers: dict[str, str],  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    (tmp_path / "all.json").write_text(
        json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "sagemaker:InvokeEndpoint", "Resource": "*"}
                ],
            }
        )
    )
    key = secrets.token_urlsafe(24)
    identities = {
        "Identities": [{"Principal": "p", "ApiKey": key, "PolicyDocuments": ["all.json"]}]
    }
    (tmp_path / "identities.yaml").write_text(yaml.safe_dump(identities))
    settings = ServerSettings()
    access = EndpointAccess(
        load_identities(tmp_path / "identities.yaml"),
        region=settings.region,
        account_id=settings.account_id,
    )
    route = EndpointRoute("guarded", "Direct", ("iris",), access=access)
    router, _ = make_router([route], {("guarded", "iris"): [containers["iris"]]})
    assert invoke(router, "guarded", headers={"authorization": f"Bearer {key}"}).status_code == 200
    finished = exported.get_finished_spans()
    assert [span.name for span in children(the_root(finished), finished)] == [
        "authenticate",
        "authorize",
        "read body",
        "hop iris",
    ]
    exported.clear()
    configure_audit_log()  # as the gateway does: its lines keep the id in a field
    audit = logging.getLogger(AUDIT_LOGGER)
    audit.addHandler(caplog.handler)  # it does not propagate to the root's
    try:
        refused = invoke(router, "guarded", headers={"authorization": "Bearer wrong"})
    finally:
        audit.removeHandler(caplog.handler)
    assert refused.status_code == 403
    finished = exported.get_finished_spans()
    (authenticate,) = children(the_root(finished), finished)
    assert authenticate.name == "authenticate"
    assert authenticate.status.status_code == StatusCode.ERROR
    # the audit line of the refusal names the trace, as a field of its JSON
    (line,) = [record for record in caplog.records if record.name == AUDIT_LOGGER]
    assert json.loads(line.getMessage())["trace_id"] == refused.headers[protocol.TRACE_ID]


def test_log_lines_written_inside_a_trace_carry_its_id(
    exported: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    """A `serving.*` line inside an invocation ends with its trace id; other loggers' lines and
    lines outside a trace are left as they are."""
    logger, other = logging.getLogger("serving.router"), logging.getLogger("botocore.probe")
    span = spans.begin("probe")
    assert span is not None
    with caplog.at_level(logging.INFO):
        logger.info("slow hop to %s", "classifier")
        other.info("not ours")
        span.leave()
        logger.info("outside")
        span.end(200, {})
        spans.shut_down()
        logger.info("after")  # off again: the factory is gone
    inside, foreign, outside, after = caplog.records
    assert inside.getMessage() == f"slow hop to classifier [trace_id={span.trace_id}]"
    assert inside.trace_id == span.trace_id  # type: ignore[attr-defined]
    assert foreign.getMessage() == "not ours" and outside.getMessage() == "outside"
    assert after.getMessage() == "after"


def test_the_sampler_is_the_sdks_reading_of_the_environment(
    exported: InMemorySpanExporter,
    client: httpx.Client,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-a")
    spans.configure(exporter=exported)
    response = invoke(client, "single")
    # not sampled: the trace id still comes back (log lines carry it), no span is exported
    assert len(response.headers[protocol.TRACE_ID]) == 32
    assert exported.get_finished_spans() == ()
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    sampled = InMemorySpanExporter()  # the first one was shut down with its provider
    spans.configure(exporter=sampled)
    invoke(client, "single")
    assert the_root(sampled.get_finished_spans()).resource.attributes["service.name"] == (
        "gateway-a"
    )


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_tracing_is_on_only_when_the_otel_variables_ask(environ: dict[str, str], on: bool) -> None:
    assert spans.enabled_by(environ) is on


def test_the_exporters_are_the_sdks_entry_points() -> None:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    (console,) = otel_sdk.exporters_from_environment({"OTEL_TRACES_EXPORTER": "console"})
    assert isinstance(console, ConsoleSpanExporter)
    with pytest.raises(RuntimeError, match="'nope' span exporter"):
        otel_sdk.exporters_from_environment({"OTEL_TRACES_EXPORTER": "nope"})
    with pytest.raises(RuntimeError, match="OTLP protocol 'http/json'"):
        otel_sdk.exporters_from_environment(
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
        )


OFF_PROBE = """
import asyncio, sys
from serving.gateway.entry import invocation_frame
from serving.gateway.router import Router
from serving.metrics.invocations import InvocationTrace
from serving.tracing import spans

assert not spans.configure()

async def main():
    async with invocation_frame(InvocationTrace(), "probe", carrier={"traceparent": "x"}) as frame:
        assert frame.span is None
        with spans.step("authenticate"), spans.hop("c", 1), spans.attempt("http://r", 1):
            spans.annotate(spans.STATUS, 200)

asyncio.run(main())
print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))
"""


def test_with_tracing_off_opentelemetry_is_never_imported() -> None:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    environment["PYTHONPATH"] = str(ROOT)
    probe = subprocess.run(
        [sys.executable, "-c", OFF_PROBE],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"


def test_work_set_off_by_an_invocation_is_a_trace_of_its_own_linked_to_it(
    exported: InMemorySpanExporter,
) -> None:
    """A shadow copy (and an async run) begins a new trace, linked to the span that set it off:
    not a child, whose time would be counted in its caller's."""
    import asyncio

    from serving.gateway.entry import invocation_frame
    from serving.metrics.invocations import InvocationTrace

    async def caller_then_copy() -> None:
        async with invocation_frame(InvocationTrace(), "caller", operation="InvokeEndpoint"):
            link = spans.current_carrier()
        assert link is not None and protocol.TRACEPARENT in link
        async with invocation_frame(InvocationTrace(), "copy", operation="ShadowCopy", link=link):
            pass

    asyncio.run(caller_then_copy())
    named = by_name(exported.get_finished_spans())
    (caller,), (copy,) = named["InvokeEndpoint"], named["ShadowCopy"]
    assert copy.context.trace_id != caller.context.trace_id and copy.parent is None
    (link,) = copy.links
    assert link.context.span_id == caller.context.span_id
    assert link.context.trace_id == caller.context.trace_id
