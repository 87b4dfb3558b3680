"""What the console shows, assembled in one place from what the control plane keeps: the API's
endpoints (DescribeEndpoint: variants, weights, shadows, capture, an update's steps), each served
variant's description (containers, replicas, scaling, failures), the alarms, and the metric series.

Run where the control plane runs (`ray_wing.control_plane`), in one call per page refresh; pure
otherwise (no Ray, no web framework): a test hands it a `ControlApi` over a faked deployer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from serving.console.series import axis, series
from serving.documents import ApiJson
from serving.errors import ApiValidationError
from serving.protocol import DEFAULT_VARIANT

if TYPE_CHECKING:  # the gateway imports this module; the API itself runs in the control plane
    from serving.sagemaker_api.service import ControlApi

__all__ = ["ConsoleJson", "endpoint_detail", "overview", "visible"]

ConsoleJson = dict[str, Any]
MAX_ENDPOINTS = 10_000  # ListEndpoints pages through them all; this bounds a runaway loop
_FLEET_KEYS = ("VariantName", "Served", "Fleet", "Shadow")


def overview(
    api: ControlApi, descriptions: Mapping[str, Any], now: float | None = None
) -> ConsoleJson:
    """Every endpoint, one row each, and every alarm (`visible` narrows it to what a viewer may
    see)."""
    rows = []
    for name in _endpoint_names(api):
        described = _describe(api, name)
        if described is None:  # deleted between the listing and now
            continue
        fleets = _fleets(api, name)
        containers = [
            container
            for fleet in fleets
            for container in (descriptions.get(fleet["Served"]) or {}).get("Containers") or []
        ]
        rows.append(
            {
                "EndpointName": name,
                "EndpointStatus": described["EndpointStatus"],
                "FailureReason": described.get("FailureReason"),
                "Variants": [
                    {key: v.get(key) for key in ("VariantName", "CurrentWeight", "DesiredWeight")}
                    for v in described.get("ProductionVariants", [])
                ],
                "Shadows": len(described.get("ShadowProductionVariants", [])),
                "DataCapture": bool(_capture(described, fleets, descriptions).get("EnableCapture")),
                "Updating": "PendingDeploymentSummary" in described,
                "Containers": len(containers),
                "ReplicasRunning": sum(int(c.get("CurrentReplicas") or 0) for c in containers),
                "ReplicasDesired": sum(int(c.get("DesiredReplicas") or 0) for c in containers),
            }
        )
    shown = {row["EndpointName"] for row in rows}
    return {
        "Time": now if now is not None else time.time(),
        "Endpoints": rows,
        "Alarms": [_alarm(alarm) for alarm in _alarms(api, shown, everything=True)],
    }


def visible(document: ConsoleJson, may_see: Callable[[str], bool]) -> ConsoleJson:
    """An overview without the endpoints `may_see` refuses, nor the alarms that watch them."""
    hidden = {
        row["EndpointName"] for row in document["Endpoints"] if not may_see(row["EndpointName"])
    }
    return {
        **document,
        "Endpoints": [row for row in document["Endpoints"] if row["EndpointName"] not in hidden],
        "Alarms": [
            alarm
            for alarm in document["Alarms"]
            if not any(
                d["Name"] == "EndpointName" and d["Value"] in hidden
                for d in alarm.get("Dimensions") or []
            )
        ],
    }


def endpoint_detail(
    api: ControlApi, descriptions: Mapping[str, Any], name: str, now: float | None = None
) -> ConsoleJson | None:
    """One endpoint whole: DescribeEndpoint, each fleet's containers and scaling, its alarms, and a
    chart series per variant and per container; None for an endpoint that is not."""
    described = _describe(api, name)
    if described is None:
        return None
    store = api.cloudwatch.store
    times = axis(store.latest)
    fleets, charts = [], []
    served = _fleets(api, name)
    capture = _capture(described, served, descriptions)
    if capture:
        described["DataCaptureConfig"] = capture
    for fleet in served:
        description = descriptions.get(fleet["Served"]) or {}
        containers = description.get("Containers") or []
        variant = (("EndpointName", name), ("VariantName", fleet["VariantName"]))
        fleets.append(
            {
                **fleet,
                "EndpointStatus": description.get("EndpointStatus"),
                "FailureReason": description.get("FailureReason"),
                "LastUpdate": description.get("LastUpdate"),
                "Containers": containers,
                "ScalingActivities": (description.get("ScalingActivities") or [])[:10],
            }
        )
        if fleet["Fleet"] != "serving":  # an update's new fleet: its variant's series are shared
            continue
        charts.append({"Kind": "variant", **fleet, "Series": series(store, variant, times)})
        for container in containers:
            host = container["ContainerHostname"]
            dimensions = (*variant, ("ContainerName", host))
            fallback = variant if len(containers) == 1 else ()
            charts.append(
                {
                    "Kind": "container",
                    **fleet,
                    "ContainerHostname": host,
                    "Series": series(store, dimensions, times, fallback),
                }
            )
    return {
        "Time": now if now is not None else time.time(),
        "Endpoint": described,
        "Fleets": fleets,
        "Alarms": [
            _alarm(alarm) for alarm in _alarms(api, {name}, everything=False, described=described)
        ],
        "Timestamps": times,
        "Charts": charts,
    }


def _endpoint_names(api: ControlApi) -> list[str]:
    names: list[str] = []
    token: str | None = None
    while len(names) < MAX_ENDPOINTS:
        page = _call(
            api, "ListEndpoints", {"MaxResults": 100, **({"NextToken": token} if token else {})}
        )
        names += [row["EndpointName"] for row in page["Endpoints"]]
        token = page.get("NextToken")
        if not token:
            break
    return sorted(names)


def _describe(api: ControlApi, name: str) -> ApiJson | None:
    try:
        return _call(api, "DescribeEndpoint", {"EndpointName": name})
    except ApiValidationError:
        return None


def _call(api: ControlApi, operation: str, document: ApiJson) -> ApiJson:
    """A SageMaker read, under the API's lock (it reads the state an update's step writes)."""
    with api.sagemaker.lock:
        return api.sagemaker.operations[operation](document)


def _fleets(api: ControlApi, name: str) -> list[dict[str, Any]]:
    """Each variant of the endpoint as the served endpoint behind it: the serving fleet's, then an
    update's coming one. An endpoint from a spec is its own AllTraffic variant."""
    with api.sagemaker.lock:
        document = api.sagemaker.state.endpoints.get(name)
    if document is None:
        return [dict(zip(_FLEET_KEYS, (DEFAULT_VARIANT, name, "serving", False), strict=True))]
    pending = document.get("pending")
    coming = pending["variants"] if pending else []
    fleets = [("serving", v) for v in document["variants"]] + [("coming", v) for v in coming]
    return [
        dict(
            zip(
                _FLEET_KEYS,
                (v["VariantName"], v["Served"], fleet, bool(v.get("Shadow"))),
                strict=True,
            )
        )
        for fleet, v in fleets
    ]


