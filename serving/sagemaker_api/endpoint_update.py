"""An endpoint update, top to bottom: a new generation of variants comes up beside the serving
fleet; once all of it is InService, traffic moves to it at once or in the baking steps of a
DeploymentConfig; the update then finishes (the old fleet drains and is deleted) or rolls back (an
alarm in ALARM, a timeout, a variant that failed: traffic goes back to the old fleet, the new one
drains).

Two layers update, and this is the upper one. An *endpoint update* moves an API endpoint between
fleets of variants, each variant a served endpoint of its own. Each served endpoint moves between
its own *container versions* (`control.container_versions`), which is how a new fleet comes up here:
`Fleet.deploy` applies it.

Every CreateEndpoint, UpdateEndpoint, capacity change and restart starts one (`start`, `restore`);
the API's background tick calls `advance` about twice a second until it is done. The documents are
typed (`stored.EndpointDocument`) and stay JSON in the state database; a server that stops
mid-update brings the update back on restart (`restore`) and its traffic shifting starts over once
the new fleet is back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from serving.gateway.variants import VariantRoute
from serving.sagemaker_api.stored import (
    DeploymentPlan,
    EndpointDocument,
    PendingUpdate,
    Retired,
    UpdateKind,
    VariantRow,
)
from serving.sagemaker_api.translate import internal_name

__all__ = [
    "DRAIN_S",
    "EndpointUpdates",
    "Fleet",
    "routes",
    "served_names",
    "share",
    "variant_status",
]

# an old fleet is deleted this long after traffic left it (requests in flight finish)
DRAIN_S = 10.0

Step = Literal["wait", "step", "finish", "rollback"]


class Fleet(Protocol):
    """The served endpoints behind variants, as an update drives them."""

    def deploy(self, endpoint: str, variants: list[VariantRow]) -> dict[str, int]:
        """Apply each variant's served endpoint; the deploy generation that brings each up, by
        served name."""
        ...

    def delete(self, served: str) -> bool: ...


def next_generation(document: EndpointDocument) -> tuple[int, Callable[[str], str]]:
    """The endpoint's next fleet generation, and the served name of a variant in it."""
    generation = int(document.get("Generation", 0)) + 1
    return generation, lambda variant: internal_name(document["EndpointName"], variant, generation)


def served_names(document: EndpointDocument) -> set[str]:
    """Every served endpoint the endpoint routes to or is bringing up."""
    pending = document.get("pending")
    return {
        variant["Served"]
        for variant in [*document["variants"], *(pending["variants"] if pending else [])]
    }


