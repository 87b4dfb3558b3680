"""Two Ray nodes on this machine (`ray start` processes, token authentication on) and `serving up
--address`.

The head node (custom resource `node-a`) runs the registry and one container; the worker node
(`node-b`, an address of its own: 127.0.0.2) another; a third container has one replica on each node
(`spread`, one slot per node); each node runs a gateway, both on the one port (SO_REUSEPORT). The
test invokes every container, reads both nodes' metrics through `GET /metrics`, checks that a call
is answered on the node it entered, kills the head's gateway under load, has a third node join and
leave, kills a replica on the worker node and then the worker node itself, each under load, counting
the caller's failures. Every process here was started by this test, and is stopped by its PID. Runs
in its own pytest session (`make test` runs it after the others): it starts a Ray cluster of its
own."""

from __future__ import annotations

import functools
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from processes import accepting_pid, echo_model, free_port, listeners, stop, wait_for

from loadtests.cluster.echo import echo_container
from serving.model_server.fork_template import supervisor_named

pytestmark = pytest.mark.multinode

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


class Cluster:
    """A head and a worker node (`ray start --block`), and `serving up --address` against them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.environment = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "RAY_USAGE_STATS_ENABLED": "0",
            "SERVING_STATE_DIR": str(root / "state"),
            "RAY_preload_python_modules": "serving._worker_preload",
        }  # as deploy/ sets it
        self.environment.pop("RAY_AUTH_TOKEN_PATH", None)
        self.environment.pop("RAY_ADDRESS", None)
        self.gcs_port, self.port, self.grpc_port = free_port(), free_port(), free_port()
        self.processes: list[subprocess.Popen] = []
        self.address = f"{_node_ip()}:{self.gcs_port}"

    def start_node(self, *arguments: str) -> subprocess.Popen:
        process = subprocess.Popen(
            [str(BIN / "ray"), "start", "--block", "--disable-usage-stats", *arguments],
            env=self.environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.processes.append(process)
        return process

    def up(self, spec: Path) -> subprocess.Popen:
        log = open(self.root / "serving-up.log", "w")
        process = subprocess.Popen(
            [
                str(BIN / "serving"),
                "up",
                str(spec),
                "--address",
                self.address,
                "--port",
                str(self.port),
                "--grpc-port",
                str(self.grpc_port),
                "--wait-timeout",
                "300",
            ],
            env=self.environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop(process)


def _node_ip() -> str:
    from ray._private.services import (
        get_node_ip_address,  # the address `ray start` will use (no Ray started)
    )

    return get_node_ip_address()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[Cluster, str, subprocess.Popen]]:
    root = tmp_path_factory.mktemp("multinode")
    model = echo_model(root)
    container = functools.partial(echo_container, model)
    spec = root / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "EndpointName": "mn",
                "Containers": [
                    container("on-head", {"node-a": 1}),
                    container("on-worker", {"node-b": 1}),
                    container("spread", {"slot": 1}, replicas=2),
                ],
            }
        )
    )
    cluster = Cluster(root)
    head = cluster.start_node(
        "--head",
        f"--port={cluster.gcs_port}",
        "--num-cpus=1",
        "--include-dashboard=false",
        '--resources={"node-a": 10, "slot": 1}',
    )
    try:
        wait_for(
            lambda: (
                subprocess.run(
                    [str(BIN / "ray"), "status", f"--address={cluster.address}"],
                    env=cluster.environment,
                    capture_output=True,
                    timeout=60,
                ).returncode
                == 0
            ),
            "head up",
            timeout=120,
        )
        # A node address of its own, as every node of a real cluster has: locality is by address
        # (issue 43).
        worker = cluster.start_node(
            f"--address={cluster.address}",
            "--node-ip-address=127.0.0.2",
            "--num-cpus=1",
            '--resources={"node-b": 10, "slot": 1}',
        )
        cluster.up(spec)
        url = f"http://127.0.0.1:{cluster.port}"
        wait_for(
            lambda: (
                httpx.get(f"{url}/endpoints/mn", timeout=5).json()["EndpointStatus"] == "InService"
            ),
            "InService",
            timeout=300,
        )
        yield cluster, url, worker
    finally:
        print(
            (root / "serving-up.log").read_text()[-3000:]
            if (root / "serving-up.log").exists()
            else ""
        )
        cluster.stop()
        assert head.poll() is not None


def _invoke(url: str, container: str) -> httpx.Response:
    return httpx.post(
        f"{url}/endpoints/mn/invocations",
        json={"ask": container},
        timeout=30,
        headers={"X-Amzn-SageMaker-Target-Container-Hostname": container},
    )


def _serve_replicas(cluster: Cluster) -> dict[str, list[dict]]:
    """Every application's replicas with the node each runs on, read as a driver of the cluster:
    Serve's (if a container Serve runs started its controller), those of the versions on container
    hosts (`pid`: the supervisor's process, a Serve replica or the node's container host), and the
    gateways, as "serving-gateway" (those that answer)."""
    code = (
        "import json, ray; from serving.ray_wing.serve_status import serve_running; ray.init(address=%r, namespace='serving');"
        "nodes = {n['NodeID']: n['Resources'] for n in ray.nodes()};"
        "label = lambda node: sorted(k for k in nodes.get(node, {}) if k.startswith('node-'));"
        "out = {};"
        "\nif serve_running():"
        "\n  from ray.serve.context import _get_global_client; d = _get_global_client().get_serve_details()"
        "\n  out = {app: [{'node': label(r.get('node_id')),"
        " 'pid': r.get('pid'), 'state': r.get('state')} for dep in a['deployments'].values() for r in dep['replicas']]"
        " for app, a in d['applications'].items()}"
        "\nout['serving-gateway'] = []"
        "\nfor name in [n for n in ray.util.list_named_actors() if n.startswith('serving-gateway:')]:"
        "\n  try: node, pid = ray.get(ray.get_actor(name).where.remote(), timeout=30)"
        "\n  except Exception: continue"
        "\n  out['serving-gateway'].append({'node': label(node), 'pid': pid, 'state': 'RUNNING'})"
        "\nhosts = [e for e in ray.util.list_named_actors(all_namespaces=True) if e['name'].startswith('serving-container-host:')];"
        "\nfor e in hosts:"
        "\n  h = ray.get_actor(e['name'], namespace=e['namespace'])"
        "\n  try: pid, report = ray.get([h.pid.remote(), h.report.remote()], timeout=30)"
        "\n  except Exception: continue"
        "\n  for replica, (app, failure) in report.items():"
        "\n    out.setdefault(app, []).append({'node': label(e['name'].split(':', 1)[1]), 'pid': pid,"
        " 'state': 'RUNNING' if failure is None else 'UNHEALTHY', 'replica': replica})"
        "\nprint(json.dumps(out))"
    ) % cluster.address
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=cluster.environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _replicas(url: str, cluster: Cluster) -> dict[str, list[dict]]:
    """Serve's replicas of each container of `mn`, with their nodes."""
    return {
        app.split(".")[1]: replicas
        for app, replicas in _serve_replicas(cluster).items()
        if app.startswith("mn.")
    }


