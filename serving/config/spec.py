"""The endpoint spec: SageMaker CreateModel-shaped fields, validated by pydantic, and how a spec
file is loaded.

One source of truth for configuration. Every rejection names the field at fault
(`Containers[1].ContainerHostname: ...`) so users can fix their YAML quickly. The fields of one
container are in `container`, its autoscaling in `scaling`; what the spec shares with the identities
and policy documents (strict models, the message shape, the path rule) in `documents`. Every name
other modules use is importable from here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError

from serving.access.identities import Identities, IdentitiesError, load_identities
from serving.config.async_inference import AsyncInferenceConfig

# the field shares its name
from serving.config.async_inference import AsyncInferenceConfig as _AsyncConfig
from serving.config.container import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_MODELS,
    DEFAULT_MODEL_DISK_MB,
    IDEMPOTENT_ENV,
    KNOWN_IMAGES,
    MAX_CONCURRENCY_ENV,
    MAX_MODELS_ENV,
    MODEL_DISK_ENV,
    MODEL_MEMORY_ENV,
    CacheSetting,
    ContainerMode,
    ContainerSpec,
    MultiModelSettings,
    ResourceConfig,
    RuntimeEnvironmentConfig,
)

# the field shares its name
from serving.config.data_capture import DataCaptureConfig as _CaptureConfig
from serving.config.scaling import (
    AutoScalingConfig,
    CustomizedMetric,
    PredefinedMetric,
    TargetTrackingPolicy,
)
from serving.documents import (
    BASE_DIR,
    Document,
    describe,
    document_path,
    folder_of,
)
from serving.protocol import NAME_PATTERN

__all__ = [
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_MODELS",
    "DEFAULT_MODEL_DISK_MB",
    "IDEMPOTENT_ENV",
    "KNOWN_IMAGES",
    "MAX_CONCURRENCY_ENV",
    "MAX_CONTAINERS",
    "MAX_MODELS_ENV",
    "MODEL_DISK_ENV",
    "MODEL_MEMORY_ENV",
    "RESERVED_NAME",
    "AccessControlConfig",
    "AsyncInferenceConfig",
    "AutoScalingConfig",
    "CacheSetting",
    "ContainerMode",
    "ContainerSpec",
    "CustomizedMetric",
    "EndpointSpec",
    "ExecutionConfig",
    "ExecutionMode",
    "MultiModelSettings",
    "PredefinedMetric",
    "ResourceConfig",
    "RuntimeEnvironmentConfig",
    "SpecError",
    "TargetTrackingPolicy",
    "load_spec",
    "parse_spec",
]

MAX_CONTAINERS = 15
RESERVED_NAME = "serving-gateway"  # what the endpoint server's gateways are named after


class SpecError(ValueError):
    """A spec that cannot be served; the message names every field at fault."""


class ExecutionMode(str, Enum):
    """How requests flow through the containers of an endpoint."""

    DIRECT = "Direct"
    SERIAL = "Serial"


class ExecutionConfig(Document):
    """SageMaker's InferenceExecutionConfig."""

    Mode: ExecutionMode = Field(
        ExecutionMode.DIRECT,
        description="Direct: one named container per request; Serial: all, in order.",
    )


class AccessControlConfig(Document):
    """Where the identities and their policies live (never inline secrets)."""

    IdentitiesFile: str = Field(
        description="Identities YAML file, relative to the spec file; outside every model directory."
    )
    _identities: Identities | None = PrivateAttr(None)

    @field_validator("IdentitiesFile")
    @classmethod
    def _resolve_identities_file(cls, value: str, info: ValidationInfo) -> str:
        path = document_path(value, folder_of(info))
        if not path.is_file():
            raise ValueError(f"identities file {value!r} does not exist (looked at {path})")
        return str(path.resolve())

    @model_validator(mode="after")
    def _load_identities(self) -> AccessControlConfig:
        # Loaded once, here, so that `serving validate` reports bad identities and policies.
        try:
            self._identities = load_identities(self.IdentitiesFile)
        except IdentitiesError as error:
            name = Path(self.IdentitiesFile).name
            raise ValueError(
                "\n".join(f"IdentitiesFile {name}: {line}" for line in str(error).splitlines())
            ) from None
        return self

    @property
    def identities(self) -> Identities:
        """The identities and their policies, as validated."""
        assert self._identities is not None
        return self._identities


