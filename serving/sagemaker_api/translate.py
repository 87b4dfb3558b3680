"""SageMaker's resources as this runtime's endpoint specs: one spec per production variant.

A variant of endpoint E named V is served by an endpoint of its own, `E@V@<generation>`
(`protocol.VARIANT_SEPARATOR` cannot appear in a SageMaker name, so no user endpoint can collide
with it). Its containers are the model's; its replicas are the variant's instances: endpoint-level
`AutoScaling`, so every container of the variant scales together, as an instance of a SageMaker
variant holds all of them. An instance's CPUs, memory and GPUs (`images.InstanceType`) are shared
equally by the containers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from serving.config.spec import KNOWN_IMAGES, EndpointSpec, SpecError, parse_spec
from serving.control.runtime_env import ray_runtime_env
from serving.documents import SpecJson
from serving.errors import ApiValidationError
from serving.protocol import (
    DEFAULT_VARIANT,
    SANDBOX_READ_ENV,
    SANDBOX_WRITE_ENV,
    SUBMIT_DIRECTORY_ENV,
    VARIANT_SEPARATOR,
)
from serving.runtimes.sourcedir import SAGEMAKER_MODEL_DIR
from serving.sagemaker_api.images import InstanceType, stack_of
from serving.sagemaker_api.shapes import ContainerDefinition, CreateModelInput

__all__ = ["internal_name", "model_containers", "public_name", "variant_spec"]

PRIMARY_HOSTNAME = "primary"  # a PrimaryContainer's hostname when it names none


def internal_name(endpoint: str, variant: str, generation: int) -> str:
    """The name of the endpoint that serves one variant in one generation of its endpoint (each
    CreateEndpoint / UpdateEndpoint starts a generation, which comes up beside the one serving)."""
    return VARIANT_SEPARATOR.join((endpoint, variant, str(generation)))


def public_name(name: str) -> tuple[str, str]:
    """(endpoint, variant) of a served endpoint's name; a spec's endpoint is its own AllTraffic
    variant."""
    parts = name.split(VARIANT_SEPARATOR)
    return (parts[0], parts[1]) if len(parts) == 3 else (name, DEFAULT_VARIANT)


def model_containers(request: CreateModelInput, roots: Sequence[str]) -> tuple[str, list[SpecJson]]:
    """The model's execution mode and its containers as spec entries (Image mapped to a stack,
    ModelDataUrl checked against the model roots). Raises ApiValidationError naming the field."""
    if request.PrimaryContainer is not None:
        definitions, field = [request.PrimaryContainer], "PrimaryContainer"
    else:
        definitions, field = list(request.Containers or []), "Containers"
    if request.InferenceExecutionConfig is not None:
        mode = request.InferenceExecutionConfig.Mode
    elif len(definitions) == 1 and definitions[0].Mode == "MultiModel":
        # SageMaker's multi-model endpoint: one MultiModel container, which a spec serves Direct
        mode = "Direct"
    else:
        mode = "Serial"
    containers = []
    for index, definition in enumerate(definitions):
        where = field if field == "PrimaryContainer" else f"Containers[{index}]"
        hostname = definition.ContainerHostname
        if hostname is None:
            if mode == "Direct" and len(definitions) > 1:
                raise ApiValidationError(
                    f"{where}.ContainerHostname: required for a Direct model's containers"
                )
            hostname = PRIMARY_HOSTNAME if field == "PrimaryContainer" else f"container-{index + 1}"
        containers.append(_container(definition, hostname, where, roots))
        # SageMaker's is per model; a spec's, per container
        if request.EnableNetworkIsolation is False:
            containers[-1]["EnableNetworkIsolation"] = False
    return mode, containers


# Environment variables that let a container read or write more (docs/security.md, "The sandbox"):
# the operator's to set in a spec, never an API caller's (a writable path was enough to rewrite code
# the server runs).
SANDBOX_VARIABLES = (SANDBOX_READ_ENV, SANDBOX_WRITE_ENV)


def _check_environment(environment: Mapping[str, str], where: str, roots: Sequence[str]) -> None:
    for variable in SANDBOX_VARIABLES:
        if variable in environment:
            raise ApiValidationError(
                f"{where}.Environment.{variable}: a container's sandbox is widened only by the operator, in an "
                "endpoint spec (serving up / serving apply), never through the API"
            )
    # A shared script folder or sourcedir.tar.gz (SageMaker's own variable) is read only, and held
    # to the model roots as ModelDataUrl: a local one to the local roots, an s3:// one (fetched by
    # the supervisor, with the server's credentials unless the container brings its own) to the
    # s3:// roots.
    path = environment.get(SUBMIT_DIRECTORY_ENV, "").removeprefix("file://")
    field = f"{where}.Environment.{SUBMIT_DIRECTORY_ENV}"
    if path.startswith("s3://"):
        _s3_inside_roots(path, field, environment, roots)
    elif os.path.isabs(path) and not path.startswith(SAGEMAKER_MODEL_DIR):
        _inside_roots(path, field, roots)


def _container(
    definition: ContainerDefinition, hostname: str, where: str, roots: Sequence[str]
) -> SpecJson:
    _check_environment(definition.Environment, where, roots)
    entry: SpecJson = {
        "ContainerHostname": hostname,
        "Image": stack_of(definition.Image, list(KNOWN_IMAGES), f"{where}.Image"),
        "Mode": definition.Mode,
        "Environment": dict(definition.Environment),
    }
    if definition.ModelDataUrl is not None:
        entry["ModelDataUrl"] = _model_data(definition, f"{where}.ModelDataUrl", roots)
    if definition.MultiModelConfig is not None:
        entry["MultiModelConfig"] = definition.MultiModelConfig.model_dump()
    return entry


def _model_data(definition: ContainerDefinition, field: str, roots: Sequence[str]) -> str:
    """A local path (or file:// URL) resolved, and only inside one of `roots`; an s3:// URL under an
    s3:// root unless the container brings its own AWS credentials.

    An API caller chooses what a container may read: a path outside the roots the server was given
    (its working directory by default) is refused, so that `/home/me/.ssh` cannot be served as
    "model data". A model's S3 objects (a SingleModel's archive, a MultiModel's prefix) are fetched
    with the server's credentials when the container's Environment has none: only from the s3://
    roots the operator named, or any caller could read the server's buckets.
    """
    url = definition.ModelDataUrl or ""
    if not url.startswith("s3://"):
        return _inside_roots(
            url.removeprefix("file://"), field, [r for r in roots if not r.startswith("s3://")]
        )
    return _s3_inside_roots(url, field, definition.Environment, roots)


def _s3_inside_roots(
    url: str, field: str, environment: Mapping[str, str], roots: Sequence[str]
) -> str:
    """`url`, if the container reads it with its own AWS credentials or it lies under an s3://
    root; else a ValidationException."""
    if "AWS_ACCESS_KEY_ID" in environment:
        # read with the container's own credentials (by its supervisor: models.s3_broker)
        return url
    s3_roots = [
        root if root.endswith("/") else root + "/" for root in roots if root.startswith("s3://")
    ]
    if not any(url.startswith(root) for root in s3_roots):
        raise ApiValidationError(
            f"{field}: {url!r} would be read with this server's AWS credentials, and lies under none of its s3:// "
            f"model roots ({', '.join(s3_roots) or 'none'}); add one with --model-root s3://bucket/prefix/, or give "
            "the container its own AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in Environment"
        )
    return url


def _inside_roots(value: str, field: str, roots: Sequence[str]) -> str:
    """`value` resolved (links and `..` followed), if it lies in one of `roots`; else a
    ValidationException."""
    path = Path(value).expanduser()
    if not path.is_absolute():
        if not roots:
            raise ApiValidationError(f"{field}: a relative path needs a model root (--model-root)")
        path = Path(roots[0]) / path
    resolved = path.resolve()
    if not any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
        raise ApiValidationError(
            f"{field}: {value!r} is outside the model roots this server serves from ({', '.join(roots) or 'none'}); "
            "start it with --model-root to add one"
        )
    return str(resolved)


def scaling_block(
    count: int, target: Mapping[str, Any] | None, policies: Sequence[Mapping[str, Any]]
) -> SpecJson:
    """The variant's endpoint-level AutoScaling: a fixed count, or its scalable target's bounds and
    policies."""
    if target is None:
        return {"MinCapacity": count, "MaxCapacity": count}
    low, high = int(target["MinCapacity"]), int(target["MaxCapacity"])
    if not policies:
        fixed = min(max(count, low), high)
        return {"MinCapacity": fixed, "MaxCapacity": fixed}
    return {
        "MinCapacity": low,
        "MaxCapacity": high,
        "TargetTrackingScalingPolicyConfiguration": [dict(policy["spec"]) for policy in policies],
    }


def variant_spec(
    endpoint: str,
    variant: Mapping[str, Any],
    instance: InstanceType,
    scaling: SpecJson,
    identities_file: str | None,
    allow_model_requirements: bool = False,
) -> EndpointSpec:
    """The spec of the endpoint serving `variant` (its model snapshot, count and scaling),
    validated; a model whose code/requirements.txt would install packages is refused here unless
    allowed (as at deploy time)."""
    model = variant["Model"]
    containers = model["containers"]
    share = len(containers)
    resources: SpecJson = {
        "Cpus": round(instance.Cpus / share, 4),
        "Gpus": round(instance.Gpus / share, 4),
    }
    if instance.MemoryMb:
        resources["MemoryMb"] = max(1, instance.MemoryMb // share)
    document: SpecJson = {
        # validated with the public name; the served name has the separator
        "EndpointName": endpoint,
        "InferenceExecutionConfig": {"Mode": model["mode"]},
        "Containers": [{**container, "Resources": resources} for container in containers],
        "AutoScaling": scaling,
    }
    if identities_file is not None:
        document["AccessControl"] = {"IdentitiesFile": identities_file}
    if variant.get("DataCapture"):
        document["DataCaptureConfig"] = {
            k: v for k, v in variant["DataCapture"].items() if v is not None
        }
    try:
        spec = parse_spec(document)
        for container in spec.Containers:
            ray_runtime_env(container, allow_model_requirements)
    except SpecError as error:
        lines = str(error).splitlines()
        raise ApiValidationError(f"model {variant['ModelName']}: " + "; ".join(lines)) from None
    return spec


def check_model(
    request: CreateModelInput, roots: Sequence[str], allow_model_requirements: bool = False
) -> SpecJson:
    """The model as it is stored (mode, containers as spec entries), validated as a one-instance
    variant."""
    mode, containers = model_containers(request, roots)
    model = {"mode": mode, "containers": containers}
    probe = {"VariantName": DEFAULT_VARIANT, "ModelName": request.ModelName, "Model": model}
    one = {"MinCapacity": 1, "MaxCapacity": 1}
    variant_spec(
        request.ModelName, probe, InstanceType(Cpus=1), one, None, allow_model_requirements
    )
    return model
