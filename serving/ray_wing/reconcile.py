"""The registry's reconcile loop: it reads the statuses of the versions on container hosts
(`node_hosting`) and, once a container Serve runs has started its controller, Serve's, and deploys
or deletes the applications that each endpoint's next step calls for (the steps themselves:
`control.container_versions`)."""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from serving.control.container_versions import Delete, Deploy
from serving.control.hosted_apps import hosted
from serving.control.records import AppStatus
from serving.ray_wing.node_hosting import NodeHosting
from serving.ray_wing.replica import deploy_container
from serving.ray_wing.serve_status import ServeNotRunning, serve_status

logger = logging.getLogger("serving.ray_wing.registry")

# Serve's statuses are read every STATUS_POLL_S while anything changes (a rollout, a failure, a new
# replica) and every STATUS_IDLE_POLL_S once nothing has for a while: each read is a call to the
# Serve controller, which then builds every application's status, so an idle server polling at 1 s
# spent CPU on answers nobody needed.
STATUS_POLL_S = 1.0
STATUS_IDLE_POLL_S = 5.0
QUIET_POLLS = 5  # unchanged reads in a row before the idle period applies


class Reconciled(Protocol):
    """What the loop needs of the registry it runs in."""

    version: int

    def _observe(self, statuses: dict[str, AppStatus]) -> None: ...

    def _updating(self) -> bool: ...

    def _forget_held(self, holder: str) -> None: ...

    def _advance(
        self, statuses: dict[str, AppStatus], deployed: set[str]
    ) -> list[Deploy | Delete]: ...


class Reconciler:
    """A thread of the registry's process: polled here, not in the gateway, whose process serves
    requests and must not spend its GIL on the Serve controller's answers."""

    def __init__(self, registry: Reconciled) -> None:
        self._registry = registry
        self._wake = threading.Event()
        # applications deployed by this process (their status may lag)
        self._deployed: set[str] = set()
        self.stopping = False  # the embedded server is stopping: deploy and delete nothing more
        self.hosting = NodeHosting(wake=self.wake, forget=registry._forget_held)

    def start(self) -> None:
        threading.Thread(target=self._loop, name="reconcile", daemon=True).start()

    def wake(self) -> None:
        """A put, a delete or a new replica: read Serve's statuses and advance now, not after the
        period."""
        self._wake.set()

    def _loop(self) -> None:
        quiet = 0
        while True:
            try:
                before = self._registry.version
                try:
                    statuses = serve_status()
                except ServeNotRunning:  # no container Serve runs has started it
                    statuses = {}
                moving = False if self.stopping else self.hosting.tick()
                statuses.update(self.hosting.statuses())
                self._registry._observe(statuses)
                acted = (
                    False
                    if self.stopping
                    else self._apply(self._registry._advance(statuses, self._deployed))
                )
                busy = (
                    acted
                    or moving
                    or self._registry.version != before
                    or self._registry._updating()
                )
                quiet = 0 if busy else quiet + 1
            except Exception:
                logger.exception("status poll or reconcile failed")
            self._wake.wait(STATUS_IDLE_POLL_S if quiet >= QUIET_POLLS else STATUS_POLL_S)
            self._wake.clear()

    def stop(self) -> None:
        """The embedded server stops: deploy nothing again, and drain the hosted replicas, in the
        background while the caller deletes Serve's applications (the replicas' deregistrations
        need this registry free)."""
        self.stopping = True
        threading.Thread(target=self.hosting.stop_all, name="stop-hosted", daemon=True).start()

    def _apply(self, actions: list[Deploy | Delete]) -> bool:
        """Deploy or delete each application; whether there was anything to do."""
        for action in actions:
            try:
                if isinstance(action, Deploy):
                    if hosted(action.plan):
                        self.hosting.deploy(action)
                    else:
                        deploy_container(action)
                    self._deployed.add(action.app)
                else:
                    if not self.hosting.delete(action.app):
                        from ray import serve  # only Serve's applications reach here

                        serve.delete(action.app, _blocking=False)
                    self._deployed.discard(action.app)
            except Exception:
                logger.exception("could not %s", action)
        return bool(actions)
