"""The control plane's seat in the registry's process: `Registry` takes these methods in.

The control plane (`control_plane`) was a Serve application of one replica on the head node, a Ray
worker of its own (~110 MiB, its own idle ticks, its own start-up) that read and wrote the registry
beside it. `serving up` now starts it in the registry (`start_control`), whose GCS state keeps its
settings so that a restarted registry starts it again; every gateway calls it through the registry's
handle, in a concurrency group of its own (`CONTROL_CALLS` threads), so that API calls waiting for the
API's lock hold up neither registrations nor snapshots. Its modules load on `start_control` only.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import ray

from serving.ray_wing.kv_store import KvStore

if TYPE_CHECKING:  # the control plane's modules load on `start_control` only
    from serving.console.overview import ConsoleJson
    from serving.documents import ApiJson
    from serving.ray_wing.control_plane import ControlPlane
    from serving.sagemaker_api.routes import Answer
    from serving.settings import SettingsJson

logger = logging.getLogger("serving.ray_wing.registry")

CONTROL_CALLS = 64  # concurrent control-plane calls (they queue behind the API's one lock)
# how long a call waits for a control plane that `serving up` has not started yet (the gateway's
# own bound, API_CALL_TIMEOUT_S, is what a caller sees)
READY_WAIT_S = 60.0
_KV_CONTROL = b"control/"


class ControlNotRunning(RuntimeError):
    """No control plane runs in this registry (`serving up` has not started it)."""


class ControlSeat:
    """Mixed into `Registry`, which provides `_allowed` (its control-token check)."""

    _store: KvStore

    def _allowed(self, token: object, what: str) -> bool:  # pragma: no cover - the registry's
        raise NotImplementedError

    def _seat_control(self) -> None:
        """At the registry's start: start the control plane again if `serving up` had started it."""
        self._control_plane: ControlPlane | None = None
        self._control_lock = threading.Lock()
        self._control_ready = threading.Event()
        settings = self._store.load(_KV_CONTROL).get("settings")
        if settings is not None:
            threading.Thread(
                target=self._restart_control_plane,
                args=(settings,),
                name="control-start",
                daemon=True,
            ).start()

    @ray.method(concurrency_group="control")
    def start_control(self, token: str, settings: SettingsJson) -> bool:
        """Run the control plane with `settings` (`serving up`), replacing one with other settings;
        whether allowed. A control plane that cannot start raises its reason (a model root that
        holds the server's secrets, say) and nothing is stored."""
        if not self._allowed(token, "start_control"):
            return False
        self._start_control_plane(settings)
        self._store.put(_KV_CONTROL, "settings", settings)
        return True

    @ray.method(concurrency_group="control")
    def api_call(self, token: str, prefix: str, operation: str, document: ApiJson) -> Answer:
        """One API call that a gateway authenticated and authorized (`ControlPlane.call`)."""
        return self._running_control(token, "api_call").call(prefix, operation, document)

    @ray.method(concurrency_group="control")
    def console(self, token: str, endpoint: str | None) -> ConsoleJson | None:
        """The operator console's data (`ControlPlane.console`)."""
        return self._running_control(token, "console").console(endpoint)

    @ray.method(concurrency_group="control")
    def scrape(self, token: str, local: bytes, gateway: str) -> bytes:
        """A gateway's `GET /metrics`, merged (`ControlPlane.scrape`)."""
        return self._running_control(token, "scrape").scrape(local, gateway)

    def _start_control_plane(self, settings: SettingsJson) -> None:
        """Start the control plane with `settings` unless it runs with them; one that cannot start
        raises, and the one running (if any) goes on."""
        from serving.ray_wing.control_plane import ControlPlane

        with self._control_lock:
            current = self._control_plane
            if (
                current is not None
                and current.settings.model_dump() == settings
                and not current.stopped()
            ):
                return
            self._control_plane = ControlPlane(settings, self._own_handle())
            if current is not None:
                current.close()
            self._control_ready.set()

    def _restart_control_plane(self, settings: SettingsJson) -> None:
        try:
            self._start_control_plane(settings)
        except Exception:
            logger.exception("the control plane did not start again with its stored settings")

    def _own_handle(self) -> Any:
        """This actor's handle, which the control plane calls the registry through."""
        return ray.get_runtime_context().current_actor

    def _running_control(self, token: str, what: str) -> ControlPlane:
        """The running control plane, started afresh if its periodic tasks stopped; waits, bounded,
        for `serving up` to start one."""
        if not self._allowed(token, what):
            raise PermissionError(f"the registry refused {what} without the control plane's token")
        plane = self._control_plane if self._control_ready.wait(READY_WAIT_S) else None
        if plane is None:
            raise ControlNotRunning("no control plane runs: `serving up` has not started it")
        stopped = plane.stopped()
        if stopped:
            logger.error(
                "the control plane's periodic tasks stopped (%s): starting it afresh",
                ", ".join(stopped),
            )
            self._start_control_plane(plane.settings.model_dump())
            plane = self._control_plane or plane
        return plane