def _gateways(cluster: Cluster) -> list[str]:
    """The node of each running gateway."""
    return sorted(
        r["node"][0] for r in _serve_replicas(cluster)["serving-gateway"] if r["state"] == "RUNNING"
    )


class Load:
    def __init__(self, url: str, container: str) -> None:
        self.url, self.container, self.statuses, self.running = url, container, [], True

    def __enter__(self):
        import threading

        def run() -> None:
            with httpx.Client(timeout=30) as client:
                while self.running:
                    # A broken connection is retried up to twice, after 0.1 s and 0.2 s, as SDKs
                    # retry (botocore: 4 times, backing off): a killed gateway's listening socket
                    # lives on while the kernel tears the process down, and resets what it accepted
                    # meanwhile, so an immediate retry can be reset too.
                    for attempt in range(3):
                        try:
                            self.statuses.append(
                                client.post(
                                    f"{self.url}/endpoints/mn/invocations",
                                    json={"x": 1},
                                    headers={
                                        "X-Amzn-SageMaker-Target-Container-Hostname": self.container
                                    },
                                ).status_code
                            )
                            break
                        except httpx.TransportError as error:
                            if attempt == 2:
                                self.statuses.append(type(error).__name__)
                            time.sleep(0.1 * 2**attempt)
                    time.sleep(0.05)

        self.threads = [threading.Thread(target=run, daemon=True) for _ in range(2)]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.running = False
        for thread in self.threads:
            thread.join(30)

    def failures(self) -> Counter:
        return Counter(status for status in self.statuses if status != 200)


def test_containers_are_placed_on_both_nodes_and_all_answer(cluster) -> None:
    _, url, _ = cluster
    placement = _replicas(url, cluster[0])
    assert [r["node"] for r in placement["on-head"]] == [["node-a"]]
    assert [r["node"] for r in placement["on-worker"]] == [["node-b"]]
    assert sorted(r["node"][0] for r in placement["spread"]) == ["node-a", "node-b"]
    for container in ("on-head", "on-worker", "spread"):
        assert _invoke(url, container).status_code == 200
    # Issue 43: a gateway on every node (this machine's two nodes share the port through
    # SO_REUSEPORT).
    assert _gateways(cluster[0]) == ["node-a", "node-b"]


