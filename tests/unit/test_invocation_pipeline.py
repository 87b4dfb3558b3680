"""serving.gateway.invocation: the InvokeEndpoint steps without a web framework or a network.

The pipeline is driven directly with plain values (a case-insensitive header mapping and an async
body). Its one collaborator, the transport, is replaced by a recorder of hops here (a stand-in, on
purpose: the real transport is exercised over loopback HTTP in test_router.py and the integration
suite); this file checks the order of the steps and what each hop receives.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from serving import protocol
from serving.access.sigv4 import RawRequest
from serving.errors import (
    AccessDeniedError,
    ModelError,
    ServiceUnavailableError,
    ValidationError,
)
from serving.gateway.admission import EndpointRoute, InvocationRequest
from serving.gateway.invocation import Invocations
from serving.gateway.transport import HopResponse
from serving.metrics.invocations import InvocationTrace

# case-insensitive, as any server adapter passes headers
from serving.runtimes.context import Headers
from serving.settings import ServerSettings


class RecordingTransport:
    """Answers each hop from `answers` (container -> status, body, content type) and records what it
    got."""

    def __init__(self, answers: dict[str, tuple[int, bytes, str]]) -> None:
        self.answers = answers
        self.hops: list[tuple[str, bytes, dict[str, str]]] = []

    async def send(
        self,
        endpoint: str,
        container: str,
        body: bytes,
        headers: dict[str, str],
        timeout: float,
        affinity: str | None = None,
        stream: bool = False,
        stream_timeout: float | None = None,
    ) -> HopResponse:
        self.hops.append((container, bytes(body), dict(headers)))
        status, out, content_type = self.answers[container]
        return HopResponse(status, out, content_type, None)


def request(endpoint: str, body: bytes = b"[1]", **headers: str) -> InvocationRequest:
    async def chunks() -> AsyncIterator[bytes]:
        yield body[: len(body) // 2]
        yield body[len(body) // 2 :]

    head = RawRequest("POST", f"/endpoints/{endpoint}/invocations", "", tuple(headers.items()), b"")
    return InvocationRequest(
        endpoint,
        Headers({k.replace("_", "-"): v for k, v in headers.items()}),
        chunks,
        lambda: head,
    )


def pipeline(transport: RecordingTransport, *routes: EndpointRoute, **settings: Any) -> Invocations:
    invocations = Invocations(ServerSettings(**settings), transport)  # type: ignore[arg-type]
    invocations.endpoints = {route.name: route for route in routes}
    return invocations


def run(invocations: Invocations, invocation: InvocationRequest) -> Any:
    return asyncio.run(invocations.invoke(invocation, InvocationTrace()))


SERIAL = EndpointRoute("chain", "Serial", ("scale", "predict", "label"))
DIRECT = EndpointRoute("pair", "Direct", ("iris", "wine"))
ANSWERS = {
    "scale": (200, b"scaled", "application/x-npy"),
    "predict": (200, b"[2]", "application/json"),
    "label": (200, b"virginica", "text/plain"),
    "iris": (200, b"[0]", "application/json"),
    "wine": (200, b"[1]", "application/json"),
}


def test_serial_chain_feeds_each_answer_to_the_next_and_accept_only_to_the_last() -> None:
    transport = RecordingTransport(ANSWERS)
    result = run(
        pipeline(transport, SERIAL),
        request("chain", b"[[1, 2]]", content_type="text/csv", accept="text/plain"),
    )
    assert [hop[0] for hop in transport.hops] == ["scale", "predict", "label"]
    assert [hop[1] for hop in transport.hops] == [b"[[1, 2]]", b"scaled", b"[2]"]
    assert [hop[2]["content-type"] for hop in transport.hops] == [
        "text/csv",
        "application/x-npy",
        "application/json",
    ]
    assert ["accept" in hop[2] for hop in transport.hops] == [False, False, True]
    assert (result.body, result.content_type) == (b"virginica", "text/plain")
    assert result.headers[protocol.INVOKED_VARIANT] == protocol.DEFAULT_VARIANT


def test_direct_needs_a_target_container_and_hops_only_to_it() -> None:
    transport = RecordingTransport(ANSWERS)
    invocations = pipeline(transport, DIRECT)
    with pytest.raises(ValidationError, match="is required: endpoint pair has 2 containers"):
        run(invocations, request("pair"))
    with pytest.raises(ValidationError, match="names no container of endpoint pair"):
        run(invocations, request("pair", **{protocol.TARGET_CONTAINER: "nope"}))
    assert transport.hops == []
    result = run(invocations, request("pair", **{protocol.TARGET_CONTAINER: "wine"}))
    assert [hop[0] for hop in transport.hops] == ["wine"] and result.body == b"[1]"


def test_refusals_come_before_any_hop() -> None:
    transport = RecordingTransport(ANSWERS)
    failed = EndpointRoute("failed", "Direct", ("iris",), failure="container iris: no model")
    invocations = pipeline(transport, failed, EndpointRoute("one", "Direct", ("iris",)))
    with pytest.raises(ValidationError, match="Endpoint missing not found"):
        run(invocations, request("missing"))
    with pytest.raises(ServiceUnavailableError, match="is Failed: container iris: no model"):
        run(invocations, request("failed"))
    with pytest.raises(ValidationError, match="only variant is AllTraffic"):
        run(invocations, request("one", **{protocol.TARGET_VARIANT: "Blue"}))
    with pytest.raises(ValidationError, match="only valid for MultiModel"):
        run(invocations, request("one", **{protocol.TARGET_MODEL: "a.tar.gz"}))
    with pytest.raises(ValidationError, match="payload exceeds the limit of"):
        run(
            pipeline(
                transport, EndpointRoute("one", "Direct", ("iris",)), max_payload_mb=4 / 2**20
            ),
            request("one", b"[1, 2, 3]"),
        )
    assert transport.hops == []


def test_a_starting_gateway_answers_service_unavailable_not_not_found() -> None:
    invocations = pipeline(RecordingTransport(ANSWERS))
    invocations.loaded = False
    with pytest.raises(ServiceUnavailableError, match="starting"):
        run(invocations, request("anything"))


def test_an_anonymous_endpoint_off_loopback_is_refused() -> None:
    transport = RecordingTransport(ANSWERS)
    invocations = pipeline(transport, EndpointRoute("one", "Direct", ("iris",)), host="0.0.0.0")
    with pytest.raises(AccessDeniedError, match="has no AccessControl"):
        run(invocations, request("one"))
    assert transport.hops == []


def test_a_container_error_names_the_container_and_its_position() -> None:
    answers = {**ANSWERS, "predict": (500, b'{"message": "boom"}', "application/json")}
    transport = RecordingTransport(answers)
    with pytest.raises(ModelError) as raised:
        run(pipeline(transport, SERIAL), request("chain"))
    assert "container predict (position 2 of 3)" in raised.value.message
    assert raised.value.container == "predict" and raised.value.original_status == 500
    # the chain stops at the failure
    assert [hop[0] for hop in transport.hops] == ["scale", "predict"]
