"""One Open Inference call, whatever carried it (REST or gRPC): admitted, run and answered as
InvokeEndpoint's.

A model is `<endpoint>.<container>` (one container of a Direct endpoint) or `<endpoint>` (a Serial
endpoint's chain, or an endpoint of one container); a MultiModel container's models are its
versions. Every call that names a model is admitted by `Invocations.admit` exactly as an
InvokeEndpoint call naming that container: the same authentication, the same
`sagemaker:InvokeEndpoint` decision with `sagemaker:TargetContainerHostname`, the same hops. The
transports only translate their wire format and errors; the steps live here once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from importlib import metadata

import numpy as np
import orjson
from starlette.datastructures import Headers

from serving import protocol
from serving.access.sigv4 import RawRequest
from serving.errors import ModelError, ModelNotReadyError, ServingError, ValidationError
from serving.gateway.admission import Admission, InvocationRequest
from serving.gateway.invocation import Invocations
from serving.metrics.invocations import InvocationTrace
from serving.open_inference import codec
from serving.open_inference.signatures import Signatures
from serving.runtimes.tensor_metadata import TensorSignature

SINGLE_MODEL_VERSION = "1"  # the one version of a SingleModel container's model
REPOSITORY_READ_S = 10.0  # a replica's list of models
# a replica's load of one model (a large one: fetched from S3, unpacked, loaded)
REPOSITORY_LOAD_S = 300.0

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


V2_OPERATION = "ModelInfer"  # an inference's root span, over REST and gRPC alike


@dataclass(frozen=True)
class ModelCall:
    """A call naming a model: the name and version, and the request as its transport received it."""

    model: str
    version: str | None  # None or "": the model's default
    length: str | None  # the body's declared length, when the transport knows it before reading
    # the body's bytes (a gRPC call: its serialized message)
    body: Callable[[], AsyncIterator[bytes]]
    # the request as signed (a gRPC call: POST to its method's path, metadata)
    head: Callable[[], RawRequest]


@dataclass(frozen=True)
class InferAnswer:
    """A model's outputs for one inference request: those it asked for, in its order."""

    model: str
    version: str | None
    request: codec.InferRequest
    # name, tensor, binary (None: the request's default)
    outputs: list[tuple[str, np.ndarray, bool | None]]


