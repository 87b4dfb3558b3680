"""serving.ray_wing.server_start: the registry's and the container host's workers start while
Serve's controller does, the control plane starts in the registry while the gateways deploy, the
caller's endpoints while their replicas start, and a failure of either names it with its reason. Serve and the registry are replaced by recorders (no Ray started): what is checked is the
order of the calls and the messages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from serving.ray_wing import server_start
from serving.ray_wing.names import GATEWAY_APP
from serving.settings import ServerSettings


class _Registry:
    """The registry's handle, recording `start_control`."""

    def __init__(self, made: list[tuple]) -> None:
        self.start_control = self
        self.made = made

    def remote(self, token: str, settings: dict) -> str:
        self.made.append(("start_control", token, settings))
        return "started"


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    made: list[tuple] = []
    monkeypatch.setattr(
        server_start.ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 2.0}}]
    )
    monkeypatch.setattr(server_start, "_start_serve", lambda: made.append(("serve.start",)))
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
        "_deploy_without_waiting",
        lambda applications: made.append(("deploy", sorted(applications))),
    )
    monkeypatch.setattr(server_start, "POLL_S", 0.0)
    return made


def _statuses(monkeypatch: pytest.MonkeyPatch, made: list[tuple], *reads: dict[str, str]) -> None:
    """Serve's statuses, one read after another (the last repeated)."""
    sequence: Iterator[dict[str, str]] = iter(reads)
    last: dict[str, str] = {}

    def read() -> dict:
        nonlocal last
        last = next(sequence, last)
        made.append(("status",))
        return {
            name: {"status": state, "message": f"{name} said no"} for name, state in last.items()
        }

    monkeypatch.setattr(server_start, "serve_status", read)


def test_both_applications_start_in_one_call_with_the_endpoints_alongside(
    calls: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    _statuses(
        monkeypatch,
        calls,
        {GATEWAY_APP: "DEPLOYING"},
        {GATEWAY_APP: "DEPLOYING"},
        {GATEWAY_APP: "RUNNING"},
    )
    seen: list[int] = []
    settings = server_start.start_gateway(
        ServerSettings(port=0),
        exclusive=True,
        meanwhile=lambda s: (calls.append(("endpoints",)), seen.append(s.port)),
        expected=["one", "two"],
        stacks=["sklearn"],
    )
    names = [call[0] for call in calls]
    # the registry's and this node's container host's workers start (the host starting the stacks'
    # templates) while Serve's controller does; the endpoints are expected before any gateway
    # deploys; the control plane is waited for once the endpoints are deployed
    assert names[:9] == [
        "handle",
        "host",
        "serve.start",
        "registry",
        "expect",
        "start_control",
        "deploy",
        "endpoints",
        "control",
    ]
    assert calls[1] == ("host", ["sklearn"])
    assert calls[3] == ("registry", "127.0.0.1")  # its snapshot feed where the data ports bind
    assert calls[4] == ("expect", ["one", "two"])
    assert calls[5][1] == "the control token"
    assert calls[5][2]["port"] == settings.port  # the settings the gateways serve with
    assert calls[6] == ("deploy", [GATEWAY_APP])
    assert calls[8] == ("control", "started")
    # the endpoints' records get the port the gateways bind (port 0 resolved before anything starts)
    assert seen == [settings.port] and settings.port > 0
    assert set(names[9:]) == {"status"}


def test_a_failed_gateway_is_named_with_serves_reason(
    calls: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    _statuses(monkeypatch, calls, {GATEWAY_APP: "DEPLOY_FAILED"})
    with pytest.raises(
        RuntimeError,
        match="could not start the endpoint server on 127.0.0.1:.*serving-gateway said no",
    ):
        server_start.start_gateway(ServerSettings(port=0))


def test_a_gateway_that_never_runs_is_reported_in_bounded_time(
    calls: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    _statuses(monkeypatch, calls, {GATEWAY_APP: "DEPLOYING"})
    monkeypatch.setattr(server_start, "START_TIMEOUT_S", 0.05)
    with pytest.raises(RuntimeError, match="still DEPLOYING after 0 s"):
        server_start.start_gateway(ServerSettings(port=0))


def test_the_registry_feed_binds_where_data_ports_do_or_nowhere() -> None:
    assert server_start.feed_host(ServerSettings(container_host="node")) == "node"
    assert server_start.feed_host(ServerSettings(registry_feed=False)) is None
