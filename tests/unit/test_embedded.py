"""serving.ray_wing.embedded without Ray: what entering and leaving start and stop (Ray's calls
replaced by recorders), and when a wait calls the server ready (the gateway's HTTP answered by a
mock transport)."""

from __future__ import annotations

import json

import httpx
import pytest

from serving.config.spec import parse_spec
from serving.ray_wing import embedded
from serving.ray_wing.embedded import EmbeddedServer, EndpointsNotReady
from serving.settings import ServerSettings

REAL_CLIENT = httpx.Client  # one test replaces httpx.Client itself
SPEC = parse_spec(
    {
        "EndpointName": "ep",
        "Containers": [
            {
                "ContainerHostname": "a",
                "Image": "python",
                "Mode": "MultiModel",
                "ModelDataUrl": "s3://bucket/prefix/",
            }
        ],
    }
)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Every call the server makes into Ray, in order; the gateway 'binds' port 43210."""
    made: list[tuple] = []
    record = lambda name, result=None: lambda *args, **kwargs: made.append((name, *args)) or result  # noqa: E731
    monkeypatch.setattr(embedded, "start_local_ray", record("start_local_ray"))
    monkeypatch.setattr(embedded, "connect_cluster", record("connect_cluster"))
    monkeypatch.setattr(
        embedded,
        "expect_endpoints",
        lambda names, expected=True: made.append(("expect" if expected else "withdraw", *names)),
    )

    def start_gateway(settings, exclusive=False, meanwhile=None, expected=(), stacks=()):
        made.append(("start_gateway", settings, list(expected), list(stacks)))
        settings = settings.model_copy(update={"port": 43210})
        if meanwhile is not None:  # the endpoints deploy while the gateways start
            meanwhile(settings)
        return settings

    monkeypatch.setattr(embedded, "start_gateway", start_gateway)
    monkeypatch.setattr(
        embedded,
        "deploy_endpoint",
        lambda spec, settings: (
            made.append(("deploy", spec.EndpointName, settings.port, settings.container_host)) or 1
        ),
    )
    monkeypatch.setattr(embedded, "delete_endpoint", record("delete", True))
    monkeypatch.setattr(embedded, "shutdown", record("shutdown"))
    monkeypatch.setattr(embedded, "disconnect", record("disconnect"))
    return made


def test_embedded_ray_is_started_and_shut_down(calls) -> None:
    settings = ServerSettings(port=0, container_host="node")
    with EmbeddedServer([SPEC], settings, num_cpus=2, wait=False) as server:
        assert server.url == "http://127.0.0.1:43210" and server.settings.port == 43210
        assert server.names == ["ep"]
    names = [call[0] for call in calls]
    assert names == ["start_local_ray", "start_gateway", "deploy", "shutdown"]
    # expected before any gateway starts (`server_start`): its first 200 on /ping then means "ep"
    # routes; and the template its container forks from starts with the server
    assert calls[1][2:] == (["ep"], ["python"])
    # one machine: data ports stay on loopback
    assert calls[2] == ("deploy", "ep", 43210, "127.0.0.1")


def test_no_template_is_started_ahead_when_templates_are_off(calls) -> None:
    settings = ServerSettings(port=0, fork_templates=False)
    with EmbeddedServer([SPEC], settings, wait=False):
        pass
    assert calls[1][0] == "start_gateway" and calls[1][3] == []


def test_a_container_in_a_runtime_environment_starts_no_template_ahead(calls) -> None:
    # its supervisor runs in Ray's environment for it: another interpreter, another template
    container = {**SPEC.Containers[0].model_dump(mode="json", exclude_none=True)}
    container["RuntimeEnvironment"] = {"Pip": ["tqdm"]}
    spec = parse_spec({"EndpointName": "env", "Containers": [container]})
    with EmbeddedServer([spec], ServerSettings(port=0), wait=False):
        pass
    assert calls[1][0] == "start_gateway" and calls[1][3] == []


def test_a_joined_cluster_loses_only_this_servers_endpoints(calls) -> None:
    with EmbeddedServer(
        [SPEC], ServerSettings(container_host="node"), address="ray://head:10001", wait=False
    ) as server:
        server.deploy(
            parse_spec({**SPEC.model_dump(mode="json", exclude_none=True), "EndpointName": "other"})
        )
    assert [call[0] for call in calls] == [
        "connect_cluster",
        "start_gateway",
        "deploy",
        "deploy",
        "delete",
        "delete",
        "withdraw",
        "disconnect",
    ]
    assert [call[1] for call in calls if call[0] == "delete"] == ["ep", "other"]
    assert calls[2][3] == "node"


def test_keep_endpoints_only_disconnects(calls) -> None:
    with EmbeddedServer([SPEC], address="auto", keep_endpoints=True, wait=False):
        pass
    assert [call[0] for call in calls][-1] == "disconnect" and "delete" not in [
        call[0] for call in calls
    ]


def test_a_failed_start_stops_what_was_started(calls, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(settings, exclusive=False, meanwhile=None, expected=(), stacks=()):
        raise RuntimeError("could not start the endpoint server on 127.0.0.1:8080")

    monkeypatch.setattr(embedded, "start_gateway", refuse)
    with pytest.raises(RuntimeError, match="could not start"):
        with EmbeddedServer([SPEC]):
            pytest.fail("entered")
    assert [call[0] for call in calls] == ["start_local_ray", "shutdown"]


def _gateway(
    states: dict[str, dict], ping: int = 200, others: tuple[str, ...] = ()
) -> httpx.Client:
    """A client whose gateway describes `states` (name -> status, replicas) and answers /ping with
    `ping`."""

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/ping":
            return httpx.Response(ping, text="" if ping == 200 else "endpoint x is Creating")
        if path == "/endpoints":
            return httpx.Response(
                200, json={"Endpoints": [{"EndpointName": n} for n in [*states, *others]]}
            )
        name = path.rsplit("/", 1)[1]
        if name not in states:
            return httpx.Response(400, json={"__type": "ValidationError"})
        status, replicas = states[name]["status"], states[name].get("replicas", 1)
        return httpx.Response(
            200,
            content=json.dumps(
                {
                    "EndpointName": name,
                    "EndpointStatus": status,
                    "FailureReason": "broken" if status == "Failed" else None,
                    "Containers": [{"ContainerHostname": "a", "CurrentReplicas": replicas}],
                }
            ),
        )

    return REAL_CLIENT(base_url="http://gateway", transport=httpx.MockTransport(handle))


@pytest.mark.parametrize(
    ("states", "ping", "others", "ready", "settled"),
    [
        ({}, 200, (), False, False),  # the gateway does not know it yet
        ({"ep": {"status": "Creating"}}, 503, (), False, False),
        ({"ep": {"status": "InService"}}, 200, (), True, True),
        # /ping disagrees: not routable yet
        ({"ep": {"status": "InService"}}, 503, (), False, True),
        ({"ep": {"status": "InService", "replicas": 0}}, 200, (), False, True),
        # /ping speaks for endpoints not ours
        ({"ep": {"status": "InService"}}, 503, ("someone-elses",), True, True),
        ({"ep": {"status": "Failed"}}, 503, (), False, True),
    ],
)
def test_readiness_is_the_gateways_view(states, ping, others, ready, settled) -> None:
    server = EmbeddedServer([SPEC])
    readiness = server._look(_gateway(states, ping, others), ["ep"])
    assert (readiness.ready, readiness.settled) == (ready, settled)


def test_wait_ready_is_bounded_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    server = EmbeddedServer([SPEC], ready_timeout_s=0.3)
    server._deployed, server.url = ["ep"], "http://gateway"
    monkeypatch.setattr(httpx, "Client", lambda **_: _gateway({"ep": {"status": "Creating"}}, 503))
    readiness = server.wait_ready(interval=0.05)
    assert readiness.pending == ["ep"] and not readiness.ready
    assert "ep: Creating" in str(EndpointsNotReady(readiness))
