"""Container versions: a served endpoint's containers moved from the versions that serve to the
desired ones, blue/green, reverted on failure, as a pure step function.

This is the lower of the two layers that update: an *endpoint update* of the control-plane API
(`sagemaker_api.endpoint_update`) moves an API endpoint between fleets of variants, and each variant
is a served endpoint whose containers move here. `serving apply` drives this layer directly.

Every container version runs as its own Serve application, `<endpoint>.<container>.<version>`, where
the version is a digest of everything its replicas are built from (its *plan*). An endpoint has an
**active** record, the one the gateway routes with, and a **desired** one, the last spec applied.
While they differ, the registry calls `step` about once a second, and as soon as a replica registers:

- each container version of the desired record that has no application yet is deployed, beside the
  active version, which keeps serving (unchanged containers keep their application and replicas);
- once every desired container version has all its first replicas registered, the desired record
  becomes active at once (traffic moves) and every application it no longer names is deleted (its
  replicas leave the routing table, then finish what they hold);
- if a desired version fails to deploy (Serve gives up on its replicas) or is not ready within the
  update timeout, the desired record is dropped, its new applications deleted, and the active one
  stays: the move is *reverted* (descriptions say "rolled back", as SageMaker words it). A first
  deployment that fails has nothing to revert to: the endpoint is Failed.

No Ray here: the registry executes the actions and persists the states.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from serving.control.records import (
    AppStatus,
    ContainerPlan,
    EndpointSnapshot,
    RegistryRecord,
    VersionsUpdate,
)

__all__ = [
    "APP_SEPARATOR",
    "Deploy",
    "Delete",
    "EndpointState",
    "app_name",
    "parse_app_name",
    "plan_version",
    "short_reason",
    "step",
]

APP_SEPARATOR = "."  # never part of an endpoint or container name (letters, digits, hyphens)
DEPLOY_FAILED = "DEPLOY_FAILED"


def plan_version(plan: Mapping[str, Any]) -> str:
    """A short digest of a container's plan: equal plans, equal versions (1 and 1.0 alike: a spec
    read from YAML and the same spec sent as JSON must not start new replicas)."""
    return hashlib.sha256(
        json.dumps(_canonical(plan), sort_keys=True, default=str).encode()
    ).hexdigest()[:12]


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {key: _canonical(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    return value


def app_name(endpoint: str, container: str, version: str) -> str:
    return APP_SEPARATOR.join((endpoint, container, version))


def parse_app_name(name: str) -> tuple[str, str, str] | None:
    """(endpoint, container, version) of one of our applications, None for any other."""
    parts = name.split(APP_SEPARATOR)
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 and all(parts) else None


@dataclass(frozen=True)
class Deploy:
    app: str
    endpoint: str
    container: str
    version: str
    plan: ContainerPlan


@dataclass(frozen=True)
class Delete:
    app: str


class StoredEndpointState(TypedDict):
    """An `EndpointState` as the registry persists it (JSON in Ray's key-value store)."""

    name: str
    desired: RegistryRecord
    active: RegistryRecord | None
    update: VersionsUpdate


@dataclass
class EndpointState:
    """What the registry keeps of one endpoint (persisted as plain data)."""

    name: str
    desired: RegistryRecord
    active: RegistryRecord | None = None
    update: VersionsUpdate = field(default_factory=lambda: VersionsUpdate())

    def routing(self) -> RegistryRecord:
        """The record the gateway routes with: the active one, or the desired one while it is first
        created."""
        return self.active if self.active is not None else self.desired

    @property
    def failed(self) -> bool:
        """A first deployment that could not be brought up (nothing to revert to)."""
        return self.active is None and self.update.get("Status") == "Failed"

    def snapshot(self) -> EndpointSnapshot:
        """This endpoint as a gateway's snapshot shows it: its routing record without plans, and its
        update."""
        routing = self.routing()
        return {
            "name": routing["name"],
            "mode": routing["mode"],
            "containers": routing["containers"],
            "limits": routing["limits"],
            "not_idempotent": routing["not_idempotent"],
            "access": routing["access"],
            "async_inference": routing["async_inference"],
            "data_capture": routing.get("data_capture"),
            "update": VersionsUpdate(**self.update),
            "failed": self.failed,
            "in_service": self.active is not None,
            "desired_versions": versions(self.desired),
        }

    def to_dict(self) -> StoredEndpointState:
        return {
            "name": self.name,
            "desired": self.desired,
            "active": self.active,
            "update": self.update,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EndpointState:
        return cls(
            data["name"],
            data["desired"],
            data.get("active"),
            VersionsUpdate(**(data.get("update") or {})),
        )


def versions(record: RegistryRecord | None) -> dict[str, str]:
    """Container hostname -> version of a record."""
    return {c["ContainerHostname"]: c["Version"] for c in (record["containers"] if record else [])}


def routed_replicas(
    states: Mapping[str, EndpointState], replicas: Mapping[str, tuple[str, str, str]]
) -> dict[tuple[str, str], list[str]]:
    """(endpoint, container) -> the URLs of the replicas of the version it routes with; `replicas`:
    URL -> (endpoint, container, version) of every live replica."""
    table: dict[tuple[str, str], list[str]] = {}
    for name, state in states.items():
        for host, version in versions(state.routing()).items():
            table[(name, host)] = sorted(
                url for url, key in replicas.items() if key == (name, host, version)
            )
    return table


def apps_of(name: str, record: RegistryRecord | None) -> set[str]:
    return {app_name(name, host, version) for host, version in versions(record).items()}


def step(
    state: EndpointState,
    statuses: Mapping[str, AppStatus],
    registered: Mapping[tuple[str, str, str], int],
    now: float,
    timeout_s: float,
    deployed: set[str],
) -> list[Deploy | Delete]:
    """Advance one endpoint toward its desired record; mutates `state`, returns what to do.

    `statuses`: Serve application statuses by name; `registered`: live replicas per (endpoint,
    container, version); `deployed`: applications deployed earlier whose status may not show yet.
    """
    actions: list[Deploy | Delete] = []
    name, desired = state.name, state.desired
    keep = apps_of(name, state.active) | apps_of(name, desired)
    for app in sorted(set(statuses) | deployed):  # leftovers: versions neither served nor wanted
        parsed = parse_app_name(app)
        if parsed is not None and parsed[0] == name and app not in keep and app in statuses:
            actions.append(Delete(app))
    if state.update.get("Status") != "InProgress":
        return actions
    waiting, failure = [], None
    for container in desired["containers"]:
        host, version = container["ContainerHostname"], container["Version"]
        app = app_name(name, host, version)
        status = statuses.get(app)
        if status is None and app not in deployed:
            actions.append(Deploy(app, name, host, version, desired["plans"][host]))
        if status is not None and status.get("status") == DEPLOY_FAILED:
            failure = f"container {host}: {_reason(status)}"
            break
        if registered.get((name, host, version), 0) < container["DesiredReplicas"]:
            waiting.append(host)
    if failure is None and waiting and now - state.update.get("StartedAt", now) > timeout_s:
        failure = (
            f"container{'s' if len(waiting) > 1 else ''} {', '.join(waiting)} did not become ready within "
            f"{timeout_s:g} s"
        )
    if failure is not None:
        state.update = {
            **state.update,
            "Status": "Failed",
            "FailureReason": failure,
            "FinishedAt": now,
        }
        if state.active is not None:  # revert: the active record stays, the new versions go
            state.desired = state.active
            actions += [
                Delete(app) for app in sorted(apps_of(name, desired) - apps_of(name, state.active))
            ]
        return [action for action in actions if not isinstance(action, Deploy)]
    if not waiting:
        previous = state.active
        state.active = desired
        state.update = {
            **state.update,
            "Status": "Succeeded",
            "FailureReason": None,
            "FinishedAt": now,
        }
        actions += [Delete(app) for app in sorted(apps_of(name, previous) - apps_of(name, desired))]
    return actions


def short_reason(message: str | None) -> str:
    """The useful last line of a Ray Serve failure message (tracebacks end with the error)."""
    lines = [line.strip() for line in (message or "").strip().splitlines() if line.strip()]
    errors = [
        line
        for line in lines
        if ("Error" in line or "Exception" in line)
        and ":" in line
        and not line.startswith("File ")
        and not line.endswith("Traceback (most recent call last):")
    ]
    return (errors[-1] if errors else lines[-1] if lines else "")[:1000]


def _reason(status: AppStatus) -> str:
    for deployment in (status.get("deployments") or {}).values():
        if deployment.get("message"):
            return short_reason(deployment["message"])
    return short_reason(status.get("message", "")) or "the deployment failed"
