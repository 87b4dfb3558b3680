"""One Open Inference call, whatever carried it (REST or gRPC): admitted, run and answered as InvokeEndpoint's.

A model is `<endpoint>.<container>` (one container of a Direct endpoint) or `<endpoint>` (a Serial endpoint's chain,
or an endpoint of one container); a MultiModel container's models are its versions. Every call that names a model
is admitted by `Invocations.admit` exactly as an InvokeEndpoint call naming that container: the same
authentication, the same `sagemaker:InvokeEndpoint` decision with `sagemaker:TargetContainerHostname`, the same hops.
The transports only translate their wire format and errors; the steps live here once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np
from starlette.datastructures import Headers

from serving import protocol
from serving.access.sigv4 import RawRequest
from serving.errors import ModelNotReadyError, ValidationError
from serving.gateway.invocation import Admission, InvocationRequest, Invocations
from serving.metrics.invocations import InvocationTrace
from serving.open_inference import codec
from serving.open_inference.signatures import Signatures

SINGLE_MODEL_VERSION = "1"  # the one version of a SingleModel container's model

# InvokeEndpoint's headers, as a V2 call says the same thing
_TERMS = {
    protocol.TARGET_MODEL: "the model version (a MultiModel container's model)",
    protocol.TARGET_CONTAINER: "the container of the model name (<endpoint>.<container>)",
}


def _version() -> str:
    try:
        return metadata.version("serving")
    except metadata.PackageNotFoundError:
        return "0"


@dataclass(frozen=True)
class ModelCall:
    """A call naming a model: the name and version, and the request as its transport received it."""

    model: str
    version: str | None  # None or "": the model's default
    length: str | None  # the body's declared length, when the transport knows it before reading
    body: Callable[[], AsyncIterator[bytes]]  # the body's bytes (a gRPC call: its serialized message)
    head: Callable[[], RawRequest]  # the request as signed (a gRPC call: POST to its method's path, metadata)


@dataclass(frozen=True)
class InferAnswer:
    """A model's outputs for one inference request: those it asked for, in its order."""

    model: str
    version: str | None
    request: codec.InferRequest
    outputs: list[tuple[str, np.ndarray, bool | None]]  # name, tensor, binary (None: the request's default)


class OpenInference:
    """The V2 operations over the gateway's invocation pipeline; `unroutable()` says why the server is not ready."""

    def __init__(self, invocations: Invocations, unroutable: Callable[[], list[str]]) -> None:
        self.invocations = invocations
        self.signatures = Signatures(invocations.transport)
        self.unroutable = unroutable
        self.server: dict[str, Any] = {
            "name": "serving",
            "version": _version(),
            "extensions": list(protocol.V2_EXTENSIONS),
        }

    async def model_metadata(self, call: ModelCall) -> dict[str, Any]:
        """The model's name, versions, platform and tensors (inputs of its first container, outputs of its last)."""
        admission = await self.admit(call, InvocationTrace())
        endpoint, chain = admission.endpoint, admission.chain
        first = await self.signatures.get(endpoint.name, chain[0])
        last = await self.signatures.get(endpoint.name, chain[-1])
        multi = chain[0] in endpoint.multi_model
        return {
            "name": call.model,
            "versions": [call.version] if multi and call.version else [] if multi else [SINGLE_MODEL_VERSION],
            "platform": first.get("platform", ""),
            "inputs": first["inputs"],
            "outputs": last["outputs"],
        }

    async def model_ready(self, call: ModelCall) -> None:
        """Returns while every container of the model has a replica this gateway routes to; else ModelNotReady."""
        admission = await self.admit(call, InvocationTrace())
        transport = self.invocations.transport
        idle = [c for c in admission.chain if transport.replica_count(admission.endpoint.name, c) == 0]
        if idle:
            raise ModelNotReadyError(f"model {call.model}: no ready replica of {', '.join(idle)}")

    async def infer(
        self, call: ModelCall, trace: InvocationTrace, parse: Callable[[bytes], codec.InferRequest]
    ) -> InferAnswer:
        """Admit the call, `parse` its body into tensors, run the model's containers on them, pick the outputs."""
        admission = await self.admit(call, trace)
        invocation = _invocation(admission.endpoint.name, call)
        inference = parse(await self.invocations.body_of(invocation, admission, trace))
        endpoint, chain = admission.endpoint.name, admission.chain
        signatures = [await self.signatures.get(endpoint, container) for container in chain]
        first, last = signatures[0], signatures[-1]
        payload, content_type = codec.container_body(inference, first["content_type"])
        hop_headers = {"content-type": content_type, "accept": last["accept"]}
        if admission.target_model is not None:
            hop_headers[protocol.TARGET_MODEL] = admission.target_model
        accepts = _tensor_hand_offs(signatures)
        result = await self.invocations.run(admission, payload, Headers(hop_headers), trace, accepts=accepts)
        names = [output["name"] for output in last["outputs"]]
        outputs = codec.answer_tensors(result.body, result.content_type, names)
        return InferAnswer(call.model, call.version, inference, codec.chosen_outputs(call.model, inference, outputs))

    async def admit(self, call: ModelCall, trace: InvocationTrace) -> Admission:
        """The call's model admitted as an InvokeEndpoint call of it (refusals told in this protocol's terms)."""
        endpoint, _, container = call.model.partition(protocol.MODEL_NAME_SEPARATOR)
        if not endpoint:
            raise ValidationError(f"model name {call.model!r} is not <endpoint> or <endpoint>.<container>")
        headers: dict[str, str] = {}
        if container:
            headers[protocol.TARGET_CONTAINER] = container
        if call.version and call.version != SINGLE_MODEL_VERSION:
            headers[protocol.TARGET_MODEL] = call.version  # a MultiModel container's model (refused elsewhere)
        try:
            return await self.invocations.admit(_invocation(endpoint, call, headers), trace)
        except ValidationError as error:
            for header, term in _TERMS.items():
                error.message = error.message.replace(header, term)
            raise


def _tensor_hand_offs(signatures: list[dict[str, Any]]) -> list[str | None]:
    """The Accept each container of a chain but the last is asked for: NPY where it and the next one both carry a
    tensor as NPY (no JSON round trip, dtype and shape intact), else its default, as under InvokeEndpoint."""
    return [
        protocol.NPY if this["content_type"] == protocol.NPY and after["content_type"] == protocol.NPY else None
        for this, after in zip(signatures, signatures[1:], strict=False)
    ]


def _invocation(endpoint: str, call: ModelCall, headers: dict[str, str] | None = None) -> InvocationRequest:
    """The call as the pipeline reads an InvokeEndpoint request: `headers` say what its path or message says."""
    headers = dict(headers or {})
    if call.length is not None:
        headers["content-length"] = call.length
    return InvocationRequest(endpoint, Headers(headers), call.body, call.head)
