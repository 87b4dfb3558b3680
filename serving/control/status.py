"""Endpoint status and descriptions from registered replicas (health by replica), and the board the
gateway reads."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving import protocol
from serving.access.identities import AccessReference
from serving.autoscaling.policy import ScalerState, ScalingActivity
from serving.config.data_capture import capture_summary
from serving.control.container_versions import app_name, short_reason
from serving.control.records import (
    AppStatus,
    ContainerDescription,
    ContainerRow,
    DeploymentStatus,
    EndpointDescription,
    EndpointSnapshot,
    EndpointStatus,
    Mode,
    Passthrough,
    Snapshot,
    VersionsUpdate,
)
from serving.errors import ServiceUnavailableError, ValidationError
from serving.http.responses import json_response

# Serve replica states that are on their way to serving, and on their way out.
_STARTING = ("STARTING", "UPDATING", "RECOVERING", "PENDING_MIGRATION")


_STOPPING = ("STOPPING",)


_TROUBLE = ("UNHEALTHY", "DEPLOY_FAILED")


@dataclass
class EndpointRecord:
    """What the control plane knows of an endpoint: the spec summary it routes with, and its
    state."""

    name: str
    mode: Mode
    containers: list[ContainerRow]
    limits: dict[str, int] = field(default_factory=dict)  # per-replica in-flight bound by hostname
    # hostnames whose requests are never sent twice
    not_idempotent: list[str] = field(default_factory=list)
    # Where the identities file is (path and fingerprint) or None; never part of a description.
    access: AccessReference | None = field(default=None, repr=False)
    async_inference: Passthrough | None = None  # the spec's AsyncInferenceConfig, as validated
    data_capture: Passthrough | None = None  # the spec's DataCaptureConfig, as validated
    update: VersionsUpdate = field(default_factory=lambda: VersionsUpdate())  # the last apply
    failed: bool = False  # its first deployment could not be brought up
    # brought up once: it routes with an active record (else it is being created)
    in_service: bool = False
    # hostname -> version being rolled out
    desired_versions: dict[str, str] = field(default_factory=dict)
    scaling_activities: list[ScalingActivity] = field(default_factory=list)  # newest first
    # autoscaled containers, by hostname
    scaling: dict[str, ScalerState] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, document: EndpointSnapshot) -> EndpointRecord:
        return cls(
            name=document["name"],
            mode=document["mode"],
            containers=document["containers"],
            limits=document["limits"],
            not_idempotent=document["not_idempotent"],
            access=document["access"],
            async_inference=document["async_inference"],
            data_capture=document.get("data_capture"),
            update=document["update"],
            failed=document["failed"],
            in_service=document["in_service"],
            desired_versions=document["desired_versions"],
        )


def describe(
    record: EndpointRecord,
    statuses: Mapping[str, AppStatus],
    registered: Mapping[tuple[str, str, str], int],
    in_service: bool,
) -> EndpointDescription:
    """DescribeEndpoint-shaped document for one endpoint.

    `registered`: live replicas per (endpoint, container, version); `in_service`: whether the record
    has been active (created) before, so that no replica means Updating rather than Creating.
    """
    update = record.update
    containers: list[ContainerDescription] = []
    problems: list[str] = []
    for container in record.containers:
        host, version = container["ContainerHostname"], container.get("Version", "")
        app = statuses.get(app_name(record.name, host, version))
        deployment = app["deployments"].get(host) if app is not None else None
        app_failed = app is not None and app["status"] == "DEPLOY_FAILED"
        deployment = deployment or DeploymentStatus(status="", message="", replicas={})
        states = deployment["replicas"]
        running = registered.get((record.name, host, version), 0)
        scaling = record.scaling.get(host)
        desired = (
            scaling["DesiredReplicas"] if scaling is not None else container["DesiredReplicas"]
        )
        starting = sum(states.get(state, 0) for state in _STARTING)
        pending = record.desired_versions.get(host)
        trouble = short_reason(deployment["message"]) if deployment["status"] in _TROUBLE else None
        status: EndpointStatus
        if record.failed and (app_failed or deployment["status"] == "DEPLOY_FAILED"):
            status = "Failed"
        elif running == 0:
            status = "Updating" if in_service else "Creating"
        elif running < desired or (pending is not None and pending != version):
            status = "Updating"
        else:
            status = "InService"
        entry: ContainerDescription = {
            **container,
            "Status": status,
            "CurrentReplicas": running,
            "Replicas": {
                "Running": running,
                "Starting": starting,
                "Stopping": sum(states.get(state, 0) for state in _STOPPING),
            },
        }
        # an autoscaled container: what its autoscaler last decided, and on what
        if scaling is not None:
            entry["DesiredReplicas"] = scaling["DesiredReplicas"]
            entry["ScalingMetric"] = {
                "MetricName": scaling.get("MetricName"),
                "MetricValue": scaling.get("MetricValue"),
                "TargetValue": scaling.get("TargetValue"),
            }
        if pending is not None and pending != version:
            entry["PendingVersion"] = pending
        if trouble:
            entry["LastFailureReason"] = trouble
        if status == "Failed":
            entry["FailureReason"] = (
                trouble or update.get("FailureReason") or "the container could not be deployed"
            )
            problems.append(f"container {host}: {entry['FailureReason']}")
        containers.append(entry)
    endpoint_status: EndpointStatus
    # the containers' own messages as Serve reports them now, else what the versions step recorded
    if record.failed:
        endpoint_status = "Failed"
        failure = "; ".join(problems) or update.get("FailureReason") or "the endpoint failed"
    else:
        failure = None
        if not in_service:
            endpoint_status = "Creating"
        elif update.get("Status") == "InProgress" or any(
            c["Status"] != "InService" for c in containers
        ):
            endpoint_status = "Updating"
        else:
            endpoint_status = "InService"
        if update.get("Status") == "Failed":  # rolled back: still serving the previous version
            failure = f"The last update failed and was rolled back: {update.get('FailureReason')}"
    described: EndpointDescription = {
        "EndpointName": record.name,
        "EndpointStatus": endpoint_status,
        "FailureReason": failure,
        "InferenceExecutionConfig": {"Mode": record.mode},
        "Containers": containers,
        "LastUpdate": {  # every key, None where the update has none yet
            "Generation": update.get("Generation"),
            "Status": update.get("Status"),
            "FailureReason": update.get("FailureReason"),
            "StartedAt": update.get("StartedAt"),
            "FinishedAt": update.get("FinishedAt"),
        },
        "ScalingActivities": list(record.scaling_activities),
    }
    # as DescribeEndpoint shows it: only for an endpoint that serves InvokeEndpointAsync
    if record.async_inference:
        described["AsyncInferenceConfig"] = record.async_inference
    if record.data_capture:
        described["DataCaptureConfig"] = capture_summary(record.data_capture)
    return described


class StatusBoard:
    """Latest descriptions of every endpoint, swapped in whole by the background poller."""

    def __init__(self) -> None:
        self.records: dict[str, EndpointRecord] = {}
        self.descriptions: dict[str, EndpointDescription] = {}
        self.loaded = False  # a first snapshot of the registry has been applied
        # Served endpoints behind each API endpoint's traffic (its current generation); a served
        # variant of an API endpoint that has one but is not among them is a standby (an update's
        # new generation coming up, or one that failed and is rolled back) and does not make GET
        # /ping unhealthy: traffic never reaches it.
        self.fronted: dict[str, frozenset[str]] = {}
        # Readiness means routable (issue 43): endpoints this gateway must serve before /ping
        # answers 200 that it has not seen in a snapshot yet: the registry's awaited ones (`serving
        # up`'s specs, not deployed yet) and the ones a restarted control-plane API put back; and
        # why the gateway itself is not ready (`starting`).
        self.awaited: list[str] = []
        self.expected: set[str] = set()
        self.starting: str | None = None
        # have the other gateways read this table?
        self.everywhere: Callable[[], Awaitable[bool]] | None = None
        self._ready = False  # the last /ping answered 200

    def refresh(
        self, statuses: Mapping[str, AppStatus], registered: Mapping[tuple[str, str, str], int]
    ) -> None:
        """Rebuild descriptions from the registry's latest statuses and registered replicas."""
        self.descriptions = {
            name: describe(record, statuses, registered, in_service=record.in_service)
            for name, record in list(self.records.items())
        }
        # seen once: from here on its description says whether it routes
        self.expected -= set(self.records)
        self.loaded = True

    def read(self, snapshot: Snapshot) -> None:
        """Take a registry snapshot in: records, their autoscaling, the awaited endpoints,
        descriptions."""
        records = {
            name: EndpointRecord.from_snapshot(document)
            for name, document in snapshot["endpoints"].items()
        }
        for name, record in records.items():
            scaling = snapshot["scaling"].get(name)
            if scaling is not None:
                record.scaling, record.scaling_activities = (
                    scaling["containers"],
                    scaling["activities"],
                )
        self.records = records
        self.awaited = snapshot["awaited"]
        api = snapshot["api"]
        if api is None:
            self.starting = "the control-plane API has not restored its stored endpoints yet"
        else:
            self.starting = None
            self.expected = set(api["served"])
            self.fronted = {
                public: frozenset(v[1] for v in variants)
                for public, variants in api["fronts"].items()
            }
        self.refresh(snapshot["statuses"], snapshot["registered"])

    def unroutable(self) -> list[str]:
        """Why the gateway cannot route every known endpoint now (empty when it can)."""
        if not self.loaded:
            return ["the gateway has not read the registry yet"]
        reasons = [self.starting] if self.starting else []
        reasons += [
            f"endpoint {name} is not deployed yet"
            for name in sorted(set(self.awaited) | self.expected)
        ]
        for name, description in sorted(self.descriptions.items()):
            if self._standby(name):
                continue
            if description["EndpointStatus"] in ("Failed", "Creating"):
                reasons.append(f"endpoint {name} is {description['EndpointStatus']}")
                continue
            idle = [
                c["ContainerHostname"]
                for c in description["Containers"]
                if c["CurrentReplicas"] == 0
            ]
            if idle:
                reasons.append(f"endpoint {name}: no ready replica of {', '.join(idle)}")
        return reasons

    def _standby(self, name: str) -> bool:
        public = name.split(protocol.VARIANT_SEPARATOR)[0]
        fronted = self.fronted.get(public) if public != name else None
        return fronted is not None and name not in fronted

    def healthy(self) -> bool:
        return not self.unroutable()

    def failure(self, name: str) -> str | None:
        description = self.descriptions.get(name)
        if description and description["EndpointStatus"] == "Failed":
            return description["FailureReason"]
        return None

    # --- HTTP ---------------------------------------------------------------------
    def routes(self) -> list[Route]:
        return [
            Route(protocol.PING_PATH, self.ping, methods=["GET"]),
            Route("/endpoints", self.list_endpoints, methods=["GET"]),
            Route("/endpoints/{name}", self.describe_endpoint, methods=["GET"]),
        ]

    async def ping(self, request: Request) -> Response:
        """200 only when every known endpoint is routable; 503 with the reasons otherwise (load
        balancers).

        Becoming ready also waits for `everywhere`: every other gateway has read this table too,
        since a client cannot pick which gateway of a shared port its next call reaches. Asked on
        that transition only, so that a gateway killed later (silent in the registry for a while)
        takes no live one out of service."""
        reasons = self.unroutable()
        if (
            not reasons
            and not self._ready
            and self.everywhere is not None
            and not await self.everywhere()
        ):
            reasons = ["another gateway has not read the latest routing table yet"]
        self._ready = not reasons
        if reasons:
            raise ServiceUnavailableError("; ".join(reasons))
        return Response(b"", status_code=200)

    async def list_endpoints(self, request: Request) -> Response:
        summaries = [
            {"EndpointName": d["EndpointName"], "EndpointStatus": d["EndpointStatus"]}
            for _, d in sorted(self.descriptions.items())
        ]
        return json_response({"Endpoints": summaries})

    async def describe_endpoint(self, request: Request) -> Response:
        name = request.path_params["name"]
        description = self.descriptions.get(name)
        if description is None:
            raise ValidationError(f"Could not find endpoint {name}.")
        return json_response(description)
