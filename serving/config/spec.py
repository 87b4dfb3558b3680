"""The endpoint spec: SageMaker CreateModel-shaped fields, validated by pydantic.

One source of truth for configuration. Every rejection names the field at fault
(`Containers[1].ContainerHostname: ...`) so users can fix their YAML quickly.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

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
from serving.autoscaling.policy import SPEC_METRIC_TYPES
from serving.config.documents import BASE_DIR, Document, describe, document_path, folder_of
from serving.protocol import NAME_PATTERN

MAX_CONTAINERS = 15
RESERVED_NAME = "serving-gateway"  # the Ray Serve application of the endpoint server

from serving.runtimes import STACKS as KNOWN_IMAGES  # noqa: E402  (one module per stack)

MAX_CONCURRENCY_ENV = "SERVING_MAX_CONCURRENCY"  # per-replica in-flight bound, set in a container's Environment
IDEMPOTENT_ENV = "SERVING_IDEMPOTENT"  # "false": never send a request twice, even if no replica answered it
DEFAULT_MAX_CONCURRENCY = 128
# MultiModel cache bounds per replica, set in a container's Environment (whole numbers).
MAX_MODELS_ENV = "SERVING_MAX_MODELS"  # models kept loaded (default 16)
MODEL_MEMORY_ENV = "SERVING_MODEL_CACHE_MB"  # their measured memory (default: 80% of Resources.MemoryMb, if set)
MODEL_DISK_ENV = "SERVING_MODEL_DISK_MB"  # downloaded and unpacked models on local disk (default 10240)
DEFAULT_MAX_MODELS = 16
DEFAULT_MODEL_DISK_MB = 10240


class SpecError(ValueError):
    """A spec that cannot be served; the message names every field at fault."""


class ExecutionMode(str, Enum):
    """How requests flow through the containers of an endpoint."""

    DIRECT = "Direct"
    SERIAL = "Serial"


class ExecutionConfig(Document):
    """SageMaker's InferenceExecutionConfig."""

    Mode: ExecutionMode = Field(ExecutionMode.DIRECT, description="Direct: one named container per request; Serial: all, in order.")


class ResourceConfig(Document):
    """Ray resources reserved for each replica of a container."""

    Cpus: float = Field(0.1, gt=0, le=512, description="Logical CPUs per replica (Ray num_cpus); fractional shares allowed.")
    MemoryMb: int | None = Field(None, gt=0, description="Memory reserved per replica in MiB (Ray memory resource).")
    Gpus: float = Field(0, ge=0, le=64, description="GPUs per replica (Ray num_gpus).")
    Custom: dict[Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.:-]{0,63}$")], Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict,
        description="Ray custom resources per replica (e.g. {gpu-node: 1} to place it on nodes started with "
                    "--resources '{\"gpu-node\": 4}'); Ray's own names (CPU, GPU, memory, node:...) are refused.")

    @field_validator("Custom")
    @classmethod
    def _custom_is_custom(cls, custom: dict[str, float]) -> dict[str, float]:
        reserved = [name for name in custom if name in ("CPU", "GPU", "memory", "object_store_memory")
                    or name.startswith("node:") or name.startswith("accelerator_type:")]
        if reserved:
            raise ValueError(f"{', '.join(reserved)}: use Cpus, Gpus or MemoryMb; node:... is Ray's own")
        return custom


class PredefinedMetric(Document):
    """Which built-in metric a target-tracking policy follows."""

    PredefinedMetricType: Literal[
        "SageMakerVariantInvocationsPerInstance",
        "SageMakerVariantConcurrentRequestsPerModel",
        "SageMakerVariantCPUUtilization",
        "SageMakerVariantMemoryUtilization",
    ] = "SageMakerVariantInvocationsPerInstance"


class CustomizedMetric(Document):
    """A metric the container reports itself (its `code/inference.py` defines `autoscaling_metrics`)."""

    MetricName: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,127}$",
                                     description="Key of the dict `autoscaling_metrics(model)` returns.")]
    Statistic: Literal["Average"] = Field("Average", description="Averaged per replica, as the predefined metrics.")


