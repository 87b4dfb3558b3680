"""serving.ray_wing.control_seat: the control plane's place in the registry's process. The seat runs
here as a plain object with a dict for the GCS store and a recorder for the control plane (no Ray
started): what is checked is who may start it, what a failed start leaves running, and that a
control plane whose periodic tasks stopped is started afresh."""

from __future__ import annotations

from typing import Any

import pytest

from serving.ray_wing import control_plane, control_seat
from serving.settings import ServerSettings

TOKEN = "the control token"


class _Store:
    def __init__(self) -> None:
        self.data: dict[bytes, dict[str, Any]] = {}

    def load(self, prefix: bytes) -> dict[str, Any]:
        return dict(self.data.get(prefix, {}))

    def put(self, prefix: bytes, key: str, value: Any) -> None:
        self.data.setdefault(prefix, {})[key] = value


class _Plane:
    """A control plane: its settings, whether its tasks stopped, whether it was closed."""

    started: list[_Plane] = []

    def __init__(self, settings: dict[str, Any], registry: Any) -> None:
        if settings.get("region") == "refused":
            raise ValueError("a model root holds the server's secrets")
        self.settings = ServerSettings(**settings)
        self.halted: list[str] = []
        self.closed = False
        _Plane.started.append(self)

    def stopped(self) -> list[str]:
        return self.halted

    def close(self) -> None:
        self.closed = True

    def call(self, prefix: str, operation: str, document: Any) -> str:
        return f"{operation} by {id(self)}"


class _Registry(control_seat.ControlSeat):
    def __init__(self, store: _Store) -> None:
        self._store = store  # type: ignore[assignment]
        self._seat_control()

    def _allowed(self, token: object, what: str) -> bool:
        return token == TOKEN

    def _own_handle(self) -> Any:
        return "the registry's handle"


@pytest.fixture(autouse=True)
def planes(monkeypatch: pytest.MonkeyPatch) -> list[_Plane]:
    _Plane.started = []
    monkeypatch.setattr(control_plane, "ControlPlane", _Plane)
    monkeypatch.setattr(control_seat, "READY_WAIT_S", 0.01)
    return _Plane.started


def _settings(**changes: Any) -> dict[str, Any]:
    return ServerSettings(**changes).model_dump()


def test_only_the_control_token_starts_or_calls_it(planes: list[_Plane]) -> None:
    registry = _Registry(_Store())
    assert registry.start_control("guessed", _settings()) is False
    assert planes == []
    with pytest.raises(PermissionError, match="refused api_call"):
        registry.api_call("guessed", "SageMaker", "ListEndpoints", {})
    with pytest.raises(control_seat.ControlNotRunning):
        registry.api_call(TOKEN, "SageMaker", "ListEndpoints", {})
    assert registry.start_control(TOKEN, _settings()) is True
    assert registry.api_call(TOKEN, "SageMaker", "ListEndpoints", {}).startswith("ListEndpoints")


def test_a_control_plane_that_cannot_start_leaves_the_running_one(planes: list[_Plane]) -> None:
    store = _Store()
    registry = _Registry(store)
    registry.start_control(TOKEN, _settings(region="eu-west-1"))
    with pytest.raises(ValueError, match="secrets"):
        registry.start_control(TOKEN, _settings(region="refused"))
    assert len(planes) == 1 and not planes[0].closed
    assert registry.api_call(TOKEN, "SageMaker", "X", {}) == f"X by {id(planes[0])}"
    # what a restarted registry starts again with: the settings that started
    assert store.load(control_seat._KV_CONTROL)["settings"]["region"] == "eu-west-1"


def test_new_settings_replace_it_and_the_same_settings_keep_it(planes: list[_Plane]) -> None:
    registry = _Registry(_Store())
    registry.start_control(TOKEN, _settings())
    registry.start_control(TOKEN, _settings())
    assert len(planes) == 1
    registry.start_control(TOKEN, _settings(region="eu-west-1"))
    assert len(planes) == 2 and planes[0].closed and not planes[1].closed


def test_a_stopped_control_plane_is_started_afresh_at_the_next_call(
    planes: list[_Plane],
) -> None:
    registry = _Registry(_Store())
    registry.start_control(TOKEN, _settings())
    planes[0].halted = ["api step"]
    answer = registry.api_call(TOKEN, "SageMaker", "X", {})
    assert len(planes) == 2 and planes[0].closed
    assert answer == f"X by {id(planes[1])}"


def test_a_restarted_registry_starts_it_again_with_its_stored_settings(
    planes: list[_Plane],
) -> None:
    store = _Store()
    _Registry(store).start_control(TOKEN, _settings(region="eu-west-1"))
    restarted = _Registry(store)  # its constructor starts it on a thread of its own
    assert restarted._control_ready.wait(5)
    assert len(planes) == 2 and planes[1].settings.region == "eu-west-1"
