"""The endpoint spec: SageMaker CreateModel-shaped fields, validated by pydantic.

One source of truth for configuration. Every rejection names the field at fault
(`Containers[1].ContainerHostname: ...`) so users can fix their YAML quickly.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError

from serving.protocol import NAME_PATTERN
MAX_CONTAINERS = 15
RESERVED_NAME = "serving-gateway"  # the Ray Serve application of the endpoint server

from serving.runtimes import STACKS as KNOWN_IMAGES  # noqa: E402  (one module per stack)

MAX_CONCURRENCY_ENV = "SERVING_MAX_CONCURRENCY"  # per-replica in-flight bound, set in a container's Environment
DEFAULT_MAX_CONCURRENCY = 128


class SpecError(ValueError):
    """A spec that cannot be served; the message names every field at fault."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExecutionMode(str, Enum):
    """How requests flow through the containers of an endpoint."""

    DIRECT = "Direct"
    SERIAL = "Serial"


class ExecutionConfig(_Model):
    """SageMaker's InferenceExecutionConfig."""

    Mode: ExecutionMode = Field(ExecutionMode.DIRECT, description="Direct: one named container per request; Serial: all, in order.")


class ResourceConfig(_Model):
    """Ray resources reserved for each replica of a container."""

    Cpus: float = Field(0.1, gt=0, le=512, description="Logical CPUs per replica (Ray num_cpus); fractional shares allowed.")
    MemoryMb: int | None = Field(None, gt=0, description="Memory reserved per replica in MiB (Ray memory resource).")
    Gpus: float = Field(0, ge=0, le=64, description="GPUs per replica (Ray num_gpus).")


class PredefinedMetric(_Model):
    """Which built-in metric a target-tracking policy follows."""

    PredefinedMetricType: Literal[
        "SageMakerVariantInvocationsPerInstance",
        "SageMakerVariantConcurrentRequestsPerModel",
        "SageMakerVariantCPUUtilization",
        "SageMakerVariantMemoryUtilization",
    ] = "SageMakerVariantInvocationsPerInstance"


class TargetTrackingPolicy(_Model):
    """Application Auto Scaling's target-tracking policy fields."""

    TargetValue: float = Field(gt=0, description="Metric value the policy keeps each replica at.")
    PredefinedMetricSpecification: PredefinedMetric = PredefinedMetric()
    ScaleOutCooldown: float = Field(300, ge=0, description="Seconds after a scale-out before another one.")
    ScaleInCooldown: float = Field(300, ge=0, description="Seconds after a scaling action before a scale-in.")
    DisableScaleIn: bool = False


class AutoScalingConfig(_Model):
    """Per-container replica bounds and target-tracking policy."""

    MinCapacity: int = Field(1, ge=1, le=100)
    MaxCapacity: int = Field(1, ge=1, le=100)
    TargetTrackingScalingPolicyConfiguration: TargetTrackingPolicy | None = None

    @model_validator(mode="after")
    def _bounds(self) -> AutoScalingConfig:
        if self.MinCapacity > self.MaxCapacity:
            raise ValueError(f"MinCapacity ({self.MinCapacity}) must not exceed MaxCapacity ({self.MaxCapacity})")
        return self


class ContainerMode(str, Enum):
    """SingleModel: one model always loaded. MultiModel: many models loaded on demand."""

    SINGLE = "SingleModel"
    MULTI = "MultiModel"