class OpenInference:
    """The V2 operations over the gateway's invocation pipeline; `unroutable()` says why the server
    is not ready."""

    def __init__(self, invocations: Invocations, unroutable: Callable[[], list[str]]) -> None:
        self.invocations = invocations
        self.signatures = Signatures(invocations.transport)
        self.unroutable = unroutable
        self.server: codec.ServerMetadata = {
            "name": "serving",
            "version": _version(),
            "extensions": list(protocol.V2_EXTENSIONS),
        }

    async def model_metadata(self, call: ModelCall) -> codec.ModelMetadata:
        """The model's name, versions, platform and tensors (inputs of its first container, outputs
        of its last)."""
        admission = await self.admit(call, InvocationTrace())
        endpoint, chain = admission.endpoint, admission.chain
        first = await self.signatures.get(endpoint.name, chain[0])
        last = await self.signatures.get(endpoint.name, chain[-1])
        multi, version = chain[0] in endpoint.multi_model, admission.target_model
        return {
            "name": call.model,
            "versions": [version] if multi and version else [] if multi else [SINGLE_MODEL_VERSION],
            "platform": first.get("platform", ""),
            "inputs": first["inputs"],
            "outputs": last["outputs"],
        }

    async def model_ready(self, call: ModelCall) -> None:
        """Returns while every container of the model has a replica this gateway routes to; else
        ModelNotReady."""
        admission = await self.admit(call, InvocationTrace())
        transport = self.invocations.transport
        idle = [
            c for c in admission.chain if transport.replica_count(admission.endpoint.name, c) == 0
        ]
        if idle:
            raise ModelNotReadyError(f"model {call.model}: no ready replica of {', '.join(idle)}")

    async def infer(
        self, call: ModelCall, trace: InvocationTrace, parse: Callable[[bytes], codec.InferRequest]
    ) -> InferAnswer:
        """Admit the call, `parse` its body into tensors, run the model's containers on them, pick
        the outputs."""
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
        result = await self.invocations.run(
            admission, payload, Headers(hop_headers), trace, accepts=accepts
        )
        names = [output["name"] for output in last["outputs"]]
        outputs = codec.answer_tensors(result.body, result.content_type, names)
        return InferAnswer(
            call.model,
            call.version,
            inference,
            codec.chosen_outputs(call.model, inference, outputs),
        )

    # --- the model repository extension: a MultiModel container's cache ---------------------------
    async def repository_index(
        self, head: RawRequest, ready_only: bool = False
    ) -> list[dict[str, str]]:
        """The models of every MultiModel container the caller may invoke (`head`: its request, body
        included), named `<endpoint>.<container>.<model>`: READY when loaded in every replica, else
        UNAVAILABLE and why."""
        entries: list[dict[str, str]] = []
        for name, endpoint in sorted(self.invocations.endpoints.items()):
            if (
                not endpoint.multi_model
                or protocol.VARIANT_SEPARATOR in name
                or endpoint.failure is not None
            ):
                continue
            access = endpoint.access
            caller = access.known_caller(head) if access is not None else None
            if (access is not None and caller is None) or (
                access is None and not self.invocations.settings.anonymous_allowed
            ):
                continue
            for container in sorted(endpoint.multi_model):
                try:
                    answers = await self.invocations.transport.each(
                        name, container, "GET", protocol.REPOSITORY_PATH, b"", REPOSITORY_READ_S
                    )
                    replicas = [
                        orjson.loads(answer.body) for answer in answers if answer.status == 200
                    ]
                except (ServingError, orjson.JSONDecodeError):
                    continue  # no replica to ask now: its models are not listed
                for model in sorted(
                    {model for replica in replicas for model in replica["available"]}
                ):
                    if (
                        access is not None
                        and caller is not None
                        and not access.permits(name, caller, container, model)
                    ):
                        continue
                    loaded = sum(model in replica["loaded"] for replica in replicas)
                    if loaded == len(replicas):
                        entries.append(
                            {"name": f"{name}.{container}.{model}", "state": "READY", "reason": ""}
                        )
                    elif not ready_only:
                        reason = (
                            f"loaded in {loaded} of {len(replicas)} replicas"
                            if loaded
                            else "not loaded"
                        )
                        entries.append(
                            {
                                "name": f"{name}.{container}.{model}",
                                "state": "UNAVAILABLE",
                                "reason": reason,
                            }
                        )
        return entries

    async def repository_change(self, call: ModelCall, action: str) -> None:
        """`load` or `unload` a MultiModel container's model in every replica's cache, admitted as
        an invocation of that model (loading is what its first invocation does; unloading what the
        cache does when full)."""
        admission = await self.admit(call, InvocationTrace())
        if admission.target_model is None:
            raise ValidationError(
                f"model {call.model} is not a MultiModel container's model (<endpoint>.<container>.<model>)"
            )
        endpoint, container = admission.endpoint.name, admission.chain[0]
        body = orjson.dumps({"model": admission.target_model})
        path = f"{protocol.REPOSITORY_PATH}/{action}"
        for answer in await self.invocations.transport.each(
            endpoint, container, "POST", path, body, REPOSITORY_LOAD_S
        ):
            if answer.status >= 400:
                message = _error_message(answer.body)
                if answer.status < 500:
                    raise ValidationError(message)
                raise ModelError(
                    message,
                    container=container,
                    original_status=answer.status,
                    original_message=message,
                )

    async def admit(self, call: ModelCall, trace: InvocationTrace) -> Admission:
        """The call's model admitted as an InvokeEndpoint call of it (refusals told in this
        protocol's terms)."""
        endpoint, container, version = _parts(call)
        headers: dict[str, str] = {}
        if container:
            headers[protocol.TARGET_CONTAINER] = container
        if version and version != SINGLE_MODEL_VERSION:
            # a MultiModel container's model (refused elsewhere)
            headers[protocol.TARGET_MODEL] = version
        try:
            return await self.invocations.admit(_invocation(endpoint, call, headers), trace)
        except ValidationError as error:
            for header, term in _TERMS.items():
                error.message = error.message.replace(header, term)
            raise


def _error_message(body: bytes) -> str:
    """The message of a container's error answer (SageMaker's `{"message"}` shape), else its
    text."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        document = None
    return (
        str(document.get("message"))
        if isinstance(document, dict)
        else body[:300].decode("utf-8", "replace")
    )


def _parts(call: ModelCall) -> tuple[str, str, str | None]:
    """Endpoint, container and version of a model name: `<endpoint>[.<container>[.<model>]]`, where
    a third part names a MultiModel container's model as its version would (names of endpoints and
    containers have no dot)."""
    endpoint, _, rest = call.model.partition(protocol.MODEL_NAME_SEPARATOR)
    container, _, model = rest.partition(protocol.MODEL_NAME_SEPARATOR)
    if not endpoint or (model and not container):
        raise ValidationError(
            f"model name {call.model!r} is not <endpoint>, <endpoint>.<container> or ...<model>"
        )
    if model and call.version and call.version != model:
        raise ValidationError(
            f"model name {call.model!r} names model {model!r}, its version {call.version!r}"
        )
    return endpoint, container, model or call.version


def _tensor_hand_offs(signatures: list[TensorSignature]) -> list[str | None]:
    """The Accept each container of a chain but the last is asked for: NPY where it and the next one
    both carry a tensor as NPY (no JSON round trip, dtype and shape intact), else its default, as
    under InvokeEndpoint."""
    return [
        protocol.NPY
        if this["content_type"] == protocol.NPY and after["content_type"] == protocol.NPY
        else None
        for this, after in zip(signatures, signatures[1:], strict=False)
    ]


def _invocation(
    endpoint: str, call: ModelCall, headers: dict[str, str] | None = None
) -> InvocationRequest:
    """The call as the pipeline reads an InvokeEndpoint request: `headers` say what its path or
    message says."""
    headers = dict(headers or {})
    if call.length is not None:
        headers["content-length"] = call.length
    return InvocationRequest(endpoint, Headers(headers), call.body, call.head)
