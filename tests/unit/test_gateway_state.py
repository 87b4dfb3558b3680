"""serving.gateway.state: registry snapshots (hand-made, in the registry's shape) -> the gateway's
tables.

No Ray and no HTTP: a real ContainerTransport, StatusBoard and Invocations are fed snapshots the way
the Ray gateway feeds them, and what the request path would read is checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.access.identities import load_identities
from serving.control.status import StatusBoard
from serving.gateway.invocation import Invocations
from serving.gateway.state import GatewayState
from serving.gateway.transport import ContainerTransport
from serving.settings import ServerSettings


def container(
    host: str, mode: str = "SingleModel", version: str = "v1", desired: int = 1
) -> dict[str, Any]:
    return {
        "ContainerHostname": host,
        "Image": "sklearn",
        "Mode": mode,
        "DesiredReplicas": desired,
        "Version": version,
    }


def endpoint(
    name: str, *containers: dict[str, Any], mode: str = "Direct", **fields: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "mode": mode,
        "containers": list(containers),
        "limits": {},
        "not_idempotent": [],
        "access": None,
        "async_inference": None,
        "update": {"Status": "Succeeded"},
        "failed": False,
        "in_service": True,
        "desired_versions": {c["ContainerHostname"]: c["Version"] for c in containers},
        **fields,
    }


def snapshot(
    *endpoints: dict[str, Any],
    version: int = 1,
    epoch: str = "e1",
    replicas: int = 1,
    scaling: dict[str, Any] | None = None,
    awaited: tuple[str, ...] = (),
    api: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What Registry.snapshot returns: every container of every endpoint with `replicas` running
    replicas."""
    table, registered, statuses = {}, {}, {}
    for document in endpoints:
        name = document["name"]
        for c in document["containers"]:
            host, v = c["ContainerHostname"], c["Version"]
            table[(name, host)] = [
                f"http://10.0.0.{i + 1}:{9000 + i}/{name}/{host}" for i in range(replicas)
            ]
            registered[(name, host, v)] = replicas
            statuses[f"{name}.{host}.{v}"] = {
                "status": "RUNNING",
                "message": "",
                "deployments": {
                    host: {
                        "status": "HEALTHY",
                        "message": "",
                        "replicas": {"RUNNING": replicas} if replicas else {},
                    }
                },
            }
    return {
        "version": version,
        "epoch": epoch,
        "endpoints": {d["name"]: d for d in endpoints},
        "replicas": table,
        "registered": registered,
        "statuses": statuses,
        "refused": 0,
        "scaling": scaling or {},
        "awaited": list(awaited),
        "api": api if api is not None else {"fronts": {}, "served": []},
    }


@pytest.fixture
def state() -> GatewayState:
    settings = ServerSettings()
    transport = ContainerTransport(default_limit=128)
    return GatewayState(settings, Invocations(settings, transport), transport, StatusBoard())


def test_before_the_first_snapshot_the_gateway_is_not_loaded(state: GatewayState) -> None:
    # the pipeline answers 503 "starting", which clients retry
    assert state.invocations.loaded is False
    assert state.offer(None) is False
    assert state.invocations.loaded is False


def test_a_snapshot_becomes_the_endpoint_table_replica_lists_and_descriptions(
    state: GatewayState,
) -> None:
    serial = endpoint(
        "chain",
        container("scaler"),
        container("model", mode="MultiModel"),
        mode="Serial",
        limits={"scaler": 4},
        not_idempotent=["model"],
    )
    direct = endpoint("direct", container("iris"), container("wine"))
    assert state.offer(snapshot(serial, direct, replicas=2)) is True

    routes = state.invocations.endpoints
    assert set(routes) == {"chain", "direct"}
    assert routes["chain"].mode == "Serial" and routes["chain"].containers == ("scaler", "model")
    assert routes["chain"].multi_model == frozenset({"model"})
    assert (
        routes["direct"].containers == ("iris", "wine")
        and routes["direct"].multi_model == frozenset()
    )
    assert all(route.failure is None and route.access is None for route in routes.values())
    assert state.invocations.loaded is True

    assert state.replica_counts() == {
        ("chain", "scaler"): 2,
        ("chain", "model"): 2,
        ("direct", "iris"): 2,
        ("direct", "wine"): 2,
    }
    assert state.transport._limits == {("chain", "scaler"): 4}
    assert state.transport._no_retry == {("chain", "model")}
    assert state.board.descriptions["direct"]["EndpointStatus"] == "InService"
    assert state.desired_replicas() == {
        ("chain", "scaler"): 1,
        ("chain", "model"): 1,
        ("direct", "iris"): 1,
        ("direct", "wine"): 1,
    }