class ContainerSpec(_Model):
    """One serving stack plus its model, with its own hostname and resources."""

    ContainerHostname: Annotated[str, Field(pattern=NAME_PATTERN, max_length=63, description="1-63 letters, digits or hyphens; unique in the endpoint.")]
    Image: str = Field(description=f"Serving stack: one of {', '.join(KNOWN_IMAGES)}.")
    ModelDataUrl: str | None = Field(None, description="Model artifact: a directory, file:// URL or .tar.gz, relative to the spec file.")
    Mode: ContainerMode = ContainerMode.SINGLE
    Environment: dict[Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]{0,1023}$")], str] = Field(default_factory=dict)
    Resources: ResourceConfig = Field(default_factory=ResourceConfig)
    AutoScaling: AutoScalingConfig | None = None

    @field_validator("Image")
    @classmethod
    def _known_image(cls, image: str) -> str:
        if image not in KNOWN_IMAGES:
            raise ValueError(f"unknown Image {image!r}; this version serves: {', '.join(KNOWN_IMAGES)}")
        return image

    @field_validator("AutoScaling")
    @classmethod
    def _no_autoscaling_yet(cls, value: AutoScalingConfig | None) -> AutoScalingConfig | None:
        if value is not None:
            raise ValueError("autoscaling is not available in this version; remove AutoScaling (one replica is started)")
        return value

    @field_validator("Mode")
    @classmethod
    def _single_only(cls, mode: ContainerMode) -> ContainerMode:
        if mode is ContainerMode.MULTI:
            raise ValueError("MultiModel containers are not available in this version; use SingleModel")
        return mode

    @field_validator("ModelDataUrl")
    @classmethod
    def _resolve_model_data(cls, url: str | None, info: ValidationInfo) -> str | None:
        if url is None:
            return None
        if url.startswith("s3://"):
            raise ValueError("s3:// model stores are not available in this version; use a directory, file:// or .tar.gz")
        path = Path(url.removeprefix("file://")).expanduser()
        base = (info.context or {}).get("base_dir")
        if not path.is_absolute() and base is not None:
            path = Path(base) / path
        if not path.exists():
            raise ValueError(f"model data {url!r} does not exist (looked at {path})")
        if path.is_file() and not path.name.endswith((".tar.gz", ".tgz")):
            raise ValueError(f"model data {url!r} must be a directory or a .tar.gz archive")
        return str(path.resolve())

    @property
    def max_concurrency(self) -> int:
        """In-flight requests the router lets reach one replica before answering 429."""
        return int(self.Environment.get(MAX_CONCURRENCY_ENV, DEFAULT_MAX_CONCURRENCY))

    @field_validator("Environment")
    @classmethod
    def _concurrency_is_a_count(cls, environment: dict[str, str]) -> dict[str, str]:
        value = environment.get(MAX_CONCURRENCY_ENV)
        if value is not None and not (value.isdigit() and int(value) >= 1):
            raise ValueError(f"{MAX_CONCURRENCY_ENV} must be a whole number of at least 1, got {value!r}")
        return environment

    @property
    def replicas(self) -> int:
        """Replicas started with the container (autoscaling starts at its minimum)."""
        return self.AutoScaling.MinCapacity if self.AutoScaling else 1


class AccessControlConfig(_Model):
    """Where the identities and their policies live (never inline secrets)."""

    IdentitiesFile: str


class EndpointSpec(_Model):
    """An endpoint: 1 to 15 containers behind one name, Direct or Serial."""

    EndpointName: Annotated[str, Field(pattern=NAME_PATTERN, max_length=63, description="1-63 letters, digits or hyphens.")]
    InferenceExecutionConfig: ExecutionConfig = ExecutionConfig()
    Containers: list[ContainerSpec] = Field(min_length=1, max_length=MAX_CONTAINERS)
    AccessControl: AccessControlConfig | None = None

    @field_validator("EndpointName")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name == RESERVED_NAME:
            raise ValueError(f"{name!r} is reserved for the endpoint server itself")
        return name

    @field_validator("AccessControl")
    @classmethod
    def _no_access_control_yet(cls, value: AccessControlConfig | None) -> AccessControlConfig | None:
        if value is not None:
            raise ValueError("access policies are not available in this version; remove AccessControl")
        return value

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


def _field_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(("function-", "constrained-")):
            continue
        else:
            path += f".{part}" if path else str(part)
    return path or "(spec)"


def _describe(error: PydanticValidationError) -> str:
    lines = []
    for item in error.errors():
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field (not part of the endpoint spec)"
        elif item["type"] == "string_pattern_mismatch" and item["loc"][-1] in ("EndpointName", "ContainerHostname"):
            message = f"{item['input']!r} must be 1-63 letters, digits or hyphens, starting and ending with a letter or digit"
        elif item["type"] == "too_long" and item["loc"] == ("Containers",):
            message = f"an endpoint holds at most {MAX_CONTAINERS} containers"
        lines.append(f"{_field_path(item['loc'])}: {message}")
    return "\n".join(lines)


def parse_spec(document: Any, base_dir: str | Path | None = None) -> EndpointSpec:
    """Validate an already-parsed spec document; relative model paths resolve against base_dir."""
    if not isinstance(document, dict):
        raise SpecError("(spec): the spec must be a mapping with EndpointName and Containers")
    try:
        return EndpointSpec.model_validate(document, context={"base_dir": str(base_dir) if base_dir else None})
    except PydanticValidationError as error:
        raise SpecError(_describe(error)) from None


def load_spec(path: str | Path) -> EndpointSpec:
    """Read a YAML or JSON spec file and validate it."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise SpecError(f"cannot read spec {path}: {error.strerror}") from None
    try:
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise SpecError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {error}") from None
    return parse_spec(document, base_dir=path.parent.resolve())