class TargetTrackingPolicy(Document):
    """Application Auto Scaling's target-tracking policy fields."""

    TargetValue: float = Field(gt=0, description="Metric value the policy keeps each replica at.")
    PredefinedMetricSpecification: PredefinedMetric | None = Field(
        None, description="A built-in metric (default: SageMakerVariantInvocationsPerInstance).")
    CustomizedMetricSpecification: CustomizedMetric | None = Field(
        None, description="Instead of a predefined metric: one the container reports.")
    ScaleOutCooldown: float = Field(300, ge=0, description="Seconds after a scale-out before another scale-out "
                                                           "(unless a larger one is needed).")
    ScaleInCooldown: float = Field(300, ge=0, description="Seconds after a scale-in before another scale-in; a "
                                                          "scale-out is never blocked by it.")
    DisableScaleIn: bool = False

    @model_validator(mode="after")
    def _one_metric(self) -> TargetTrackingPolicy:
        if self.PredefinedMetricSpecification is not None and self.CustomizedMetricSpecification is not None:
            raise ValueError("give PredefinedMetricSpecification or CustomizedMetricSpecification, not both")
        return self

    @property
    def metric(self) -> str:
        """The metric's name as replicas report it (scaling_policy's names)."""
        if self.CustomizedMetricSpecification is not None:
            return self.CustomizedMetricSpecification.MetricName
        predefined = self.PredefinedMetricSpecification or PredefinedMetric()
        return SPEC_METRIC_TYPES[predefined.PredefinedMetricType]

    def as_policy(self) -> dict[str, Any]:
        """scaling_policy.TargetTracking's fields (JSON, for Serve's policy_kwargs)."""
        return {"metric": self.metric, "target": self.TargetValue, "scale_out_cooldown_s": self.ScaleOutCooldown,
                "scale_in_cooldown_s": self.ScaleInCooldown, "disable_scale_in": self.DisableScaleIn}


class AutoScalingConfig(Document):
    """Replica bounds and target-tracking policies (of a container, or of the whole endpoint)."""

    MinCapacity: int = Field(1, ge=1, le=100)
    MaxCapacity: int = Field(1, ge=1, le=100)
    TargetTrackingScalingPolicyConfiguration: TargetTrackingPolicy | list[TargetTrackingPolicy] | None = Field(
        None, description="One policy, or several (the largest desired count wins; scale-in only when all agree). "
                          "Without one, the count is fixed at MinCapacity (which must then equal MaxCapacity).")

    @model_validator(mode="after")
    def _bounds(self) -> AutoScalingConfig:
        if self.MinCapacity > self.MaxCapacity:
            raise ValueError(f"MinCapacity ({self.MinCapacity}) must not exceed MaxCapacity ({self.MaxCapacity})")
        if self.MinCapacity != self.MaxCapacity and not self.policies:
            raise ValueError("MinCapacity < MaxCapacity needs a TargetTrackingScalingPolicyConfiguration "
                             "(for a fixed replica count set MinCapacity = MaxCapacity)")
        metrics = [policy.metric for policy in self.policies]
        if len(set(metrics)) != len(metrics):
            raise ValueError(f"one target-tracking policy per metric; got {metrics}")
        return self

    @property
    def policies(self) -> list[TargetTrackingPolicy]:
        configured = self.TargetTrackingScalingPolicyConfiguration
        if configured is None:
            return []
        return configured if isinstance(configured, list) else [configured]


class ContainerMode(str, Enum):
    """SingleModel: one model always loaded. MultiModel: many models loaded on demand."""

    SINGLE = "SingleModel"
    MULTI = "MultiModel"


def _local_path(value: str, info: ValidationInfo) -> Path:
    """A local path or `file://` URL from the spec, by the documents' path rule (relative to the spec's folder)."""
    return document_path(value.removeprefix("file://"), folder_of(info))


