"""Container hosts (docs/architecture.md, 'Container hosts'): one Ray worker per node supervises every
hosted container replica of the node, where each used to cost a Serve replica (a Ray worker) of its own.
Each container process is still started, confined and restarted alone; the host's own death is a
node's, and the registry starts what it held again."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import ray
from suite.endpoint_server import TINY
from suite.endpoints import python_container
from suite.load import Load, invoker, settle
from suite.processes import (
    CONTAINER_HOST,
    SERVE_REPLICA,
    container_process,
    supervisor_of,
    title,
)

from serving.model_server.restart_budget import RESTARTS

pytestmark = pytest.mark.integration

SETTLE_S = 120  # bound on every wait for a start on this 2-core machine


def hosted(handler_models: dict[str, Path]) -> dict:
    return {
        "EndpointName": "it-hosts",
        "Containers": [
            python_container(
                "pair",
                handler_models,
                "echo",
                Resources=TINY,
                AutoScaling={"MinCapacity": 2, "MaxCapacity": 2},
            ),
            python_container("single", handler_models, "echo", Resources=TINY),
        ],
    }


ENDPOINTS = {"it-hosts": hosted}


def _replicas(container: str) -> list[str]:
    from serving import ray_wing

    snapshot = ray.get(ray_wing.registry_handle().snapshot.remote(-1), timeout=30)
    return snapshot["replicas"].get(("it-hosts", container), [])


def _registered() -> Counter:
    """Registered replicas (routed or not) per it-hosts container, as descriptions count them."""
    from serving import ray_wing

    snapshot = ray.get(ray_wing.registry_handle().snapshot.remote(-1), timeout=30)
    return Counter(
        {key[1]: count for key, count in snapshot["registered"].items() if key[0] == "it-hosts"}
    )


def _wait(predicate, what: str, timeout: float = SETTLE_S) -> None:
    settle(predicate, what, timeout)


def _host_report() -> dict:
    """Every container host's replicas: id -> (application, failure)."""
    from serving.ray_wing.container_host import HOST_PREFIX

    report = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["name"].startswith(HOST_PREFIX):
            host = ray.get_actor(entry["name"], namespace=entry["namespace"])
            report.update(ray.get(host.report.remote(), timeout=30))
    return report


def _statuses(server) -> dict[str, str]:
    return {e["EndpointName"]: e["EndpointStatus"] for e in server.client.list_endpoints()}


def _serving(server) -> bool:
    return server.client.describe_endpoint("it-hosts")["EndpointStatus"] == "InService"


def test_one_host_supervises_every_hosted_replica_and_no_serve_replica_runs(server) -> None:
    urls = _replicas("pair") + _replicas("single")
    assert len(urls) == 3
    supervisors = {supervisor_of(url).pid for url in urls}
    assert len(supervisors) == 1, supervisors
    (host,) = supervisors
    assert title(supervisor_of(urls[0])).startswith(CONTAINER_HOST)
    # each replica is its own container process, confined on its own
    processes = {container_process(url).pid for url in urls}
    assert len(processes) == 3
    serve_replicas = [
        p.pid for p in psutil.process_iter() if title(p).startswith(SERVE_REPLICA + "it-hosts")
    ]
    assert serve_replicas == []
    described = server.client.describe_endpoint("it-hosts")
    assert {c["ContainerHostname"]: c["CurrentReplicas"] for c in described["Containers"]} == {
        "pair": 2,
        "single": 1,
    }
    assert host not in processes


def test_a_hosted_container_process_killed_under_load_dies_alone(server) -> None:
    pair = _replicas("pair")
    (single,) = _replicas("single")
    host = supervisor_of(pair[0]).pid
    neighbour = container_process(single).pid
    victim = container_process(pair[0])
    with (
        Load(invoker(server, "it-hosts", "pair")) as pair_load,
        Load(invoker(server, "it-hosts", "single")) as single_load,
    ):
        time.sleep(2)
        victim.send_signal(signal.SIGKILL)
        _wait(
            lambda: len(now := _replicas("pair")) == 2 and pair[0] not in now,
            "started again in place",
        )
        time.sleep(1)
    assert pair_load.failures() == Counter(), pair_load.failures()
    assert single_load.failures() == Counter(), single_load.failures()
    assert len(pair_load.statuses) > 40
    (new,) = set(_replicas("pair")) - set(pair)
    assert supervisor_of(new).pid == host  # the same host started it again
    assert container_process(single).pid == neighbour  # the neighbour never noticed
    _wait(lambda: _serving(server), "back in service")


def test_a_process_past_its_restart_budget_gets_a_new_replica_in_its_slot(server) -> None:
    url = _replicas("pair")[0]
    before = {replica for replica, (app, _) in _host_report().items() if ".pair." in app}
    assert len(before) == 2
    for _ in range(RESTARTS + 1):
        current = set(_replicas("pair"))
        container_process(url).send_signal(signal.SIGKILL)
        _wait(
            lambda: len(now := set(_replicas("pair"))) == 2 and url not in now,
            "serving again",
        )
        (url,) = set(_replicas("pair")) - current
    # the registry replaced the replica whose process kept dying (a new id in the same slot)
    _wait(
        lambda: (
            len(after := {r for r, (app, _) in _host_report().items() if ".pair." in app}) == 2
            and after != before
        ),
        "replaced by the registry",
    )
    _wait(lambda: _serving(server), "back in service")


def test_the_host_killed_takes_its_replicas_and_the_registry_starts_them_again(
    server,
) -> None:
    urls = _replicas("pair") + _replicas("single")
    host = supervisor_of(urls[0])
    assert title(host).startswith(CONTAINER_HOST)
    others = _statuses(server)
    most = Counter()  # the most replicas each container was counted with meanwhile

    def started_again() -> bool:
        for container, count in _registered().items():
            most[container] = max(most[container], count)
        return (
            len(_replicas("pair")) == 2
            and len(_replicas("single")) == 1
            and not set(_replicas("pair") + _replicas("single")) & set(urls)
        )

    host.send_signal(signal.SIGKILL)
    _wait(started_again, "started again")
    # the dead replicas left the table when the registry found their host dead, not after their
    # registrations' TTL beside their successors (CurrentReplicas above the desired count)
    assert most == Counter({"pair": 2, "single": 1}), most
    new_host = supervisor_of(_replicas("single")[0])
    assert new_host.pid != host.pid and title(new_host).startswith(CONTAINER_HOST)
    _wait(lambda: _serving(server), "back in service")
    send = invoker(server, "it-hosts", "single")
    assert send() == 200
    # every other endpoint's hosted replicas on this node died with it, and are back too
    _wait(lambda: _statuses(server) == others, "every endpoint as before")