def test_the_autoscalers_decision_is_the_desired_count(state: GatewayState) -> None:
    scaled = endpoint("scaled", container("iris", desired=1))
    scaling = {
        "scaled": {
            "containers": {"iris": {"DesiredReplicas": 3}},
            "activities": [{"Cause": "test"}],
        }
    }
    state.offer(snapshot(scaled, scaling=scaling))
    assert state.desired_replicas() == {("scaled", "iris"): 3}
    assert state.board.records["scaled"].scaling_activities == [{"Cause": "test"}]


def test_a_failed_endpoint_is_routed_with_its_failure(state: GatewayState) -> None:
    broken = endpoint(
        "broken",
        container("iris"),
        failed=True,
        in_service=False,
        update={"Status": "Failed", "FailureReason": "container iris: no model.skops"},
    )
    state.offer(snapshot(broken, replicas=0))
    route = state.invocations.endpoints["broken"]
    assert route.failure is not None and "no model.skops" in route.failure
    assert state.board.descriptions["broken"]["EndpointStatus"] == "Failed"


def test_a_newer_snapshot_replaces_everything(state: GatewayState) -> None:
    state.offer(
        snapshot(endpoint("a", container("iris")), endpoint("b", container("wine")), version=1)
    )
    state.offer(snapshot(endpoint("b", container("wine"), container("extra")), version=2))
    assert set(state.invocations.endpoints) == {"b"}
    assert state.invocations.endpoints["b"].containers == ("wine", "extra")
    assert state.replica_counts() == {("b", "wine"): 1, ("b", "extra"): 1}
    assert state.version == 2 and set(state.board.descriptions) == {"b"}


def test_a_new_registry_knowing_no_endpoint_is_not_believed(state: GatewayState) -> None:
    state.offer(snapshot(endpoint("a", container("iris")), version=5, epoch="first"))
    # lost its store: keep routing
    assert state.offer(snapshot(version=1, epoch="restarted-empty")) is False
    assert set(state.invocations.endpoints) == {"a"} and state.version == 5
    # The same registry emptying its table (every endpoint deleted) is believed.
    assert state.offer(snapshot(version=6, epoch="first")) is True
    assert state.invocations.endpoints == {}


def _identities(folder: Path, key: str = "key-one-0123456789abcdef") -> Path:
    (folder / "allow.json").write_text(
        '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", '
        '"Action": "sagemaker:InvokeEndpoint", "Resource": "*"}]}'
    )
    path = folder / "identities.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "Identities": [
                    {"Principal": "alice", "ApiKey": key, "PolicyDocuments": ["allow.json"]}
                ]
            }
        )
    )
    return path


def test_access_is_loaded_from_the_file_the_registry_names_once_per_fingerprint(
    state: GatewayState, tmp_path: Path
) -> None:
    reference = load_identities(_identities(tmp_path)).reference()
    guarded = [
        endpoint("one", container("iris"), access=reference),
        endpoint("two", container("iris"), access=reference),
    ]
    state.offer(snapshot(*guarded, version=1))
    first = state.invocations.endpoints["one"].access
    # one file, read once
    assert first is not None and first is state.invocations.endpoints["two"].access
    assert first.identities.by_api_key("key-one-0123456789abcdef").principal == "alice"
    state.offer(snapshot(*guarded, endpoint("open", container("iris")), version=2))
    # not read again for the same fingerprint
    assert state.invocations.endpoints["one"].access is first
    assert state.invocations.endpoints["open"].access is None


