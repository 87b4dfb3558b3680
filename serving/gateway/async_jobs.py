"""An admitted InvokeEndpointAsync request (`Job`: from its checked headers, or from a journal
entry), its queue (`Lane`), and the journal that keeps it beyond one gateway's life (`Journal`;
Ray's key-value store in `ray_wing.async_journal`)."""

from __future__ import annotations

import asyncio
import base64
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from serving import protocol
from serving.config.async_inference import AsyncInferenceConfig
from serving.errors import ValidationError
from serving.gateway.admission import Admission, EndpointRoute
from serving.s3 import S3Location, parse_s3_uri

__all__ = ["Job", "JobEntry", "Journal", "Lane", "TakenEntry", "job_from_entry", "job_from_request"]


class JobEntry(TypedDict):
    """A job as the journal keeps it (JSON): enough for another gateway to run it."""

    endpoint: str
    chain: list[str]
    target_model: str | None
    variant: str
    inference_id: str
    source: list[str] | None  # [bucket, key]; None: the input is `body`
    body: str | None  # base64
    headers: dict[str, str]
    output: list[str]  # [bucket, key]
    failure: list[str]
    s3_endpoint_url: str | None
    admitted_at: float  # wall clock
    ttl: int
    timeout: float


class TakenEntry(JobEntry):
    """A journal entry as another gateway takes it over."""

    key: str
    owner: str  # the gateway that admitted it


class Journal(Protocol):
    """Where admitted jobs are kept until they finish, beyond the life of one gateway."""

    def record(self, key: str, entry: JobEntry) -> None: ...

    def remove(self, key: str) -> None: ...

    def take_orphans(self) -> list[TakenEntry]:
        """The jobs of gateways gone silent, now this gateway's (each taken by one gateway only)."""
        ...


@dataclass
class Job:
    """One admitted InvokeEndpointAsync request, waiting or running."""

    admission: Admission
    config: AsyncInferenceConfig
    inference_id: str
    source: S3Location | None  # None: the input came inline, in `body`
    body: bytes | None
    headers: dict[str, str]  # what the pipeline forwards, under the names InvokeEndpoint uses
    output: S3Location
    failure: S3Location
    admitted: float  # monotonic time of its admission
    ttl: int  # RequestTTLSeconds: a job that waited longer is failed, not run
    timeout: float  # InvocationTimeoutSeconds
    key: str = field(default_factory=lambda: uuid.uuid4().hex)  # its journal entry
    admitted_at: float = field(default_factory=time.time)  # wall-clock time of its admission
    # the admission's trace context (tracing on): the run's trace links to it; not journaled, so a
    # run another gateway takes over starts unlinked
    link: dict[str, str] | None = None

    def entry(self) -> JobEntry:
        """What the journal keeps: enough for another gateway to run it (JSON)."""
        return {
            "endpoint": self.admission.endpoint.name,
            "chain": list(self.admission.chain),
            "target_model": self.admission.target_model,
            "variant": self.admission.variant,
            "inference_id": self.inference_id,
            "source": [self.source.bucket, self.source.key] if self.source is not None else None,
            "body": base64.b64encode(self.body).decode() if self.body is not None else None,
            "headers": self.headers,
            "output": [self.output.bucket, self.output.key],
            "failure": [self.failure.bucket, self.failure.key],
            "s3_endpoint_url": self.config.S3EndpointUrl,
            "admitted_at": self.admitted_at,
            "ttl": self.ttl,
            "timeout": self.timeout,
        }


@dataclass
class Lane:
    """One endpoint's queue: jobs admitted, and how many may run at once."""

    slots: asyncio.Semaphore
    concurrency: int
    admitted: int = 0  # waiting plus running


def job_from_entry(
    entry: TakenEntry, route: EndpointRoute, config: AsyncInferenceConfig, now: float
) -> Job:
    """A job another gateway admitted, from its journal entry, to run on this gateway's route
    (`now`: monotonic)."""
    return Job(
        Admission(route, tuple(entry["chain"]), entry["target_model"], None, entry["variant"]),
        config,
        entry["inference_id"],
        S3Location(*entry["source"]) if entry["source"] is not None else None,
        base64.b64decode(entry["body"]) if entry["body"] is not None else None,
        entry["headers"],
        S3Location(*entry["output"]),
        S3Location(*entry["failure"]),
        admitted=now - max(time.time() - entry["admitted_at"], 0.0),
        ttl=entry["ttl"],
        timeout=entry["timeout"],
        key=entry["key"],
        admitted_at=entry["admitted_at"],
    )