def _capture(
    described: ApiJson, fleets: list[dict[str, Any]], descriptions: Mapping[str, Any]
) -> dict[str, Any]:
    """The endpoint's DataCaptureConfig summary: DescribeEndpoint's, else (an endpoint from a spec)
    its served endpoint's."""
    found = described.get("DataCaptureConfig")
    for fleet in fleets:
        found = found or (descriptions.get(fleet["Served"]) or {}).get("DataCaptureConfig")
    return dict(found or {})


def _alarms(
    api: ControlApi, endpoints: set[str], everything: bool, described: ApiJson | None = None
) -> list[Any]:
    """The alarms on `endpoints` (a dimension names one), those a rollback watches, and with
    `everything` those on no endpoint."""
    config = (described or {}).get("LastDeploymentConfig") or {}
    watched = (config.get("AutoRollbackConfiguration") or {}).get("Alarms") or []
    rollback = {alarm.get("AlarmName") for alarm in watched}
    chosen = []
    for alarm in api.cloudwatch.alarms.all():
        named = {d["Value"] for d in alarm.get("Dimensions", []) if d["Name"] == "EndpointName"}
        if named & endpoints or alarm["AlarmName"] in rollback or (everything and not named):
            chosen.append(alarm)
    return sorted(chosen, key=lambda alarm: alarm["AlarmName"])


def _alarm(alarm: Any) -> ConsoleJson:
    keys = (
        "AlarmName",
        "StateValue",
        "StateReason",
        "StateUpdatedTimestamp",
        "MetricName",
        "Namespace",
        "Statistic",
        "ExtendedStatistic",
        "ComparisonOperator",
        "Threshold",
        "Period",
        "EvaluationPeriods",
        "Dimensions",
    )
    return {key: alarm.get(key) for key in keys if alarm.get(key) is not None}
