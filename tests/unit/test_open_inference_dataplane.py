"""serving.open_inference.dataplane: one V2 call over the invocation pipeline, without a network.

The transport is a recorder of hops and an answerer of signature reads (a stand-in, on purpose: the real transport
and containers are exercised in tests/integration/test_open_inference*.py); this file checks what each hop of a
Serial chain is asked for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import numpy as np

from serving import protocol
from serving.access.sigv4 import RawRequest
from serving.gateway.invocation import EndpointRoute, Invocations
from serving.gateway.transport import HopResponse
from serving.metrics.invocations import InvocationTrace
from serving.open_inference import codec
from serving.open_inference.dataplane import ModelCall, OpenInference
from serving.runtimes.codecs import npy_encode
from serving.settings import ServerSettings

TENSOR = {"inputs": [], "outputs": [], "content_type": protocol.NPY, "accept": f"{protocol.NPY}, {protocol.JSON}"}
SCRIPT = {"inputs": [], "outputs": [], "content_type": protocol.JSON, "accept": protocol.JSON}


class Answer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body


class ChainTransport:
    """Each container answers with a fixed body of the content type it was asked for; signatures from `signatures`."""

    def __init__(self, signatures: dict[str, dict]) -> None:
        self.signatures = signatures
        self.hops: list[tuple[str, dict[str, str]]] = []

    def replica_urls(self, endpoint: str, container: str) -> tuple[str, ...]:
        return (f"http://{container}",)

    async def read(self, endpoint: str, container: str, path: str, timeout: float) -> Answer:
        assert path == protocol.SIGNATURE_PATH
        return Answer(200, json.dumps(self.signatures[container]).encode())

    async def send(self, endpoint, container, body, headers, timeout, affinity=None) -> HopResponse:
        self.hops.append((container, dict(headers)))
        if headers.get("accept", "").startswith(protocol.NPY):
            return HopResponse(200, npy_encode(np.array([[1.0, 2.0]])), protocol.NPY, None)
        return HopResponse(200, b'{"labels": ["setosa"]}', protocol.JSON, None)


def infer(transport: ChainTransport, route: EndpointRoute, model: str) -> list[tuple[str, np.ndarray, bool | None]]:
    invocations = Invocations(ServerSettings(), transport)  # type: ignore[arg-type]
    invocations.endpoints = {route.name: route}
    v2 = OpenInference(invocations, lambda: [])
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    call = ModelCall(model, None, str(len(body)), chunks, lambda: RawRequest("POST", "/", "", (), b""))
    answer = asyncio.run(v2.infer(call, InvocationTrace(), lambda raw: codec.parse_request(raw, None)))
    return answer.outputs


def test_a_serial_chain_hands_tensors_on_as_npy_where_both_ends_read_it() -> None:
    transport = ChainTransport({"scale": TENSOR, "predict": TENSOR, "label": SCRIPT})
    outputs = infer(transport, EndpointRoute("chain", "Serial", ("scale", "predict", "label")), "chain")
    assert [container for container, _ in transport.hops] == ["scale", "predict", "label"]
    accepts = [headers.get("accept") for _, headers in transport.hops]
    # scale -> predict: both tensor stacks, so NPY; predict -> label (a script): its default; label: the model's last
    assert accepts == [protocol.NPY, None, protocol.JSON]
    assert transport.hops[0][1]["content-type"] == protocol.NPY  # the caller's tensor, as NPY, to the first
    assert [(name, array.tolist()) for name, array, _ in outputs] == [("labels", [b"setosa"])]


def test_a_direct_container_is_asked_as_before() -> None:
    transport = ChainTransport({"iris": TENSOR})
    infer(transport, EndpointRoute("one", "Direct", ("iris",)), "one.iris")
    assert [headers.get("accept") for _, headers in transport.hops] == [TENSOR["accept"]]