def job_from_request(
    admission: Admission, headers: Mapping[str, str], body: bytes, admitted: float
) -> Job:
    """The job an admitted InvokeEndpointAsync request asks for, its headers checked as SageMaker
    checks them (`admitted`: monotonic)."""
    endpoint = admission.endpoint
    config = endpoint.async_inference
    if config is None:
        raise ValidationError(
            f"Endpoint {endpoint.name} has no AsyncInferenceConfig, so it does not serve InvokeEndpointAsync; "
            "use InvokeEndpoint, or give the endpoint an AsyncInferenceConfig"
        )
    location = headers.get(protocol.INPUT_LOCATION)
    source = None
    if location is not None:
        if body:
            raise ValidationError(
                "Body and InputLocation are mutually exclusive: provide exactly one of them"
            )
        source = _input(location, config)
    elif not body:
        raise ValidationError(f"InputLocation ({protocol.INPUT_LOCATION}) is required")
    elif len(body) > protocol.MAX_ASYNC_BODY:
        raise ValidationError(
            f"an inline Body holds at most {protocol.MAX_ASYNC_BODY} bytes; use InputLocation"
        )
    inference_id = headers.get(protocol.INFERENCE_ID) or str(uuid.uuid4())
    _check_inference_id(inference_id)
    forwarded = {
        "content-type": headers.get(protocol.ASYNC_CONTENT_TYPE),
        "accept": headers.get(protocol.ASYNC_ACCEPT),
    }
    forwarded[protocol.CUSTOM_ATTRIBUTES] = headers.get(protocol.CUSTOM_ATTRIBUTES)
    forwarded[protocol.INFERENCE_ID] = inference_id
    ttl = _seconds(
        headers, protocol.REQUEST_TTL, protocol.REQUEST_TTL_RANGE, protocol.DEFAULT_REQUEST_TTL
    )
    timeout = _seconds(
        headers,
        protocol.INVOCATION_TIMEOUT,
        protocol.INVOCATION_TIMEOUT_RANGE,
        protocol.DEFAULT_INVOCATION_TIMEOUT,
    )
    return Job(
        admission,
        config,
        inference_id,
        source,
        None if source is not None else bytes(body),
        {key: value for key, value in forwarded.items() if value is not None},
        _output(config, inference_id, headers),
        config.OutputConfig.failure.child(inference_id + protocol.FAILURE_SUFFIX),
        admitted=admitted,
        ttl=ttl,
        timeout=timeout,
    )


# SageMaker's patterns for S3OutputPathExtension and Filename.
_EXTENSION = re.compile(r"^(?!s3:|https:)[a-zA-Z0-9!_.*'()/-]{1,512}$")
_FILENAME = re.compile(r"^(?!.*\..*\.)[a-zA-Z0-9][a-zA-Z0-9_.-]{0,31}$")


def _input(location: str, config: AsyncInferenceConfig) -> S3Location:
    if len(location) > protocol.MAX_INPUT_LOCATION:
        raise ValidationError(
            f"InputLocation is longer than {protocol.MAX_INPUT_LOCATION} characters"
        )
    try:
        source = parse_s3_uri(location, "InputLocation")
    except ValueError as error:
        raise ValidationError(str(error)) from None
    allowed = config.InputConfig.input
    if not allowed.contains(source) or source.key == allowed.folder:
        raise ValidationError(
            f"InputLocation {location} is outside this endpoint's inputs: it must name an object under "
            f"{allowed.uri} (AsyncInferenceConfig.InputConfig.S3InputPath)"
        )
    return source


def _check_inference_id(inference_id: str) -> None:
    # It becomes part of an S3 key: printable ASCII (SageMaker's pattern), and no segment that
    # leaves a folder.
    if not inference_id.isprintable() or not inference_id.isascii() or inference_id[:1].isspace():
        raise ValidationError(
            f"{protocol.INFERENCE_ID} must be printable ASCII, not starting with a space"
        )
    if any(segment in ("", ".", "..") for segment in inference_id.split("/")):
        raise ValidationError(
            f"{protocol.INFERENCE_ID} may not have empty, '.' or '..' path segments"
        )


def _output(
    config: AsyncInferenceConfig, inference_id: str, headers: Mapping[str, str]
) -> S3Location:
    """`<S3OutputPath>[/<S3OutputPathExtension>]/<Filename or InferenceId.out>`."""
    place = config.OutputConfig.output
    extension = headers.get(protocol.OUTPUT_PATH_EXTENSION)
    if extension is not None:
        if not _EXTENSION.match(extension) or any(
            s in ("", ".", "..") for s in extension.strip("/").split("/")
        ):
            raise ValidationError(
                f"{protocol.OUTPUT_PATH_EXTENSION} {extension!r} is not a relative S3 path"
            )
        place = S3Location(place.bucket, place.folder + extension.strip("/"))
    filename = headers.get(protocol.OUTPUT_FILENAME)
    if filename is not None and not _FILENAME.match(filename):
        raise ValidationError(
            f"{protocol.OUTPUT_FILENAME} {filename!r} is not a valid file name (at most 32 characters)"
        )
    return place.child(filename or inference_id + protocol.OUTPUT_SUFFIX)


def _seconds(headers: Mapping[str, str], name: str, bounds: tuple[int, int], default: int) -> int:
    value = headers.get(name)
    if value is None:
        return default
    low, high = bounds
    if not value.isdigit() or not low <= int(value) <= high:
        raise ValidationError(f"{name} must be a whole number of seconds from {low} to {high}")
    return int(value)
