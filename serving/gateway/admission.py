"""What an invocation is: the request as any server hands it in, the endpoint's route, what it is
admitted as (the chain its headers pick, their checks), and its answer.

The pipeline (`invocation`) runs the checks before any body is read, so that a request naming no
container, a container the endpoint lacks or a model a SingleModel container cannot take is refused
at its headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from serving import protocol
from serving.access.decision import EndpointAccess
from serving.access.sigv4 import RawRequest
from serving.config.async_inference import AsyncInferenceConfig
from serving.config.data_capture import DataCaptureConfig
from serving.errors import ValidationError
from serving.gateway.transport import HopStream
from serving.gateway.variants import ShadowRoute
from serving.models.store import validate_target

__all__ = [
    "Admission",
    "EndpointRoute",
    "InvocationRequest",
    "InvocationResult",
    "chain_of",
    "check_headers",
    "target_model_of",
]


@dataclass
class InvocationRequest:
    """One InvokeEndpoint request as the pipeline needs it, whatever server received it."""

    endpoint: str
    headers: Mapping[str, str]  # looked up case-insensitively (the adapter passes such a mapping)
    body: Callable[[], AsyncIterator[bytes]]  # the body's chunks as they arrive; may be called once
    head: Callable[[], RawRequest]  # the request exactly as it arrived, for signature verification


@dataclass
class InvocationResult:
    """The answer to a successful invocation: the last container's body and what goes with it."""

    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)
    # InvokeEndpointWithResponseStream: the last container's event-stream bytes as they arrive
    # (`body` is empty)
    chunks: HopStream | None = None


@dataclass(frozen=True)
class EndpointRoute:
    """What the router needs to know of one endpoint."""

    name: str
    mode: str  # "Direct" or "Serial"
    containers: tuple[str, ...]
    failure: str | None = None  # set when the endpoint is Failed
    # None: no AccessControl (anonymous, see ServerSettings.anonymous_allowed)
    access: EndpointAccess | None = None
    multi_model: frozenset[str] = frozenset()  # hostnames of its MultiModel containers
    async_inference: AsyncInferenceConfig | None = None  # set when it serves InvokeEndpointAsync
    # set while it captures a share of its invocations
    data_capture: DataCaptureConfig | None = None


@dataclass(frozen=True)
class Admission:
    """An invocation that passed every check: what runs, and the body if authentication had to read
    it."""

    endpoint: EndpointRoute
    chain: tuple[str, ...]
    target_model: str | None
    body: bytes | None
    variant: str = protocol.DEFAULT_VARIANT  # the production variant that runs it
    # the shadow variant a copy goes to, when this invocation is sampled
    shadow: ShadowRoute | None = None


def chain_of(endpoint: EndpointRoute, headers: Mapping[str, str], name: str) -> tuple[str, ...]:
    """The containers a request runs: the whole chain (Serial) or the one its
    TargetContainerHostname names.

    Errors name the endpoint as the caller did (an API endpoint's name, not its variant's served
    one)."""
    target = headers.get(protocol.TARGET_CONTAINER)
    if endpoint.mode == "Serial":
        if target is not None:
            raise ValidationError(
                f"{protocol.TARGET_CONTAINER} is not allowed: endpoint {name} runs its containers in Serial mode"
            )
        return endpoint.containers
    if target is None:
        if len(endpoint.containers) == 1:
            return endpoint.containers
        raise ValidationError(
            f"{protocol.TARGET_CONTAINER} is required: endpoint {name} has {len(endpoint.containers)} "
            f"containers ({', '.join(endpoint.containers)})"
        )
    if target not in endpoint.containers:
        raise ValidationError(
            f"{protocol.TARGET_CONTAINER} {target!r} names no container of endpoint {name}; "
            f"containers: {', '.join(endpoint.containers)}"
        )
    return (target,)


def check_headers(
    headers: Mapping[str, str], stream: bool = False, variant_checked: bool = False
) -> None:
    """SageMaker's limits on the headers a container receives, and what a stream cannot take."""
    if stream:
        for header, parameter in protocol.STREAM_UNSUPPORTED.items():
            if header in headers:
                raise ValidationError(
                    f"{parameter} ({header}) is not supported by this endpoint server"
                )
    variant = headers.get(protocol.TARGET_VARIANT)
    if not variant_checked and variant is not None and variant != protocol.DEFAULT_VARIANT:
        raise ValidationError(
            f"{protocol.TARGET_VARIANT} {variant!r} does not exist; the only variant is {protocol.DEFAULT_VARIANT}"
        )
    inference_id = headers.get(protocol.INFERENCE_ID)
    if inference_id is not None and not (
        1 <= len(inference_id) <= protocol.MAX_INFERENCE_ID and inference_id.isascii()
    ):
        raise ValidationError(
            f"{protocol.INFERENCE_ID} must be 1-{protocol.MAX_INFERENCE_ID} ASCII characters"
        )
    attributes = headers.get(protocol.CUSTOM_ATTRIBUTES)
    if attributes is not None and (
        len(attributes) > protocol.MAX_CUSTOM_ATTRIBUTES or not attributes.isascii()
    ):
        raise ValidationError(
            f"{protocol.CUSTOM_ATTRIBUTES} must be at most {protocol.MAX_CUSTOM_ATTRIBUTES} ASCII characters"
        )


def target_model_of(
    endpoint: EndpointRoute, chain: tuple[str, ...], headers: Mapping[str, str], name: str
) -> str | None:
    """The TargetModel of a MultiModel container (required there, refused elsewhere), checked
    early."""
    target_model = headers.get(protocol.TARGET_MODEL)
    multi = [container for container in chain if container in endpoint.multi_model]
    if not multi:
        if target_model is not None:
            raise ValidationError(
                f"{protocol.TARGET_MODEL} is only valid for MultiModel containers; "
                f"container {chain[0]} of endpoint {name} is SingleModel"
            )
        return None
    if target_model is None:
        raise ValidationError(
            f"{protocol.TARGET_MODEL} is required: container {multi[0]} of endpoint {name} is MultiModel"
        )
    return validate_target(target_model)