def test_every_nodes_gateway_serves_the_grpc_port(cluster) -> None:
    # Issue 46: the Open Inference gRPC service on --grpc-port of every gateway, shared like the
    # HTTP port.
    import numpy as np
    import tritonclient.grpc as triton

    c, _, _ = cluster
    assert listeners(c.grpc_port) == set(_gateway_pids(c)), "a gRPC listener in each node's gateway"
    pids = set()
    # fresh connections: the kernel spreads them over the gateways sharing the port
    for _ in range(6):
        client = triton.InferenceServerClient(f"127.0.0.1:{c.grpc_port}")
        try:
            tensor = triton.InferInput("x", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
            result = client.infer("mn.spread", [tensor], client_timeout=30)
            pids.add(int(result.as_numpy("pid")))
            assert result.as_numpy("input").tolist() == [[1.0, 1.0]]
        finally:
            client.close()
    assert pids, "answered over gRPC"


def test_metrics_come_from_both_nodes(cluster) -> None:
    _, url, _ = cluster
    for container in ("on-head", "on-worker"):
        for _ in range(3):
            assert _invoke(url, container).status_code == 200

    def both() -> bool:
        text = httpx.get(f"{url}/metrics", timeout=30).text
        counted = {
            container
            for container in ("on-head", "on-worker")
            if any(
                line.startswith("serving_model_latency_seconds_count")
                and f'container="{container}"' in line
                for line in text.splitlines()
            )
        }
        return counted == {"on-head", "on-worker"}

    wait_for(both, "recorded on both nodes", timeout=90)


def _gateway_pids(cluster: Cluster) -> dict[int, str]:
    """Each running gateway's PID, with its node."""
    return {
        r["pid"]: r["node"][0]
        for r in _serve_replicas(cluster)["serving-gateway"]
        if r["state"] == "RUNNING"
    }


def _enter(cluster: Cluster, container: str) -> tuple[int, int]:
    """One call on a fresh connection: the gateway process that accepted it, and the container
    process that answered (the echo's PID)."""
    connection = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=30)
    try:
        connection.connect()
        gateway = accepting_pid(connection.sock, cluster.port)
        connection.request(
            "POST",
            "/endpoints/mn/invocations",
            body=b'{"x": 1}',
            headers={
                "Content-Type": "application/json",
                "X-Amzn-SageMaker-Target-Container-Hostname": container,
            },
        )
        answer = connection.getresponse()
        assert answer.status == 200, answer.read()
        return gateway, json.loads(answer.read())["pid"]
    finally:
        connection.close()


def _supervisor_of(container: int, replicas: dict[int, str]) -> int:
    """The replica whose container process `container` is: its parent, or, for one forked from its
    stack's template (whichever node started that), the supervisor its title names."""
    supervisor = supervisor_named(" ".join(psutil.Process(container).cmdline()))
    if supervisor is not None:
        return supervisor
    return next(p.pid for p in psutil.Process(container).parents() if p.pid in replicas)


def test_a_request_entering_a_node_is_answered_on_that_node(cluster) -> None:
    # Issue 43 item 3: `spread` has a replica on each node, so a call that enters through a node's
    # gateway is answered by the replica on that node (the container process's supervisor), never
    # crossing to the other.
    replicas = _serve_replicas(cluster[0])
    node_of = {r["pid"]: r["node"][0] for rs in replicas.values() for r in rs if r["node"]}
    paths: Counter = Counter()
    for _ in range(30):
        gateway, container = _enter(cluster[0], "spread")
        replica = _supervisor_of(container, node_of)
        paths[(node_of[gateway], node_of[replica])] += 1
    print(f"entered -> answered on: {dict(paths)}")
    assert set(paths) == {("node-a", "node-a"), ("node-b", "node-b")}, paths


def test_the_head_gateway_killed_under_load_costs_no_request(cluster) -> None:
    # Issue 43: the worker node's gateway keeps serving the shared port; a caller that retries a
    # broken connection once (as SDKs do) loses nothing, and Ray starts the head node's gateway
    # again there.
    c, url, _ = cluster
    before = _gateway_pids(c)
    head = next(pid for pid, node in before.items() if node == "node-a")
    worker = next(pid for pid, node in before.items() if node == "node-b")
    with Load(url, "spread") as load, Load(url, "on-worker") as worker_load:
        time.sleep(2)
        # the head node's gateway: an actor of this test's own cluster
        os.kill(head, signal.SIGKILL)
        wait_for(
            lambda: len(listeners(c.port) - {head}) == 2,
            "a new gateway on the head node",
            timeout=120,
        )
        time.sleep(3)
    assert load.failures() == Counter() and worker_load.failures() == Counter(), (
        load.failures(),
        worker_load.failures(),
    )
    assert len(load.statuses) > 20
    after = _gateway_pids(c)
    assert worker in after and head not in after and sorted(after.values()) == ["node-a", "node-b"]


