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
from serving.gateway.admission import EndpointRoute
from serving.gateway.invocation import Invocations
from serving.gateway.transport import HopResponse
from serving.metrics.invocations import InvocationTrace
from serving.open_inference import codec
from serving.open_inference.dataplane import ModelCall, OpenInference
from serving.runtimes.codecs import npy_encode
from serving.settings import ServerSettings

TENSOR = {
    "inputs": [],
    "outputs": [],
    "content_type": protocol.NPY,
    "accept": f"{protocol.NPY}, {protocol.JSON}",
}
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

    async def send(
        self,
        endpoint,
        container,
        body,
        headers,
        timeout,
        affinity=None,
        stream=False,
        stream_timeout=None,
    ) -> HopResponse:
        self.hops.append((container, dict(headers)))
        if headers.get("accept", "").startswith(protocol.NPY):
            return HopResponse(200, npy_encode(np.array([[1.0, 2.0]])), protocol.NPY, None)
        return HopResponse(200, b'{"labels": ["setosa"]}', protocol.JSON, None)


def infer(
    transport: ChainTransport, route: EndpointRoute, model: str
) -> list[tuple[str, np.ndarray, bool | None]]:
    invocations = Invocations(ServerSettings(), transport)  # type: ignore[arg-type]
    invocations.endpoints = {route.name: route}
    v2 = OpenInference(invocations, lambda: [])
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    ).encode()

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    call = ModelCall(
        model, None, str(len(body)), chunks, lambda: RawRequest("POST", "/", "", (), b"")
    )
    answer = asyncio.run(
        v2.infer(call, InvocationTrace(), lambda raw: codec.parse_request(raw, None))
    )
    return answer.outputs


def test_a_serial_chain_hands_tensors_on_as_npy_where_both_ends_read_it() -> None:
    transport = ChainTransport({"scale": TENSOR, "predict": TENSOR, "label": SCRIPT})
    outputs = infer(
        transport, EndpointRoute("chain", "Serial", ("scale", "predict", "label")), "chain"
    )
    assert [container for container, _ in transport.hops] == ["scale", "predict", "label"]
    accepts = [headers.get("accept") for _, headers in transport.hops]
    # scale -> predict: both tensor stacks, so NPY; predict -> label (a script): its default; label: the model's last
    assert accepts == [protocol.NPY, None, protocol.JSON]
    assert (
        transport.hops[0][1]["content-type"] == protocol.NPY
    )  # the caller's tensor, as NPY, to the first
    assert [(name, array.tolist()) for name, array, _ in outputs] == [("labels", [b"setosa"])]


def test_a_direct_container_is_asked_as_before() -> None:
    transport = ChainTransport({"iris": TENSOR})
    infer(transport, EndpointRoute("one", "Direct", ("iris",)), "one.iris")
    assert [headers.get("accept") for _, headers in transport.hops] == [TENSOR["accept"]]


class RepositoryTransport(ChainTransport):
    """Two replicas of each MultiModel container, each listing its models and what it has loaded."""

    def __init__(self, listings: dict[str, list[dict]]) -> None:
        super().__init__({})
        self.listings = listings

    async def each(self, endpoint, container, method, path, body, timeout) -> list[Answer]:
        assert (method, path) == ("GET", protocol.REPOSITORY_PATH)
        return [
            Answer(200, json.dumps(listing).encode())
            for listing in self.listings[f"{endpoint}.{container}"]
        ]


def test_the_repository_index_lists_only_what_the_caller_may_invoke(tmp_path) -> None:
    import yaml

    from serving.access.decision import EndpointAccess
    from serving.access.identities import load_identities

    (tmp_path / "wine-only.json").write_text(
        json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Action": "sagemaker:InvokeEndpoint",
                        "Resource": "*",
                        "Condition": {"StringLike": {"sagemaker:TargetModel": "wine-*"}},
                    }
                ],
            }
        )
    )
    (tmp_path / "identities.yaml").write_text(
        yaml.safe_dump(
            {
                "Identities": [
                    {
                        "Principal": "wine-team",
                        "ApiKey": "wine-team-api-key-0123456789",
                        "PolicyDocuments": ["wine-only.json"],
                    }
                ]
            }
        )
    )
    access = EndpointAccess(
        load_identities(tmp_path / "identities.yaml"), region="us-east-1", account_id="0" * 12
    )
    models = {
        "available": ["iris-1.tar.gz", "wine-1.tar.gz", "wine-2.tar.gz"],
        "loaded": ["wine-1.tar.gz"],
    }
    transport = RepositoryTransport(
        {
            "secured.mm": [models, {**models, "loaded": []}],
            "open.mm": [{"available": ["any.tar.gz"], "loaded": ["any.tar.gz"]}] * 2,
        }
    )
    invocations = Invocations(ServerSettings(), transport)  # type: ignore[arg-type]  # loopback: anonymous allowed
    invocations.endpoints = {
        "secured": EndpointRoute(
            "secured", "Direct", ("mm",), access=access, multi_model=frozenset({"mm"})
        ),
        "open": EndpointRoute("open", "Direct", ("mm",), multi_model=frozenset({"mm"})),
        "single": EndpointRoute("single", "Direct", ("iris",)),
    }
    v2 = OpenInference(invocations, lambda: [])

    def index(*headers: tuple[str, str]) -> list[dict[str, str]]:
        return asyncio.run(
            v2.repository_index(RawRequest("POST", "/v2/repository/index", "", headers, b""))
        )

    key = ("authorization", "Bearer wine-team-api-key-0123456789")
    assert index(key) == [
        {"name": "open.mm.any.tar.gz", "state": "READY", "reason": ""},
        {
            "name": "secured.mm.wine-1.tar.gz",
            "state": "UNAVAILABLE",
            "reason": "loaded in 1 of 2 replicas",
        },
        {"name": "secured.mm.wine-2.tar.gz", "state": "UNAVAILABLE", "reason": "not loaded"},
    ]  # iris-1 is not the caller's to invoke, and a SingleModel container has no repository
    assert [entry["name"] for entry in index()] == [
        "open.mm.any.tar.gz"
    ]  # no credentials: the open endpoint only
    assert [
        entry["name"] for entry in index(("authorization", "Bearer someone-else-key-0123456"))
    ] == ["open.mm.any.tar.gz"]
