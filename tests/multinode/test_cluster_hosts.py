"""The simulated cluster (issue 61): three hosts, each a network namespace on a bridge with a Ray node and
its gateway, `serving up --address` on the first, callers in a load namespace of their own.

The echo model answers with its process ID, so each test sees which host answered a call: the host whose
cgroup holds that process. Checked here: the simulator itself (every host's gateway answers from the load
namespace; a call entering one host is answered on another over the bridge; tear-down leaves no namespace,
cgroup, veth or process); locality across hosts; every host's gateways on the registry's snapshot feed; the
head host's gateway killed, and a worker host killed whole, under load from retrying callers; a host that
joins. Every process is started by this module inside the simulation and killed by
its cgroup. Runs in the multinode session (`make test`): it starts a Ray cluster of its own. Needs root
(namespaces, cgroups): elsewhere it is skipped with the capability that is missing.
"""

from __future__ import annotations

import functools
import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from loadtests.cluster import machine as sim
from loadtests.cluster.cluster import SimulatedCluster
from loadtests.cluster.echo import echo_container, echo_model

pytestmark = pytest.mark.multinode

ENDPOINT = "sim"


def _machine_state() -> dict[str, set[str]]:
    """The machine-wide things a simulation creates: network namespaces, cgroups, links in this namespace."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30)
    cgroups = {
        str(path)
        for base in (sim.CGROUP_ROOT / "cpu", sim.CGROUP_ROOT)
        if base.exists()
        for path in base.glob("serving-sim-*")
    }
    return {
        "namespaces": {line.split()[0] for line in namespaces.stdout.splitlines() if line.strip()},
        "links": {line.split(":")[1].strip().split("@")[0] for line in links.stdout.splitlines()},
        "cgroups": cgroups,
    }


class Simulation:
    """The module's cluster, what the machine looked like before it, and every PID seen in it."""

    def __init__(self, root: Path) -> None:
        self.before = _machine_state()
        self.cluster = SimulatedCluster(hosts=3)
        self.seen: set[int] = set()
        model = echo_model(root)
        container = functools.partial(echo_container, model)
        spec = root / "spec.json"
        spec.write_text(
            json.dumps(
                {
                    "EndpointName": ENDPOINT,
                    "Containers": [
                        container("on-2", {"host-2": 1}),
                        container("spread", {"slot": 1}, replicas=3),
                    ],
                }
            )
        )
        self.cluster.up(spec)

    def host_of(self, pid: int) -> int | None:
        """The host whose cgroup holds `pid`."""
        for index, host in self.cluster.machine.hosts.items():
            pids = host.pids()
            self.seen |= pids
            if pid in pids:
                return index
        return None

    def invoke(self, index: int, container: str) -> dict:
        return self.cluster.probe(
            "POST",
            f"{self.cluster.url(index)}/endpoints/{ENDPOINT}/invocations",
            {"x": 1},
            {"X-Amzn-SageMaker-Target-Container-Hostname": container},
        )


@pytest.fixture(scope="module")
def simulation(tmp_path_factory) -> Iterator[Simulation]:
    try:
        sim.preflight()
    except sim.SimulationUnavailable as missing:
        pytest.skip(f"no simulated cluster here: {missing}")
    simulation = Simulation(tmp_path_factory.mktemp("cluster"))
    try:
        took = simulation.cluster.wait_in_service(ENDPOINT)
        print(f"{ENDPOINT} InService {took:.1f} s after serving up")
        yield simulation
    finally:
        print(simulation.cluster.driver_log()[-3000:])
        simulation.cluster.close()


def test_every_hosts_gateway_answers_from_the_load_namespace(simulation) -> None:
    for index in (1, 2, 3):
        answers = []

        def routable(index: int = index) -> bool:
            # 503 while another gateway has not read the latest change yet: a change can land just
            # after InService (Serve's statuses settling), and /ping answers for every gateway
            answers.append(simulation.cluster.probe("GET", f"{simulation.cluster.url(index)}/ping"))
            return answers[-1]["status"] == 200

        simulation.cluster.wait_until(routable, f"host {index} routable", timeout=30, every=0.5)
        assert all(answer["status"] in (200, 503) for answer in answers), (index, answers)
        assert simulation.cluster.gateway_pids(index), f"no gateway process on host {index}"


def test_a_call_entering_one_host_is_answered_on_another(simulation) -> None:
    # `on-2` has its only replica on host 2: a call entering host 1 crosses the bridge over TCP.
    answer = simulation.invoke(1, "on-2")
    assert answer["status"] == 200, answer
    assert simulation.host_of(answer["body"]["pid"]) == 2


def test_a_call_is_answered_on_the_host_it_entered(simulation) -> None:
    # Locality across hosts: `spread` has a replica on each, so a call stays on the host whose gateway
    # took it (with `--no-locality-routing` about two in three would cross: least outstanding, in turn).
    paths: Counter = Counter()
    for _ in range(4):
        for index in (1, 2, 3):
            answer = simulation.invoke(index, "spread")
            assert answer["status"] == 200, answer
            paths[(index, simulation.host_of(answer["body"]["pid"]))] += 1
    assert set(paths) == {(1, 1), (2, 2), (3, 3)}, paths


def _description(simulation: Simulation) -> dict:
    return simulation.cluster.probe("GET", f"{simulation.cluster.url(1)}/endpoints/{ENDPOINT}")[
        "body"
    ]