class RuntimeEnvironmentConfig(Document):
    """The container's own Python environment on Ray (its replicas' Ray `runtime_env`); environment
    variables come from the container's `Environment`."""

    Pip: list[Annotated[str, Field(min_length=1, max_length=512)]] = Field(
        default_factory=list, max_length=100,
        description="Requirement specifiers (`name==1.2`) Ray installs into a virtualenv for this container's "
                    "replicas, on top of the node's packages (Ray runtime_env `pip`). Needs the package index on every node.")
    WorkingDir: str | None = Field(
        None, description="A directory or .zip, relative to the spec file: the replicas' working directory, importable "
                          "from code/inference.py (Ray runtime_env `working_dir`). Cluster mode: the same path on every node.")

    @field_validator("Pip")
    @classmethod
    def _requirements_only(cls, packages: list[str]) -> list[str]:
        for package in packages:
            if package.lstrip().startswith("-"):
                raise ValueError(f"{package!r}: list requirement specifiers only, not pip options")
        return packages

    @field_validator("WorkingDir")
    @classmethod
    def _resolve_working_dir(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        path = _local_path(value, info)
        if not (path.is_dir() or (path.is_file() and path.suffix == ".zip")):
            raise ValueError(f"working dir {value!r} must be an existing directory or .zip file (looked at {path})")
        return str(path.resolve())


class CacheSetting(str, Enum):
    ENABLED = "Enabled"
    DISABLED = "Disabled"


class MultiModelSettings(Document):
    """SageMaker's MultiModelConfig: Disabled loads the model for each request and unloads it after."""

    ModelCacheSetting: CacheSetting = CacheSetting.ENABLED


class ContainerSpec(Document):
    """One serving stack plus its model, with its own hostname and resources."""

    ContainerHostname: Annotated[str, Field(pattern=NAME_PATTERN, max_length=63, description="1-63 letters, digits or hyphens; unique in the endpoint.")]
    Image: str = Field(description=f"Serving stack: one of {', '.join(KNOWN_IMAGES)}.")
    ModelDataUrl: str | None = Field(None, description="Model artifact: a directory, file:// URL or .tar.gz, relative to the spec file. "
                                                         "MultiModel: the prefix holding every model (a directory, file:// or s3://).")
    Mode: ContainerMode = ContainerMode.SINGLE
    MultiModelConfig: MultiModelSettings | None = Field(None, description="MultiModel only: ModelCacheSetting Enabled (default) or Disabled.")
    Environment: dict[Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]{0,1023}$")], str] = Field(default_factory=dict)
    Resources: ResourceConfig = Field(default_factory=ResourceConfig)
    AutoScaling: AutoScalingConfig | None = None
    RuntimeEnvironment: RuntimeEnvironmentConfig | None = Field(
        None, description="Extra pip packages and a working directory for this container's replicas.")

    @field_validator("Image")
    @classmethod
    def _known_image(cls, image: str) -> str:
        if image not in KNOWN_IMAGES:
            hint = " (OCI image references are not run by this version: see containers/README.md)" if "/" in image or ":" in image else ""
            raise ValueError(f"unknown Image {image!r}; this version serves: {', '.join(KNOWN_IMAGES)}{hint}")
        return image

    @field_validator("ModelDataUrl")
    @classmethod
    def _resolve_model_data(cls, url: str | None, info: ValidationInfo) -> str | None:
        if url is None or url.startswith("s3://"):
            return url  # s3:// is checked against Mode below
        path = _local_path(url, info)
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
                raise ValueError("ModelDataUrl is required for a MultiModel container: the prefix holding its models")
            if url.startswith("s3://"):
                bucket = url[len("s3://"):].split("/", 1)[0]
                if not bucket:
                    raise ValueError(f"ModelDataUrl {url!r} names no bucket (s3://bucket/prefix/)")
            elif not Path(url).is_dir():
                raise ValueError(f"ModelDataUrl {url!r} of a MultiModel container must be a directory or s3:// prefix")
        else:
            if url is not None and url.startswith("s3://"):
                raise ValueError("s3:// model data is served for MultiModel containers only; a SingleModel container "
                                 "takes a directory, file:// URL or .tar.gz")
            if self.MultiModelConfig is not None:
                raise ValueError("MultiModelConfig applies to MultiModel containers only (set Mode: MultiModel)")
        return self

    @property
    def max_concurrency(self) -> int:
        """In-flight requests the router lets reach one replica before answering 429."""
        return int(self.Environment.get(MAX_CONCURRENCY_ENV, DEFAULT_MAX_CONCURRENCY))

    @property
    def idempotent(self) -> bool:
        """Whether a request whose connection broke before any answer may be sent again to another replica."""
        return self.Environment.get(IDEMPOTENT_ENV, "true").strip().lower() not in ("false", "0", "no", "off")

    @field_validator("Environment")
    @classmethod
    def _counts_are_counts(cls, environment: dict[str, str]) -> dict[str, str]:
        for name in (MAX_CONCURRENCY_ENV, MAX_MODELS_ENV, MODEL_MEMORY_ENV, MODEL_DISK_ENV):
            value = environment.get(name)
            if value is not None and not (value.isdigit() and int(value) >= 1):
                raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
        flag = environment.get(IDEMPOTENT_ENV)
        if flag is not None and flag.strip().lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ValueError(f"{IDEMPOTENT_ENV} must be true or false, got {flag!r}")
        return environment

    @property
    def multi_model(self) -> dict[str, Any] | None:
        """A MultiModel container's cache settings for its replicas, or None for SingleModel."""
        if self.Mode is not ContainerMode.MULTI:
            return None
        memory_mb = self.Environment.get(MODEL_MEMORY_ENV)
        if memory_mb is None and self.Resources.MemoryMb:
            memory_mb = int(self.Resources.MemoryMb * 0.8)  # room for the runtime itself
        settings = self.MultiModelConfig or MultiModelSettings()
        return {
            "cache_enabled": settings.ModelCacheSetting is CacheSetting.ENABLED,
            "max_models": int(self.Environment.get(MAX_MODELS_ENV, DEFAULT_MAX_MODELS)),
            "max_bytes": int(memory_mb) * 2**20 if memory_mb else None,
            "max_disk_bytes": int(self.Environment.get(MODEL_DISK_ENV, DEFAULT_MODEL_DISK_MB)) * 2**20,
        }

    @property
    def replicas(self) -> int:
        """Replicas started with the container (autoscaling starts at its minimum)."""
        return self.AutoScaling.MinCapacity if self.AutoScaling else 1


class AccessControlConfig(Document):
    """Where the identities and their policies live (never inline secrets)."""

    IdentitiesFile: str = Field(description="Identities YAML file, relative to the spec file; outside every model directory.")
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
            raise ValueError("\n".join(f"IdentitiesFile {name}: {line}" for line in str(error).splitlines())) from None
        return self

    @property
    def identities(self) -> Identities:
        """The identities and their policies, as validated."""
        assert self._identities is not None
        return self._identities


class EndpointSpec(Document):
    """An endpoint: 1 to 15 containers behind one name, Direct or Serial."""

    EndpointName: Annotated[str, Field(pattern=NAME_PATTERN, max_length=63, description="1-63 letters, digits or hyphens.")]
    InferenceExecutionConfig: ExecutionConfig = ExecutionConfig()
    Containers: list[ContainerSpec] = Field(min_length=1, max_length=MAX_CONTAINERS)
    AccessControl: AccessControlConfig | None = None
    AutoScaling: AutoScalingConfig | None = Field(
        None, description="Endpoint-level scaling: every container scales together to one count, like a SageMaker "
                          "production variant. Excludes per-container AutoScaling.")

    @model_validator(mode="after")
    def _one_scaling_level(self) -> EndpointSpec:
        if self.AutoScaling is not None:
            scaled = [c.ContainerHostname for c in self.Containers if c.AutoScaling is not None]
            if scaled:
                raise ValueError(f"AutoScaling is given for the endpoint and for containers {', '.join(scaled)}; "
                                 "use one level")
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
        # As on SageMaker: one TargetModel header could not say which container of a chain it is for.
        if self.mode is ExecutionMode.SERIAL:
            for index, container in enumerate(self.Containers):
                if container.Mode is ContainerMode.MULTI:
                    raise ValueError(f"Containers[{index}].Mode MultiModel: a Serial endpoint serves SingleModel "
                                     "containers only; use a Direct endpoint")
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
    if item["type"] == "string_pattern_mismatch" and item["loc"][-1] in ("EndpointName", "ContainerHostname"):
        return f"{item['input']!r} must be 1-63 letters, digits or hyphens, starting and ending with a letter or digit"
    if item["type"] == "too_long" and item["loc"] == ("Containers",):
        return f"an endpoint holds at most {MAX_CONTAINERS} containers"
    return None


def parse_spec(document: Any, base_dir: str | Path | None = None, identities_file: str | Path | None = None) -> EndpointSpec:
    """Validate an already-parsed spec document; relative model paths resolve against base_dir.

    `identities_file` (`serving up --identities`) replaces the spec's AccessControl.IdentitiesFile.
    """
    if not isinstance(document, dict):
        raise SpecError("(spec): the spec must be a mapping with EndpointName and Containers")
    if identities_file is not None:
        document = {**document, "AccessControl": {"IdentitiesFile": str(Path(identities_file).resolve())}}
    try:
        return EndpointSpec.model_validate(document, context={BASE_DIR: str(base_dir) if base_dir else None})
    except PydanticValidationError as error:
        raise SpecError("\n".join(describe(error, "the endpoint spec", root="(spec)", rewrite=_rewrite))) from None


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
        raise SpecError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {error}") from None
    return parse_spec(document, base_dir=path.parent.resolve(), identities_file=identities_file)