class EndpointUpdates:
    """Starts, advances and restores endpoint updates over `fleet`; `alarm_state(name)` reads an
    alarm's state."""

    def __init__(
        self, fleet: Fleet, clock: Callable[[], float], alarm_state: Callable[[str], str | None]
    ) -> None:
        self.fleet, self.clock, self.alarm_state = fleet, clock, alarm_state

    # --- starting ---------------------------------------------------------------------------------
    def start(
        self,
        document: EndpointDocument,
        variants: list[VariantRow],
        kind: UpdateKind,
        config: str,
        plan: DeploymentPlan | None = None,
    ) -> None:
        """Bring `variants` up beside what serves; traffic moves once all are InService."""
        pending: PendingUpdate = {
            "kind": kind,
            "EndpointConfigName": config,
            "variants": variants,
            "generations": self.fleet.deploy(document["EndpointName"], variants),
            "StartedAt": self.clock(),
        }
        if plan is not None:
            pending["deployment"] = plan
        document["pending"] = pending
        document["LastModifiedTime"] = self.clock()

    def restore(self, document: EndpointDocument) -> None:
        """A restarted server: re-apply what served and what was coming up; an endpoint that served
        is Updating until its fleet is back (a `restore` update), and traffic shifting starts
        over."""
        pending = document.get("pending")
        if pending:
            pending["generations"] = self.fleet.deploy(
                document["EndpointName"], pending["variants"]
            )
            pending.pop("shift", None)
        if document["variants"]:
            generations = self.fleet.deploy(document["EndpointName"], document["variants"])
            if not pending:
                document["EndpointStatus"] = "Updating"
                document["pending"] = {
                    "kind": "restore",
                    "EndpointConfigName": document["EndpointConfigName"],
                    "variants": document["variants"],
                    "generations": generations,
                    "StartedAt": self.clock(),
                }
        for retired in document.get("retired", []):
            self.fleet.delete(retired["Served"])
        document["retired"] = []

    # --- advancing --------------------------------------------------------------------------------
    def advance(
        self, document: EndpointDocument, descriptions: Mapping[str, Mapping[str, Any]]
    ) -> bool:
        """One tick: move the update on and delete drained fleets; whether the document changed."""
        changed = self._move(document, descriptions)
        return self._drain(document) or changed

    def _move(
        self, document: EndpointDocument, descriptions: Mapping[str, Mapping[str, Any]]
    ) -> bool:
        pending = document.get("pending")
        if not pending:
            return False
        ready, failure = _fleet_state(pending, descriptions)
        now = self.clock()
        if failure is not None:
            self._roll_back(document, pending, failure, now)
        elif not ready:
            return False
        elif pending.get("deployment") and pending["kind"] == "update":
            return self._bake(document, pending, now)
        else:
            self._finish(document, pending, now)
        return True

    def _bake(self, document: EndpointDocument, pending: PendingUpdate, now: float) -> bool:
        """A stepped update: its first step, its next one, its end, or its rollback; False while a
        step bakes."""
        shift = pending.get("shift")
        if not shift:
            pending["shift"] = {"step": 0, "since": now}
            return True
        action, why = progress(pending, now, self.alarm_state)
        if action == "rollback":
            self._roll_back(document, pending, why, now)
        elif action == "step":
            pending["shift"] = {"step": shift["step"] + 1, "since": now}
        elif action == "finish":
            plan = pending.get("deployment")
            self._finish(document, pending, now, termination=plan["termination"] if plan else 0.0)
        return action != "wait"

    def _finish(
        self, document: EndpointDocument, pending: PendingUpdate, now: float, termination: float = 0
    ) -> None:
        """All traffic on the new fleet; the old one deleted DRAIN_S (plus `termination`) from
        now."""
        coming = {variant["Served"] for variant in pending["variants"]}
        leaving = [
            variant["Served"] for variant in document["variants"] if variant["Served"] not in coming
        ]
        document["retired"] = [
            *document.get("retired", []),
            *(_retired(served, now + termination) for served in leaving),
        ]
        document["variants"], document["pending"] = pending["variants"], None
        document["EndpointConfigName"] = pending["EndpointConfigName"]
        document["EndpointStatus"], document["FailureReason"] = "InService", None
        document["LastModifiedTime"] = now

    def _roll_back(
        self, document: EndpointDocument, pending: PendingUpdate, failure: str, now: float
    ) -> None:
        """The update failed: the serving fleet keeps (or gets back) all traffic and the new one
        goes; an endpoint with no serving fleet (its first, or one a restart could not bring back)
        is Failed."""
        serving = {variant["Served"] for variant in document["variants"]}
        for variant in pending["variants"]:
            if variant["Served"] in serving:
                continue
            # it took traffic: deleted only once the gateways route without it
            if pending.get("shift"):
                document["retired"] = [
                    *document.get("retired", []),
                    _retired(variant["Served"], now),
                ]
            else:
                self.fleet.delete(variant["Served"])
        document["pending"], document["LastModifiedTime"] = None, now
        if document["variants"] and pending["kind"] != "restore":
            document["EndpointStatus"] = "InService"
            document["FailureReason"] = f"The update failed and was rolled back: {failure}"
        else:
            document["EndpointStatus"], document["FailureReason"], document["variants"] = (
                "Failed",
                failure,
                [],
            )

    def _drain(self, document: EndpointDocument) -> bool:
        """Delete the retired served endpoints whose drain time is up; whether any was."""
        keep = []
        for retired in document.get("retired", []):
            if self.clock() - retired["At"] >= DRAIN_S:
                self.fleet.delete(retired["Served"])
            else:
                keep.append(retired)
        changed = len(keep) != len(document.get("retired", []))
        document["retired"] = keep
        return changed


