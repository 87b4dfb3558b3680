"""Container versions run by their nodes' container hosts instead of as Serve applications: each
replica is a *slot* (a Ray placement group reserving its resources, then a replica started on the
host of the node that group landed on), and each version shows the status a Serve application would,
so that `container_versions.step` and `status.StatusBoard` read one shape for both.

No Ray here: `ray_wing.node_hosting` places, starts and watches; this says what each slot is and
what the version's status is.
"""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, NotRequired, TypedDict

from serving.control.container_versions import DEPLOY_FAILED
from serving.control.records import AppStatus, ContainerPlan

__all__ = ["MAX_START_FAILURES", "HostedApp", "Slot", "StoredHostedApp", "hosted", "slot_of"]

# starts that failed, none serving, before the version is DEPLOY_FAILED (Serve's
# max_constructor_retry_count for a container replica)
MAX_START_FAILURES = 3

SlotState = Literal["PLACING", "STARTING", "RUNNING"]


class StoredHostedApp(TypedDict):
    """A hosted version as the registry keeps it in Ray's key-value store (a restarted registry
    adopts its replicas from it)."""

    endpoint: str
    container: str
    version: str
    plan: ContainerPlan
    replicas: NotRequired[int]  # its slots now (an autoscaled version's count moves)


def hosted(plan: ContainerPlan) -> bool:
    """Whether a plan's replicas run on their nodes' container hosts (else each is a Serve replica)."""
    return plan.get("hosting") == "node"


def slot_of(replica: str) -> int | None:
    """The slot a replica id names (`h<slot>-<random>`), None for another id."""
    head, _, _ = replica.partition("-")
    return int(head[1:]) if head[:1] == "h" and head[1:].isdigit() else None


@dataclass
class Slot:
    """One replica's place: its placement group's node, the replica started there, and its state."""

    index: int
    state: SlotState = "PLACING"
    node: str | None = None
    replica: str | None = None

    def new_replica(self, node: str) -> str:
        """Start a new replica on `node` (a fresh id: metrics and registrations never mix two)."""
        self.state, self.node = "STARTING", node
        self.replica = f"h{self.index}-{secrets.token_hex(4)}"
        return self.replica

    def lost(self) -> None:
        """Its replica is gone (failed, its host died): place and start it again."""
        self.state, self.replica = "PLACING", None


@dataclass
class HostedApp:
    """One container version on container hosts: its plan, its slots, its start failures."""

    app: str
    endpoint: str
    container: str
    version: str
    plan: ContainerPlan
    slots: list[Slot] = field(default_factory=list)
    failures: int = 0
    failure: str | None = None  # why it is DEPLOY_FAILED

    @classmethod
    def of(
        cls,
        app: str,
        endpoint: str,
        container: str,
        version: str,
        plan: ContainerPlan,
        replicas: int | None = None,
    ) -> HostedApp:
        """A version with `replicas` slots, by default its plan's fixed count or its autoscaling's
        initial count."""
        count = plan["count"]
        if replicas is None:
            scaling = count.get("autoscaling_config")
            replicas = int(scaling["initial_replicas"] if scaling else count["num_replicas"])
        return cls(app, endpoint, container, version, plan, [Slot(i) for i in range(replicas)])

    @property
    def autoscaled(self) -> bool:
        return "autoscaling_config" in self.plan["count"]

    def to_dict(self) -> StoredHostedApp:
        return {
            "endpoint": self.endpoint,
            "container": self.container,
            "version": self.version,
            "plan": self.plan,
            "replicas": len(self.slots),
        }

    def resize(self, replicas: int) -> list[Slot]:
        """Its autoscaler's new count: slots added to place, or the last slots taken off (returned,
        for their replicas to be stopped). Slot i stays slot i, so replica ids name their slot."""
        removed = self.slots[replicas:]
        del self.slots[replicas:]
        self.slots += [Slot(i) for i in range(len(self.slots), replicas)]
        return removed

    def start_failed(self, slot: Slot, error: str) -> None:
        """A start raised: try again, unless MAX_START_FAILURES starts failed and none serves."""
        slot.lost()
        self.failures += 1
        if self.failures >= MAX_START_FAILURES and not any(
            s.state == "RUNNING" for s in self.slots
        ):
            self.failure = (
                f"The replica of container {self.container} failed to start "
                f"{self.failures} times: {error}"
            )

    @property
    def settled(self) -> bool:
        """Nothing to place or start (all running, or failed for good)."""
        return self.failure is not None or all(s.state == "RUNNING" for s in self.slots)

    def status(self) -> AppStatus:
        """This version as Serve would show its application."""
        states = Counter("RUNNING" if s.state == "RUNNING" else "STARTING" for s in self.slots)
        if self.failure is not None:
            app_status, deployment_status, message = DEPLOY_FAILED, DEPLOY_FAILED, self.failure
        elif states["RUNNING"] == len(self.slots):
            app_status, deployment_status, message = "RUNNING", "HEALTHY", ""
        else:
            app_status, deployment_status, message = "DEPLOYING", "UPDATING", ""
        return {
            "status": app_status,
            "message": message,
            "deployments": {
                self.container: {
                    "status": deployment_status,
                    "message": message,
                    "replicas": dict(states),
                }
            },
        }