def test_a_node_that_joins_gets_a_gateway_that_serves(cluster) -> None:
    # Issue 43 item 1: nobody acts; the registry's gateway keeper sees one more live node and starts
    # its gateway, which reads the routing table before it listens (so its first connection is
    # served), within 30 s.
    c, _, _ = cluster
    before = listeners(c.port)
    joining = c.start_node(
        f"--address={c.address}",
        "--node-ip-address=127.0.0.3",
        "--num-cpus=1",
        '--resources={"node-c": 10}',
    )
    try:
        wait_for(
            lambda: any(
                p.name() == "raylet" for p in psutil.Process(joining.pid).children(recursive=True)
            ),
            "the node's raylet up",
            timeout=120,
            every=0.2,
        )
        took = wait_for(
            lambda: len(listeners(c.port) - before) == 1,
            "a gateway on the new node",
            timeout=120,
            every=0.2,
        )
        print(f"the new node's gateway listened {took:.1f} s after its raylet started")
        (new,) = listeners(c.port) - before
        assert _gateway_pids(c)[new] == "node-c"
        served = [gateway for gateway, _ in (_enter(c, "on-worker") for _ in range(40))]
        assert new in served, f"the new gateway took none of 40 connections: {Counter(served)}"
        assert took < 30
    finally:
        stop(joining)
    wait_for(
        lambda: sorted(_gateway_pids(c).values()) == ["node-a", "node-b"],
        "the left node's gateway gone",
        timeout=120,
    )


def test_a_replica_killed_on_the_worker_node_costs_no_request(cluster) -> None:
    # `spread`'s replica on the worker node is supervised by that node's container host: killing
    # the host takes every hosted replica of the node (docs/reliability.md, 'Container hosts'), and
    # `spread`'s callers lose nothing, served by its replica on the head node, until the registry
    # starts the lost ones again on a new host there.
    _, url, _ = cluster
    worker_replica = next(
        r for r in _replicas(url, cluster[0])["spread"] if r["node"] == ["node-b"]
    )
    with Load(url, "spread") as load:
        time.sleep(2)
        # the supervisor of this test's own cluster: a Serve replica or the node's container host
        os.kill(worker_replica["pid"], signal.SIGKILL)
        wait_for(
            lambda: (
                sum(r["state"] == "RUNNING" for r in _replicas(url, cluster[0])["spread"]) == 2
                and worker_replica["pid"]
                not in [r["pid"] for r in _replicas(url, cluster[0])["spread"]]
            ),
            "replaced",
            timeout=180,
        )
        time.sleep(2)
    assert load.failures() == Counter(), load.failures()
    assert len(load.statuses) > 20
    # what else that host held (`on-worker`, whose one replica lives there) serves again too
    wait_for(
        lambda: _invoke(url, "on-worker").status_code == 200, "on-worker served again", timeout=180
    )


def test_the_worker_node_killed_under_load_costs_no_request(cluster) -> None:
    _, url, worker = cluster
    with Load(url, "spread") as load, Load(url, "on-head") as head_load:
        time.sleep(2)
        for process in [
            *psutil.Process(worker.pid).children(recursive=True),
            psutil.Process(worker.pid),
        ]:
            # the node dies at once: raylet, its workers, our replicas and container processes
            process.kill()
        time.sleep(20)  # past the registry's 15 s expiry of replicas nobody hears from
    assert load.failures() == Counter(), load.failures()
    assert head_load.failures() == Counter(), head_load.failures()
    wait_for(
        lambda: _gateways(cluster[0]) == ["node-a"],
        "the lost node's gateway gone, the head's kept",
        timeout=60,
    )
    description = httpx.get(f"{url}/endpoints/mn", timeout=10).json()
    states = {
        c["ContainerHostname"]: (c["Status"], c["CurrentReplicas"])
        for c in description["Containers"]
    }
    assert states["spread"] == ("Updating", 1) and states["on-head"] == ("InService", 1)
    assert states["on-worker"][1] == 0  # nowhere to run until a node with node-b comes back: 429s
    assert _invoke(url, "on-worker").status_code == 429