def test_an_identities_file_changed_since_deploy_refuses_every_caller(
    state: GatewayState, tmp_path: Path
) -> None:
    path = _identities(tmp_path)
    reference = load_identities(path).reference()
    # edited after the endpoint was deployed: fingerprint differs
    _identities(tmp_path, key="key-two-0123456789abcdef")
    state.offer(snapshot(endpoint("guarded", container("iris"), access=reference)))
    access = state.invocations.endpoints["guarded"].access
    assert access is not None, "must not fall back to an open endpoint"
    assert access.identities.identities == ()  # nobody authenticates
    assert (
        access.identities.by_api_key("key-one-0123456789abcdef") is None
        and access.identities.by_api_key("key-two-0123456789abcdef") is None
    )


def test_ping_waits_for_every_endpoint_the_server_must_serve(state: GatewayState) -> None:
    # Issue 43: readiness means routable. An endpoint `serving up` was started with (the registry's
    # `awaited`), and the control-plane API's endpoints (none known before it has restored and
    # published; then each served variant), keep /ping at 503 until a snapshot shows them routable;
    # then it is 200.
    state.offer({**snapshot(awaited=("from-spec",)), "api": None})
    assert state.board.unroutable() == [
        "the control-plane API has not restored its stored endpoints yet",
        "endpoint from-spec is not deployed yet",
    ]
    fronts = {"kept": [("AllTraffic", "kept--AllTraffic", 1.0)]}
    state.offer(
        snapshot(
            awaited=("from-spec",),
            api={"fronts": fronts, "served": ["kept--AllTraffic"]},
            version=2,
        )
    )
    assert state.board.unroutable() == [
        "endpoint from-spec is not deployed yet",
        "endpoint kept--AllTraffic is not deployed yet",
    ]
    assert state.invocations.fronts["kept"].variants[0].endpoint == "kept--AllTraffic"
    spec, kept = (
        endpoint(name, container("only"), in_service=False)
        for name in ("from-spec", "kept--AllTraffic")
    )
    api = {"fronts": fronts, "served": ["kept--AllTraffic"]}
    # deployed, no replica ready yet
    state.offer(snapshot(spec, kept, version=3, replicas=0, api=api))
    assert state.board.unroutable() == [
        "endpoint from-spec is Creating",
        "endpoint kept--AllTraffic is Creating",
    ]
    # rolled out
    spec, kept = (endpoint(name, container("only")) for name in ("from-spec", "kept--AllTraffic"))
    state.offer(snapshot(spec, kept, version=4, api=api))
    assert state.board.unroutable() == [] and state.board.healthy()
    state.offer(snapshot(spec, version=5))  # kept deleted: no longer served
    assert state.board.healthy() and state.invocations.fronts == {}


def test_ping_turns_200_only_once_every_gateway_has_read_the_table(state: GatewayState) -> None:
    # Issue 43: gateways share a port, so a 200 from one means nothing if the next call reaches
    # another that has not read the endpoints yet. Becoming ready waits for `everywhere`; once
    # ready, it is not asked again (a killed gateway stays in the registry's readers a while, and
    # must not take the live ones out of service).
    from starlette.testclient import TestClient

    from serving.http.responses import serving_app

    others_read = [False]
    asked: list[bool] = []

    async def everywhere() -> bool:
        asked.append(others_read[0])
        return others_read[0]

    state.board.everywhere = everywhere
    state.offer(snapshot(endpoint("ready", container("only"))))
    with TestClient(serving_app(state.board.routes())) as client:
        refused = client.get("/ping")
        assert refused.status_code == 503 and "another gateway has not read" in refused.text
        others_read[0] = True
        assert client.get("/ping").status_code == 200
        others_read[0] = False
        assert client.get("/ping").status_code == 200 and asked == [False, True]
