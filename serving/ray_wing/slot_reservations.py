"""The resources of each hosted replica slot, reserved by a detached Ray placement group of one
bundle (`node_hosting` places and starts replicas on them): made or found by name, and freed only
once the slot's replica has drained, as a Serve replica's actor holds its resources until it exits.
Detached groups outlive a registry process, so a new one frees those no stored slot owns.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

from serving.ray_wing.container_host import HOST_PREFIX

logger = logging.getLogger("serving.ray_wing.slot_reservations")

# How long a slot taken off keeps its reservation at most: its replica's drain (20 s) and a host's
# answer (10 s); a host that does not answer by then is not waited for.
RELEASE_WAIT_S = 30.0


def group_name(app: str, index: int) -> str:
    return f"{HOST_PREFIX}{app}#{index}"


def _bundle(actor_options: dict[str, Any]) -> dict[str, float]:
    """The resources one replica reserves, as a placement group bundle (what Serve would reserve for
    its actor)."""
    bundle = {"CPU": float(actor_options.get("num_cpus") or 0)}
    if actor_options.get("memory"):
        bundle["memory"] = float(actor_options["memory"])
    bundle.update({name: float(v) for name, v in (actor_options.get("resources") or {}).items()})
    return {name: value for name, value in bundle.items() if value > 0}


class SlotReservations:
    """The placement groups of hosted slots, by (application, slot index). Not thread-safe: the
    caller's lock guards it."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, int], PlacementGroup] = {}
        # groups of slots taken off: (their replica's stop call's ref or None, the group, since when)
        self._releasing: list[tuple[Any, PlacementGroup, float]] = []

    def of(self, app: str, index: int, actor_options: dict[str, Any]) -> PlacementGroup:
        """The slot's group: known, found by name (a previous registry's), or made."""
        group = self._groups.get((app, index))
        if group is None:
            try:
                group = get_placement_group(group_name(app, index))
            except ValueError:
                group = placement_group(
                    [_bundle(actor_options)],
                    strategy="PACK",
                    name=group_name(app, index),
                    lifetime="detached",
                )
            self._groups[(app, index)] = group
        return group

    def release(self, app: str, index: int, stop: Any) -> None:
        """Free the slot's group once `stop` (the ref of its replica's stop call, or None) is done."""
        group = self._groups.pop((app, index), None)
        if group is not None:
            self._releasing.append((stop, group, time.monotonic()))
        self.released()

    def released(self) -> bool:
        """Free the groups whose replicas stopped (or were waited for RELEASE_WAIT_S); whether any
        is still held."""
        refs = [stop for stop, _, _ in self._releasing if stop is not None]
        done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        held = []
        for stop, group, since in self._releasing:
            if stop is None or stop in done or time.monotonic() - since > RELEASE_WAIT_S:
                try:
                    remove_placement_group(group)
                except Exception:  # gone already (a node lost with it): nothing left to free
                    logger.exception("could not remove placement group %s", group.id)
            else:
                held.append((stop, group, since))
        self._releasing = held
        return bool(held)

    def release_orphans(self, wanted: set[tuple[str, int]], stops: dict[str, Any]) -> None:
        """Free every hosted slot's group not in `wanted` (slots taken off or versions deleted while
        a previous registry process waited for their replicas to drain); `stops`: the refs of the
        stop calls of their replicas still running, by group name."""
        keep = {group_name(app, index) for app, index in wanted}
        for entry in placement_group_table().values():
            name = entry.get("name") or ""
            if name.startswith(HOST_PREFIX) and name not in keep and entry["state"] != "REMOVED":
                with contextlib.suppress(ValueError):  # removed meanwhile
                    group = get_placement_group(name)
                    self._releasing.append((stops.get(name), group, time.monotonic()))
        self.released()
