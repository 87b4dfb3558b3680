"""A spec as the registry's record: routing fields and, per container, the plan its replicas are
built from."""

from __future__ import annotations

from serving.autoscaling.config import serve_autoscaling_config
from serving.config.spec import ContainerSpec, EndpointSpec
from serving.control.container_versions import (
    plan_version,
)
from serving.control.records import ContainerPlan, Passthrough, RegistryRecord
from serving.control.runtime_env import ray_runtime_env, replica_environment
from serving.errors import ValidationError
from serving.protocol import RAY_NAMESPACE, REGISTRY_ACTOR
from serving.settings import ServerSettings


def container_plan(
    spec: EndpointSpec, container: ContainerSpec, settings: ServerSettings
) -> ContainerPlan:
    """Everything one container's replicas are built from (its version is a digest of this)."""
    resources = container.Resources
    actor_options: Passthrough = {"num_cpus": resources.Cpus, "num_gpus": resources.Gpus}
    # RuntimeEnvironment (and allowed model requirements) only: Environment goes to the container
    # process
    runtime_env = ray_runtime_env(container, settings.allow_model_requirements)
    # none at all, else Ray starts the worker through an extra Python (control/runtime_env.py)
    if runtime_env:
        actor_options["runtime_env"] = runtime_env
    if resources.MemoryMb:
        actor_options["memory"] = resources.MemoryMb * 1024 * 1024
    if resources.Custom:
        actor_options["resources"] = dict(resources.Custom)
    scaling = spec.scaling_of(container)
    # target tracking: our policy in Serve's controller
    if scaling is not None and scaling.policies:
        endpoint_level = spec.AutoScaling is not None
        count: Passthrough = {
            "autoscaling_config": serve_autoscaling_config(
                spec.EndpointName,
                None if endpoint_level else container.ContainerHostname,
                scaling,
                [policy.as_policy() for policy in scaling.policies],
                (REGISTRY_ACTOR, RAY_NAMESPACE),
                containers=[c.ContainerHostname for c in spec.Containers]
                if endpoint_level
                else None,
            )
        }
    else:
        count = {"num_replicas": spec.replicas_of(container)}
    plan: ContainerPlan = {
        "image": container.Image,
        "model_data": container.ModelDataUrl,
        "environment": replica_environment(container),
        "bind_host": settings.container_host,
        "multi_model": container.multi_model,
        "sandbox": settings.sandbox,
        "egress_ports": egress_ports(container, settings),
        "shared_network": settings.shared_container_network,
        "fork_template": settings.fork_templates,
        "working_dir": container.RuntimeEnvironment.WorkingDir
        if container.RuntimeEnvironment
        else None,
        "gpus": resources.Gpus,
        "actor_options": actor_options,
        "count": count,
    }
    # No GPU, this Python: its node's container host can supervise it (a GPU share and a runtime_env
    # are a Ray worker's).
    if settings.node_hosts and not runtime_env and not resources.Gpus:
        plan["hosting"] = "node"
    return plan


def egress_ports(container: ContainerSpec, settings: ServerSettings) -> list[int]:
    """The TCP ports a container may connect to from the node's network: none (its own network
    namespace) unless it opted in and the operator allows it. Raises ValidationError, naming the
    container, if it asks for what the operator does not allow."""
    if container.EnableNetworkIsolation:
        return []
    if not settings.container_egress_ports:
        raise ValidationError(
            f"container {container.ContainerHostname}: EnableNetworkIsolation false asks for outbound network, "
            "which this server allows no container (its operator sets --container-egress-ports)"
        )
    return list(settings.container_egress_ports)


def endpoint_record(spec: EndpointSpec, settings: ServerSettings) -> RegistryRecord:
    """The registry's record of a spec: what the router and descriptions need, and each container's
    plan."""
    plans = {c.ContainerHostname: container_plan(spec, c, settings) for c in spec.Containers}
    # An endpoint-level policy decides for all its containers in one process: Serve's controller
    # unless every one of them is hosted (then the registry).
    if spec.AutoScaling is not None and not all("hosting" in plan for plan in plans.values()):
        for plan in plans.values():
            plan.pop("hosting", None)
    return {
        "name": spec.EndpointName,
        "mode": spec.mode.value,
        "containers": [
            {
                "ContainerHostname": c.ContainerHostname,
                "Image": c.Image,
                "Mode": c.Mode.value,
                "DesiredReplicas": spec.replicas_of(c),
                "Version": plan_version(plans[c.ContainerHostname]),
            }
            for c in spec.Containers
        ],
        "limits": {c.ContainerHostname: c.max_concurrency for c in spec.Containers},
        "not_idempotent": [c.ContainerHostname for c in spec.Containers if not c.idempotent],
        # Where the gateway reads the identities itself: the secrets never travel through Ray.
        "access": spec.AccessControl.identities.reference() if spec.AccessControl else None,
        # What the gateway needs to serve InvokeEndpointAsync (no secrets: credentials are the
        # gateway's own).
        "async_inference": spec.AsyncInferenceConfig.model_dump(mode="json")
        if spec.AsyncInferenceConfig
        else None,
        # Where the gateway writes captured invocations (no secrets: credentials are the gateway's
        # own).
        "data_capture": spec.DataCaptureConfig.model_dump(mode="json")
        if spec.DataCaptureConfig
        else None,
        "plans": plans,
    }