class EndpointSpec(Document):
    """An endpoint: 1 to 15 containers behind one name, Direct or Serial."""

    EndpointName: Annotated[
        str,
        Field(pattern=NAME_PATTERN, max_length=63, description="1-63 letters, digits or hyphens."),
    ]
    InferenceExecutionConfig: ExecutionConfig = ExecutionConfig()
    Containers: list[ContainerSpec] = Field(min_length=1, max_length=MAX_CONTAINERS)
    AccessControl: AccessControlConfig | None = None
    AutoScaling: AutoScalingConfig | None = Field(
        None,
        description="Endpoint-level scaling: every container scales together to one count, like a SageMaker "
        "production variant. Excludes per-container AutoScaling.",
    )

    AsyncInferenceConfig: _AsyncConfig | None = Field(
        None,
        description="Serve InvokeEndpointAsync: inputs and answers in S3 (docs/spec.md). Serial endpoints and "
        "single-container ones only: the operation cannot name a target container or model.",
    )

    DataCaptureConfig: _CaptureConfig | None = Field(
        None,
        description="Write a sampled share of the invocations, request and answer, in SageMaker's capture record "
        "format to a folder or to S3 (docs/spec.md).",
    )

    @model_validator(mode="after")
    def _async_needs_no_target(self) -> EndpointSpec:
        # InvokeEndpointAsync has no TargetContainerHostname nor TargetModel: its chain must be
        # implied.
        if self.AsyncInferenceConfig is None:
            return self
        if self.mode is ExecutionMode.DIRECT and len(self.Containers) > 1:
            raise ValueError(
                f"AsyncInferenceConfig: InvokeEndpointAsync cannot name a target container, so a Direct endpoint "
                f"serving it must have one container (this one has {len(self.Containers)}); use Serial or one container"
            )
        for index, container in enumerate(self.Containers):
            if container.Mode is ContainerMode.MULTI:
                raise ValueError(
                    f"AsyncInferenceConfig: Containers[{index}] is MultiModel, and InvokeEndpointAsync cannot name "
                    "a TargetModel"
                )
        return self

    @model_validator(mode="after")
    def _one_scaling_level(self) -> EndpointSpec:
        if self.AutoScaling is not None:
            scaled = [c.ContainerHostname for c in self.Containers if c.AutoScaling is not None]
            if scaled:
                raise ValueError(
                    f"AutoScaling is given for the endpoint and for containers {', '.join(scaled)}; use one level"
                )
        return self

    def scaling_of(self, container: ContainerSpec) -> AutoScalingConfig | None:
        """The AutoScaling block that governs `container` (its own, or the endpoint's)."""
        return container.AutoScaling or self.AutoScaling

    def replicas_of(self, container: ContainerSpec) -> int:
        """Replicas `container` starts with: the endpoint-level MinCapacity, else its own count."""
        return self.AutoScaling.MinCapacity if self.AutoScaling is not None else container.replicas

    @field_validator("EndpointName")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name == RESERVED_NAME:
            raise ValueError(f"{name!r} is reserved for the endpoint server itself")
        return name

    @model_validator(mode="after")
    def _secrets_outside_model_data(self) -> EndpointSpec:
        # A container's code can read its own model directory: the secrets must not be in it.
        if self.AccessControl is None:
            return self
        secrets = Path(self.AccessControl.IdentitiesFile)
        for index, container in enumerate(self.Containers):
            model_dir = Path(container.ModelDataUrl) if container.ModelDataUrl else None
            if model_dir is not None and model_dir.is_dir() and secrets.is_relative_to(model_dir):
                raise ValueError(
                    f"AccessControl.IdentitiesFile lies inside Containers[{index}].ModelDataUrl ({model_dir}); "
                    "keep the identities file out of every model directory"
                )
        return self

    @model_validator(mode="after")
    def _multi_model_is_direct(self) -> EndpointSpec:
        # As on SageMaker: one TargetModel header could not say which container of a chain it is
        # for.
        if self.mode is ExecutionMode.SERIAL:
            for index, container in enumerate(self.Containers):
                if container.Mode is ContainerMode.MULTI:
                    raise ValueError(
                        f"Containers[{index}].Mode MultiModel: a Serial endpoint serves SingleModel "
                        "containers only; use a Direct endpoint"
                    )
        return self

    @model_validator(mode="after")
    def _unique_hostnames(self) -> EndpointSpec:
        seen: dict[str, int] = {}
        for index, container in enumerate(self.Containers):
            name = container.ContainerHostname
            if name in seen:
                raise ValueError(
                    f"Containers[{index}].ContainerHostname {name!r} duplicates Containers[{seen[name]}]; hostnames must be unique"
                )
            seen[name] = index
        return self

    @property
    def mode(self) -> ExecutionMode:
        return self.InferenceExecutionConfig.Mode

    def container(self, hostname: str) -> ContainerSpec | None:
        """The container with this hostname, or None."""
        return next((c for c in self.Containers if c.ContainerHostname == hostname), None)


def _rewrite(item: Mapping[str, Any]) -> str | None:
    # Say what a name may be rather than quote the pattern; and the limit on containers in words.
    if item["type"] == "string_pattern_mismatch" and item["loc"][-1] in (
        "EndpointName",
        "ContainerHostname",
    ):
        return f"{item['input']!r} must be 1-63 letters, digits or hyphens, starting and ending with a letter or digit"
    if item["type"] == "missing" and item["loc"] == ("AsyncInferenceConfig", "InputConfig"):
        return (
            "required: the gateway reads each InputLocation with its own credentials, so the spec says which "
            "prefix inputs may come from (InputConfig: {S3InputPath: s3://bucket/prefix/})"
        )
    if item["type"] == "too_long" and item["loc"] == ("Containers",):
        return f"an endpoint holds at most {MAX_CONTAINERS} containers"
    return None


def parse_spec(
    document: Any, base_dir: str | Path | None = None, identities_file: str | Path | None = None
) -> EndpointSpec:
    """Validate an already-parsed spec document; relative model paths resolve against base_dir.

    `identities_file` (`serving up --identities`) replaces the spec's AccessControl.IdentitiesFile.
    """
    if not isinstance(document, dict):
        raise SpecError("(spec): the spec must be a mapping with EndpointName and Containers")
    if identities_file is not None:
        document = {
            **document,
            "AccessControl": {"IdentitiesFile": str(Path(identities_file).resolve())},
        }
    try:
        return EndpointSpec.model_validate(
            document, context={BASE_DIR: str(base_dir) if base_dir else None}
        )
    except PydanticValidationError as error:
        raise SpecError(
            "\n".join(describe(error, "the endpoint spec", root="(spec)", rewrite=_rewrite))
        ) from None


def load_spec(path: str | Path, identities_file: str | Path | None = None) -> EndpointSpec:
    """Read a YAML or JSON spec file and validate it (see parse_spec for `identities_file`)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise SpecError(f"cannot read spec {path}: {error.strerror}") from None
    try:
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise SpecError(
            f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {error}"
        ) from None
    return parse_spec(document, base_dir=path.parent.resolve(), identities_file=identities_file)