def _retired(served: str, at: float) -> Retired:
    return {"Served": served, "At": at}


def _fleet_state(
    pending: PendingUpdate, descriptions: Mapping[str, Mapping[str, Any]]
) -> tuple[bool, str | None]:
    """(every new variant InService at its generation, the first failure among them)."""
    ready = True
    for variant in pending["variants"]:
        served = variant["Served"]
        description = descriptions.get(served)
        update = (description or {}).get("LastUpdate") or {}
        if description is None or (update.get("Generation") or 0) < pending["generations"][served]:
            ready = False
            continue
        if update.get("Status") == "Failed":
            return False, f"variant {variant['VariantName']}: {update.get('FailureReason')}"
        if update.get("Status") != "Succeeded" or description.get("EndpointStatus") != "InService":
            ready = False
    return ready, None


# --- where a stepped update stands: its traffic, its next step, its status ------------------------
def share(pending: PendingUpdate) -> float:
    """The share of traffic on the new fleet now (0 before the first step)."""
    shift, plan = pending.get("shift"), pending.get("deployment")
    return plan["steps"][shift["step"]] if shift and plan else 0.0


def routes(serving: list[VariantRow], pending: PendingUpdate) -> tuple[VariantRoute, ...]:
    """Both fleets' production variants, weighted so that the new one takes its step's share of the
    traffic (shadow variants keep getting copies from the serving fleet's shadows until the update
    ends)."""
    new, coming = share(pending), [v for v in pending["variants"] if not v.get("Shadow")]
    old_total = sum(float(v["Weight"]) for v in serving) or 1.0
    new_total = sum(float(v["Weight"]) for v in coming) or 1.0
    return (
        *(
            VariantRoute(v["VariantName"], v["Served"], float(v["Weight"]) / old_total * (1 - new))
            for v in serving
        ),
        *(
            VariantRoute(v["VariantName"], v["Served"], float(v["Weight"]) / new_total * new)
            for v in coming
        ),
    )


def progress(
    pending: PendingUpdate, now: float, alarm_state: Callable[[str], str | None]
) -> tuple[Step, str]:
    """What a stepped update does next: ("wait" | "step" | "finish" | "rollback", why)."""
    plan, shift = pending.get("deployment"), pending.get("shift")
    # only a stepped update that started moving traffic bakes
    assert plan is not None and shift is not None
    where = f"step {shift['step'] + 1} of {len(plan['steps'])}, {share(pending):.0%} of traffic on the new fleet"
    for alarm in plan["alarms"]:
        if alarm_state(alarm) == "ALARM":
            return (
                "rollback",
                f"alarm {alarm} went to ALARM during the deployment ({where}); all traffic is back on the old fleet",
            )
    if plan["timeout"] is not None and now - pending["StartedAt"] > plan["timeout"]:
        return (
            "rollback",
            f"the deployment ran past MaximumExecutionTimeoutInSeconds ({plan['timeout']} s; {where})",
        )
    if now - shift["since"] < plan["wait"]:
        return "wait", where
    return ("finish" if shift["step"] + 1 == len(plan["steps"]) else "step"), where


def variant_status(pending: PendingUpdate) -> list[dict[str, str | float]]:
    """A new variant's VariantStatus in DescribeEndpoint's PendingDeploymentSummary: the step it
    bakes in."""
    shift, plan = pending.get("shift"), pending.get("deployment")
    if not shift or not plan:
        return [{"Status": "Creating", "StartTime": pending["StartedAt"]}]
    message = f"step {shift['step'] + 1} of {len(plan['steps'])}: {share(pending):.0%} of traffic on the new fleet"
    return [{"Status": "Baking", "StatusMessage": message, "StartTime": shift["since"]}]
