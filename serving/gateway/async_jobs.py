"""An admitted InvokeEndpointAsync request (`Job`), its queue (`Lane`), and the journal that keeps it beyond one
gateway's life (`Journal`; Ray's key-value store in `ray_wing.async_journal`)."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from serving.config.async_inference import AsyncInferenceConfig
from serving.gateway.invocation import Admission, EndpointRoute
from serving.s3 import S3Location

__all__ = ["Job", "JobEntry", "Journal", "Lane", "TakenEntry"]


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


def job_from_entry(entry: TakenEntry, route: EndpointRoute, config: AsyncInferenceConfig, now: float) -> Job:
    """A job another gateway admitted, from its journal entry, to run on this gateway's route (`now`: monotonic)."""
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
