"""serving.ray_wing.server_start: the registry's and the container host's workers start together,
the control plane starts in the registry while the registry starts the gateways, the caller's
endpoints while they start, and a failure of either names it with its reason. Ray and the registry
are replaced by recorders (no Ray started): what is checked is the order of the calls and the
messages (the gateways themselves: tests/integration/test_gateway_fleet.py)."""

from __future__ import annotations

import pytest

from serving.ray_wing import server_start
from serving.settings import ServerSettings


class _Call:
    """One remote method of the registry's handle, recording its calls."""

    def __init__(self, name: str, made: list[tuple], answer: object) -> None:
        self.name, self.made, self.answer = name, made, answer

    def remote(self, *args: object) -> object:
        self.made.append((self.name, *args))
        return self.answer


class _Registry:
    def __init__(self, made: list[tuple]) -> None:
        self.start_control = _Call("start_control", made, "started")
        self.keep_gateways = _Call("keep_gateways", made, ["gateway-a"])


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    made: list[tuple] = []
    monkeypatch.setattr(
        server_start.ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 2.0}}]
    )
    monkeypatch.setattr(server_start.ray, "get", lambda answer, timeout=None: answer)
    monkeypatch.setattr(
        server_start, "_start_registry", lambda feed: made.append(("registry", feed))
    )
    monkeypatch.setattr(
        server_start, "_start_container_host", lambda stacks: made.append(("host", stacks))
    )
    monkeypatch.setattr(
        server_start, "registry_handle", lambda: made.append(("handle",)) or _Registry(made)
    )
    monkeypatch.setattr(
        server_start, "expect_endpoints", lambda names: made.append(("expect", names))
    )
    monkeypatch.setattr(server_start, "control_token", lambda: "the control token")
    monkeypatch.setattr(
        server_start, "_wait_control", lambda started: made.append(("control", started))
    )
    monkeypatch.setattr(
        server_start,
        "wait_serving",
        lambda names, timeout: made.append(("wait", names, timeout)),
    )
    return made


def test_the_gateways_start_with_the_endpoints_alongside(
    calls: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "traced")
    seen: list[int] = []
    settings = server_start.start_gateway(
        ServerSettings(port=0),
        exclusive=True,
        meanwhile=lambda s: (calls.append(("endpoints",)), seen.append(s.port)),
        expected=["one", "two"],
        stacks=["sklearn"],
    )
    names = [call[0] for call in calls]
    # the registry's and this node's container host's workers start together (the host starting
    # the stacks' templates); the endpoints are expected before any gateway starts; the control
    # plane is waited for once the endpoints are deployed, then the gateways
    assert names == [
        "handle",
        "host",
        "registry",
        "expect",
        "start_control",
        "keep_gateways",
        "endpoints",
        "control",
        "wait",
    ]
    assert calls[1] == ("host", ["sklearn"])
    assert calls[2] == ("registry", "127.0.0.1")  # its snapshot feed where the data ports bind
    assert calls[3] == ("expect", ["one", "two"])
    assert calls[4][1] == "the control token"
    assert calls[4][2]["port"] == settings.port
    token, plan = calls[5][1:]
    assert token == "the control token"
    # the settings the gateways serve with; one gateway on one machine binds its port alone; the
    # OTEL_* variables of this process reach them
    assert plan["settings"] == settings.model_dump()
    assert plan["share_port"] is False
    assert plan["env"]["OTEL_SERVICE_NAME"] == "traced"
    assert calls[7] == ("control", "started")
    assert calls[8] == ("wait", ["gateway-a"], server_start.START_TIMEOUT_S)
    # the endpoints' records get the port the gateways bind (port 0 resolved before anything starts)
    assert seen == [settings.port] and settings.port > 0


def test_a_gateway_that_cannot_start_is_named_with_its_reason(
    calls: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(names: list[str], timeout: float) -> None:
        raise RuntimeError("OSError: [Errno 98] Address already in use")

    monkeypatch.setattr(server_start, "wait_serving", refused)
    with pytest.raises(
        RuntimeError,
        match=r"could not start the endpoint server on 127\.0\.0\.1:\d+: OSError: \[Errno 98\]",
    ):
        server_start.start_gateway(ServerSettings(port=0))


def test_a_registry_that_refuses_the_token_starts_no_gateway(
    calls: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    refusing = _Registry(calls)
    refusing.keep_gateways = _Call("keep_gateways", calls, None)
    monkeypatch.setattr(server_start, "registry_handle", lambda: refusing)
    with pytest.raises(RuntimeError, match="refused this process's token"):
        server_start.start_gateway(ServerSettings(port=0))
    assert "wait" not in [call[0] for call in calls]


def test_the_registry_feed_binds_where_data_ports_do_or_nowhere() -> None:
    assert server_start.feed_host(ServerSettings(container_host="node")) == "node"
    assert server_start.feed_host(ServerSettings(registry_feed=False)) is None
