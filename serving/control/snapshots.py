"""The registry's state as the one `Snapshot` every gateway reads: built here, pure, so the registry
actor keeps only the locking and the long poll around it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from serving.control.container_versions import EndpointState, routed_replicas
from serving.control.records import ApiRouting, AppStatus, ScalingRecord, Snapshot


def snapshot_of(
    *,
    version: int,
    epoch: str,
    states: Mapping[str, EndpointState],
    replicas: Mapping[str, tuple[str, str, str]],
    statuses: dict[str, AppStatus],
    refused: int,
    awaited: set[str],
    api: ApiRouting | None,
    feed: str | None,
    scaling: Mapping[str, ScalingRecord],
) -> Snapshot:
    """`replicas`: URL -> (endpoint, container, version) of every live replica. The scaling records
    are copied: a gateway's snapshot must not change under it when the registry records more."""
    return {
        "version": version,
        "epoch": epoch,
        "endpoints": {name: state.snapshot() for name, state in states.items()},
        "replicas": routed_replicas(states, replicas),
        "registered": dict(Counter(replicas.values())),
        "statuses": statuses,
        "refused": refused,
        "awaited": sorted(awaited),
        "api": api,
        "feed": feed,
        "scaling": {
            name: ScalingRecord(containers=dict(s["containers"]), activities=list(s["activities"]))
            for name, s in scaling.items()
        },
    }