def _replicas(simulation: Simulation, container: str) -> int:
    containers = _description(simulation)["Containers"]
    return next(c["CurrentReplicas"] for c in containers if c["ContainerHostname"] == container)


def _registry_polls(simulation: Simulation) -> dict[str, float]:
    """Every gateway's long polls of the registry so far, by path (one scrape merges the cluster's)."""
    answer = simulation.cluster.probe("GET", f"{simulation.cluster.url(2)}/metrics")
    assert answer["status"] == 200, answer
    polls: Counter[str] = Counter()
    for line in str(answer["body"]).splitlines():
        if line.startswith("serving_registry_polls_total{"):
            path = line.split('path="', 1)[1].split('"', 1)[0]
            polls[path] += float(line.rsplit(" ", 1)[1])
    return dict(polls)


def _assert_none_lost_and_the_kill_felt(report: dict) -> None:
    """The balanced load's report after a kill: every call answered 200, enough of them, and the kill
    was felt (some call's connection failed and was retried on another host)."""
    assert set(report["outcomes"]) == {"200"}, report
    assert report["outcomes"]["200"] > 50
    assert sum(n for attempt, n in report["attempts"].items() if attempt != "1") >= 1, report


def test_every_hosts_gateways_follow_the_registry_over_its_feed(simulation) -> None:
    # Issue 61 item 5: the registry's snapshot feed listens on the head host's address; the gateways
    # of the other hosts reach it over the bridge (a failed feed poll would count as feed_failed).
    polls = _registry_polls(simulation)
    assert polls.get("feed", 0) >= 3 and polls.get("feed_failed", 0) == 0, polls


def test_the_head_hosts_gateway_killed_under_load_costs_no_call(simulation, tmp_path) -> None:
    # Issue 61 item 4: callers behind the balancer retry a broken connection on another host; Serve
    # puts a new gateway back on the head host, which serves again.
    cluster = simulation.cluster
    (gateway,) = cluster.gateway_pids(1)
    stop = tmp_path / "stop"
    load = cluster.load(ENDPOINT, "spread", 120, [1, 2, 3], stop)
    try:
        time.sleep(3)
        simulation.seen.add(gateway)
        psutil.Process(gateway).kill()
        killed = time.monotonic()

        def replaced() -> bool:
            return bool(cluster.gateway_pids(1) - {gateway}) and (
                cluster.probe("GET", f"{cluster.url(1)}/ping")["status"] == 200
            )

        back = cluster.wait_until(replaced, "a new gateway on host 1", timeout=120, every=1.0)
        time.sleep(3)  # calls enter host 1 again
    finally:
        stop.touch()
        report = json.loads(load.communicate(timeout=60)[0])
    print(
        f"host 1's gateway back {back:.1f} s after the kill ({time.monotonic() - killed:.1f}): {report}"
    )
    _assert_none_lost_and_the_kill_felt(report)


def test_a_worker_host_killed_whole_under_load_costs_no_call(simulation, tmp_path) -> None:
    cluster = simulation.cluster
    stop = tmp_path / "stop"
    load = cluster.load(ENDPOINT, "spread", 120, [1, 2, 3], stop)
    try:
        time.sleep(3)
        host = cluster.machine.hosts[3]
        simulation.seen |= host.pids()
        swept = cluster.machine.kill_host(host)  # every process of it, SIGKILL, and its network
        killed = time.monotonic()
        while _replicas(simulation, "spread") != 2:
            assert time.monotonic() - killed < 60, "host 3's replica still routed after 60 s"
            time.sleep(0.5)
        left = time.monotonic() - killed
        time.sleep(5)  # calls go on without it
    finally:
        stop.touch()
        report = json.loads(load.communicate(timeout=60)[0])
    print(
        f"host 3 swept in {swept:.2f} s, its replica out of the table {left:.1f} s later: {report}"
    )
    _assert_none_lost_and_the_kill_felt(report)


def test_a_host_that_joins_serves_within_30_s(simulation) -> None:
    cluster = simulation.cluster
    started = time.monotonic()
    cluster.start_node(4)
    raylet_up = time.monotonic() - started

    def pings() -> bool:
        return cluster.probe("GET", f"{cluster.url(4)}/ping")["status"] == 200

    took = cluster.wait_until(pings, "host 4's gateway answering", timeout=120, every=0.5)
    print(f"host 4: its Ray node up in {raylet_up:.1f} s, its gateway answering {took:.1f} s later")
    assert took < 30
    answer = simulation.invoke(4, "on-2")
    assert answer["status"] == 200 and simulation.host_of(answer["body"]["pid"]) == 2


def test_tear_down_leaves_no_namespace_cgroup_veth_or_process(simulation) -> None:
    for index in list(simulation.cluster.machine.hosts):
        simulation.seen |= simulation.cluster.machine.hosts[index].pids()
    assert simulation.seen
    simulation.cluster.close()
    assert _machine_state() == simulation.before
    deadline = time.monotonic() + 10  # a killed process with many threads takes a moment to go
    while (
        running := [pid for pid in simulation.seen if _alive(pid)]
    ) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running == [], [psutil.Process(pid).cmdline() for pid in running if _alive(pid)]


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent (this test, or init) to reap it."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
