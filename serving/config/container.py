"""Container fields of the endpoint spec: one serving stack plus its model, resources, scaling and
environment."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator, model_validator

from serving.config.placement import ResourceConfig, RuntimeEnvironmentConfig, local_path
from serving.config.scaling import AutoScalingConfig
from serving.config.tensor_signature import check_tensor_signature
from serving.documents import Document
from serving.model_server.sandbox import startup_variables
from serving.models.cache_limits import CacheLimits
from serving.protocol import (  # container settings read from its Environment
    CPUS_ENV,
    IDEMPOTENT_ENV,
    MAX_BATCH_DELAY_ENV,
    MAX_BATCH_SIZE_ENV,
    MAX_CONCURRENCY_ENV,
    MAX_MODELS_ENV,
    MODEL_DISK_ENV,
    MODEL_MEMORY_ENV,
    NAME_PATTERN,
    PREFERRED_BATCH_SIZES_ENV,
    TENSOR_SIGNATURE_ENV,
)
from serving.runtimes import (
    STACKS as KNOWN_IMAGES,  # one module per stack, none imported here
)
from serving.runtimes.concurrency import batch_settings, inline_budget_s, model_threads

__all__ = [
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_MODELS",
    "DEFAULT_MODEL_DISK_MB",
    "IDEMPOTENT_ENV",
    "KNOWN_IMAGES",
    "MAX_CONCURRENCY_ENV",
    "MAX_MODELS_ENV",
    "MODEL_DISK_ENV",
    "MODEL_MEMORY_ENV",
    "BatchingConfig",
    "CacheSetting",
    "ContainerMode",
    "ContainerSpec",
    "MultiModelSettings",
    "ResourceConfig",
    "RuntimeEnvironmentConfig",
]

DEFAULT_MAX_CONCURRENCY = 128
# MultiModel cache bounds per replica, set in a container's Environment (whole numbers).
DEFAULT_MAX_MODELS = 16
DEFAULT_MODEL_DISK_MB = 10240


class ContainerMode(str, Enum):
    """SingleModel: one model always loaded. MultiModel: many models loaded on demand."""

    SINGLE = "SingleModel"
    MULTI = "MultiModel"


class CacheSetting(str, Enum):
    ENABLED = "Enabled"
    DISABLED = "Disabled"


class MultiModelSettings(Document):
    """SageMaker's MultiModelConfig: Disabled loads the model for each request and unloads it
    after."""

    ModelCacheSetting: CacheSetting = CacheSetting.ENABLED


class BatchingConfig(Document):
    """Dynamic batching: concurrent requests to a replica merged into one predict_fn call
    (docs/benchmarks/bench_batching.md)."""

    MaxBatchSize: int = Field(
        ge=1,
        le=1_000_000,
        description="Most rows in one predict_fn call; a request with more runs alone. 1: off.",
    )
    MaxDelayMs: float = Field(
        0.0,
        ge=0,
        le=60_000,
        description="How long the first queued request waits for others before its batch runs (milliseconds).",
    )
    PreferredBatchSizes: list[Annotated[int, Field(ge=1)]] | None = Field(
        None,
        max_length=64,
        description="Batch sizes to cut at when a prefix of the queued requests reaches one (the largest that "
        "fits), as Triton's dynamic batcher; each at most MaxBatchSize.",
    )

    @model_validator(mode="after")
    def _preferred_fit(self) -> BatchingConfig:
        too_big = [size for size in self.PreferredBatchSizes or () if size > self.MaxBatchSize]
        if too_big:
            raise ValueError(
                f"PreferredBatchSizes {too_big} exceed MaxBatchSize {self.MaxBatchSize}"
            )
        return self

    def environment(self) -> dict[str, str]:
        """The same settings as the container process reads them."""
        environment = {
            MAX_BATCH_SIZE_ENV: str(self.MaxBatchSize),
            MAX_BATCH_DELAY_ENV: f"{self.MaxDelayMs:g}",
        }
        if self.PreferredBatchSizes:
            environment[PREFERRED_BATCH_SIZES_ENV] = ",".join(map(str, self.PreferredBatchSizes))
        return environment


class ContainerSpec(Document):
    """One serving stack plus its model, with its own hostname and resources."""

    ContainerHostname: Annotated[
        str,
        Field(
            pattern=NAME_PATTERN,
            max_length=63,
            description="1-63 letters, digits or hyphens; unique in the endpoint.",
        ),
    ]
    Image: str = Field(description=f"Serving stack: one of {', '.join(KNOWN_IMAGES)}.")
    ModelDataUrl: str | None = Field(
        None,
        description="Model artifact: a directory, file:// URL or .tar.gz, relative to the spec file. "
        "MultiModel: the prefix holding every model (a directory, file:// or s3://).",
    )
    Mode: ContainerMode = ContainerMode.SINGLE
    MultiModelConfig: MultiModelSettings | None = Field(
        None, description="MultiModel only: ModelCacheSetting Enabled (default) or Disabled."
    )
    Environment: dict[Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]{0,1023}$")], str] = (
        Field(default_factory=dict)
    )
    EnableNetworkIsolation: bool = Field(
        True,
        description="True (the default here; SageMaker's is false): the container's process has a network namespace "
        "of its own and reaches nothing. False: it may connect out, over TCP to the server's "
        "container_egress_ports only, which the operator must have set (docs/security.md).",
    )
    Resources: ResourceConfig = Field(default_factory=ResourceConfig)
    AutoScaling: AutoScalingConfig | None = None
    RuntimeEnvironment: RuntimeEnvironmentConfig | None = Field(
        None,
        description="Extra pip packages and a working directory for this container's replicas.",
    )
    Batching: BatchingConfig | None = Field(
        None,
        description="Dynamic batching of a SingleModel container: MaxBatchSize, MaxDelayMs, PreferredBatchSizes "
        "(or the SERVING_MAX_BATCH_SIZE, SERVING_MAX_BATCH_DELAY_MS, SERVING_PREFERRED_BATCH_SIZES variables).",
    )

    @field_validator("Image")
    @classmethod
    def _known_image(cls, image: str) -> str:
        if image not in KNOWN_IMAGES:
            hint = (
                " (OCI image references are not run by this version: see containers/README.md)"
                if "/" in image or ":" in image
                else ""
            )
            raise ValueError(
                f"unknown Image {image!r}; this version serves: {', '.join(KNOWN_IMAGES)}{hint}"
            )
        return image

    @field_validator("Environment")
    @classmethod
    def _no_startup_variables(cls, environment: dict[str, str]) -> dict[str, str]:
        refused = startup_variables(environment)
        if refused:
            raise ValueError(
                f"{', '.join(refused)} may not be set: the dynamic loader, glibc or an interpreter reads "
                f"{'it' if len(refused) == 1 else 'them'} as a process starts, to choose code to run or files to "
                'load (docs/security.md, "The sandbox")'
            )
        return environment

    @field_validator("Environment")
    @classmethod
    def _tensor_signature_is_one(cls, environment: dict[str, str]) -> dict[str, str]:
        declared = environment.get(TENSOR_SIGNATURE_ENV)
        if declared is not None:
            check_tensor_signature(declared)
        return environment

    @field_validator("ModelDataUrl")
    @classmethod
    def _resolve_model_data(cls, url: str | None, info: ValidationInfo) -> str | None:
        if url is None or url.startswith("s3://"):
            return url  # s3:// is checked against Mode below
        path = local_path(url, info)
        if not path.exists():
            raise ValueError(f"model data {url!r} does not exist (looked at {path})")
        if path.is_file() and not path.name.endswith((".tar.gz", ".tgz")):
            raise ValueError(f"model data {url!r} must be a directory or a .tar.gz archive")
        return str(path.resolve())

    @model_validator(mode="after")
    def _model_data_fits_the_mode(self) -> ContainerSpec:
        url = self.ModelDataUrl
        if self.Mode is ContainerMode.MULTI:
            if url is None:
                raise ValueError(
                    "ModelDataUrl is required for a MultiModel container: the prefix holding its models"
                )
            if url.startswith("s3://"):
                bucket = url[len("s3://") :].split("/", 1)[0]
                if not bucket:
                    raise ValueError(f"ModelDataUrl {url!r} names no bucket (s3://bucket/prefix/)")
            elif not Path(url).is_dir():
                raise ValueError(
                    f"ModelDataUrl {url!r} of a MultiModel container must be a directory or s3:// prefix"
                )
        else:
            if url is not None and url.startswith("s3://"):
                bucket, _, key = url[len("s3://") :].partition("/")
                if not bucket or not key.endswith((".tar.gz", ".tgz")):
                    raise ValueError(
                        f"ModelDataUrl {url!r}: a SingleModel container's s3:// model data is one .tar.gz object "
                        "(s3://bucket/path/model.tar.gz), as SageMaker's; a prefix is for MultiModel containers"
                    )
            if self.MultiModelConfig is not None:
                raise ValueError(
                    "MultiModelConfig applies to MultiModel containers only (set Mode: MultiModel)"
                )
        return self

    @model_validator(mode="after")
    def _batching_said_once(self) -> ContainerSpec:
        given = [
            name
            for name in (MAX_BATCH_SIZE_ENV, MAX_BATCH_DELAY_ENV, PREFERRED_BATCH_SIZES_ENV)
            if name in self.Environment
        ]
        if self.Batching is not None and given:
            raise ValueError(
                f"Batching and Environment {', '.join(given)} both set: set one of them"
            )
        if self.Mode is ContainerMode.MULTI and (self.Batching is not None or given):
            raise ValueError("Batching applies to SingleModel containers only")
        return self

    @property
    def batching_environment(self) -> dict[str, str]:
        """The Batching field as the container's environment variables (none when it is not set)."""
        return self.Batching.environment() if self.Batching is not None else {}

    @property
    def model_threads(self) -> int:
        """Predictions one replica runs at once, as far as the spec tells (a user's script may lower
        it to 1)."""
        return model_threads(self.Image, {**self.Environment, CPUS_ENV: f"{self.Resources.Cpus:g}"})

    @property
    def max_concurrency(self) -> int:
        """In-flight requests the router lets reach one replica before answering 429; by default
        enough to keep its model threads and a full batch busy (at least 128)."""
        if MAX_CONCURRENCY_ENV in self.Environment:
            return int(self.Environment[MAX_CONCURRENCY_ENV])
        batching = batch_settings({**self.Environment, **self.batching_environment})
        return max(
            DEFAULT_MAX_CONCURRENCY,
            self.model_threads + (batching.max_batch_size if batching else 0),
        )

    @property
    def idempotent(self) -> bool:
        """Whether a request whose connection broke before any answer may be sent again to another
        replica."""
        return self.Environment.get(IDEMPOTENT_ENV, "true").strip().lower() not in (
            "false",
            "0",
            "no",
            "off",
        )

    @field_validator("Environment")
    @classmethod
    def _counts_are_counts(cls, environment: dict[str, str]) -> dict[str, str]:
        for name in (MAX_CONCURRENCY_ENV, MAX_MODELS_ENV, MODEL_MEMORY_ENV, MODEL_DISK_ENV):
            value = environment.get(name)
            if value is not None and not (value.isdigit() and int(value) >= 1):
                raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
        try:
            batch_settings(environment)
            model_threads("", environment)
            inline_budget_s(environment)
        except ValueError as error:
            raise ValueError(str(error)) from None
        flag = environment.get(IDEMPOTENT_ENV)
        if flag is not None and flag.strip().lower() not in (
            "true",
            "false",
            "1",
            "0",
            "yes",
            "no",
            "on",
            "off",
        ):
            raise ValueError(f"{IDEMPOTENT_ENV} must be true or false, got {flag!r}")
        return environment

    @property
    def multi_model(self) -> CacheLimits | None:
        """A MultiModel container's cache settings for its replicas, or None for SingleModel."""
        if self.Mode is not ContainerMode.MULTI:
            return None
        memory_mb: str | int | None = self.Environment.get(MODEL_MEMORY_ENV)
        if memory_mb is None and self.Resources.MemoryMb:
            memory_mb = int(self.Resources.MemoryMb * 0.8)  # room for the runtime itself
        settings = self.MultiModelConfig or MultiModelSettings()
        return {
            "cache_enabled": settings.ModelCacheSetting is CacheSetting.ENABLED,
            "max_models": int(self.Environment.get(MAX_MODELS_ENV, DEFAULT_MAX_MODELS)),
            "max_bytes": int(memory_mb) * 2**20 if memory_mb else None,
            "max_disk_bytes": int(self.Environment.get(MODEL_DISK_ENV, DEFAULT_MODEL_DISK_MB))
            * 2**20,
        }

    @property
    def replicas(self) -> int:
        """Replicas started with the container (autoscaling starts at its minimum)."""
        return self.AutoScaling.MinCapacity if self.AutoScaling else 1
