"""Endpoint descriptions, listing and health, read from the running server."""

from __future__ import annotations

import os
import time

import pytest
from suite import endpoints

pytestmark = pytest.mark.integration

ENDPOINTS = {
    "it-direct": endpoints.direct,
    "it-serial": endpoints.serial,
    "it-broken": endpoints.broken,
}  # what `server` deploys for this module, by builder


def test_describe_in_service_endpoint(server):
    description = server.client.describe_endpoint("it-direct")
    assert description["EndpointStatus"] == "InService"
    assert description["FailureReason"] is None
    assert description["InferenceExecutionConfig"] == {"Mode": "Direct"}
    containers = {c["ContainerHostname"]: c for c in description["Containers"]}
    assert list(containers) == ["iris", "wine", "labels", "faulty", "sleepy", "narrow"]
    assert containers["iris"]["Image"] == "sklearn" and containers["labels"]["Image"] == "python"
    for container in containers.values():
        assert container["Status"] == "InService"
        assert container["CurrentReplicas"] == container["DesiredReplicas"] == 1


def test_failed_container_is_named_with_its_reason(server):
    description = server.client.describe_endpoint("it-broken")
    assert description["EndpointStatus"] == "Failed"
    assert (
        "broken" in description["FailureReason"]
        and "weights file is corrupt" in description["FailureReason"]
    )
    containers = {c["ContainerHostname"]: c for c in description["Containers"]}
    assert containers["broken"]["Status"] == "Failed"
    assert "weights file is corrupt" in containers["broken"]["FailureReason"]


def test_list_endpoints(server):
    listing = server.client.list_endpoints()
    statuses = {e["EndpointName"]: e["EndpointStatus"] for e in listing}
    assert statuses["it-serial"] == "InService"
    assert statuses["it-broken"] == "Failed"


def test_describe_unknown_endpoint(server):
    response = server.http.get("/endpoints/nope")
    assert response.status_code == 400
    assert response.json()["__type"] == "ValidationError"


def test_ping_reports_unhealthy_while_an_endpoint_failed(server):
    # it-broken is Failed for the whole session, so the server is not fully healthy.
    assert server.http.get("/ping").status_code == 503


def _own_processes() -> dict[int, tuple[int, str]]:
    """This user's processes: pid → (parent pid, command line)."""
    processes: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                title = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue  # gone meanwhile
        processes[int(entry)] = (parent, title)
    return processes


def _ray_processes() -> dict[int, str]:
    """This user's Ray worker processes (titled `ray::...`: the gateway, replicas, the Serve
    controller) and their children (each replica's container process)."""
    processes = _own_processes()
    workers = {pid for pid, (_, title) in processes.items() if title.startswith("ray::")}
    return {
        pid: title
        for pid, (parent, title) in processes.items()
        if pid in workers or parent in workers
    }


def test_ray_workers_and_container_processes_run_at_normal_niceness(server):
    # Ray's default (RAY_worker_niceness=15) let any ordinary process on the machine take the
    # replicas' CPU first; the embedded server starts them at the niceness it runs at itself.
    processes = _ray_processes()
    assert any(title.startswith("ray::NodeGateway") for title in processes.values()), processes
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    niceness = {}
    for pid, title in processes.items():
        try:
            niceness[pid] = os.getpriority(os.PRIO_PROCESS, pid)
        except OSError:
            continue
    assert [
        f"{pid} {processes[pid][:60]}: {value}" for pid, value in niceness.items() if value != ours
    ] == []


def test_the_embedded_ray_starts_no_head_process_it_never_uses(server):
    # `ray.init` started the dashboard head (with include_dashboard=False only Ray's usage-stats
    # reporter, which the embedded Ray turns off), the autoscaler monitor (a machine's Ray has no
    # nodes to add) and the log monitor (which only forwards workers' output to a driver that does
    # not ask for it): ~180 MiB of Python processes, two of them with a Prometheus port open on
    # every interface. Only Ray processes this test process started (the session's server) count.
    unused = (
        "ray/dashboard/dashboard.py",
        "autoscaler/_private/monitor.py",
        "_private/log_monitor.py",
    )
    processes = _own_processes()
    ours = _started_here(processes)
    started = [
        processes[pid][1][:120] for pid in ours if any(part in processes[pid][1] for part in unused)
    ]
    assert started == []


def test_the_node_agent_runs_in_full(server):
    # The process starting Ray no longer imports the agent's dependencies to learn whether they
    # are installed (`cluster.dashboard_dependency_error`); a wrong answer would have the raylet
    # start the agent `--minimal`, without the metrics export GET /metrics relies on. The raylet's
    # command line carries the agent's.
    processes = _own_processes()
    raylets = [
        processes[pid][1]
        for pid in _started_here(processes)
        if "raylet/raylet " in processes[pid][1]
    ]
    assert len(raylets) == 1, raylets
    assert "dashboard/agent.py" in raylets[0]
    assert "--minimal" not in raylets[0].split()


def _started_here(processes: dict[int, tuple[int, str]]) -> set[int]:
    """This test process and its descendants among `processes` (the session's embedded Ray among
    them)."""
    ours, grew = {os.getpid()}, True
    while grew:
        children = {pid for pid, (parent, _) in processes.items() if parent in ours} - ours
        ours |= children
        grew = bool(children)
    assert any("gcs_server" in processes[pid][1] for pid in ours), "no Ray of this test process"
    return ours


def test_serve_workers_run_without_pandas_or_pyarrow(server):
    # Serve's utilities loaded pandas (~30 MiB and a few tenths of a CPU-second per worker) only for
    # the HTTP proxy this runtime does not run, and Ray loaded pyarrow (~30 MiB) only to register
    # Ray Data's serializers; the embedded Ray runs serving._worker_preload first in every worker.
    serve_workers = {
        pid: title
        for pid, title in _ray_processes().items()
        if title.startswith(
            (
                "ray::ServeReplica",
                "ray::ServeController",
                "ray::Registry",
                "ray::NodeGateway",
                "ray::ContainerHost",
            )
        )
    }
    assert len(serve_workers) > 2, serve_workers
    loaded = []
    for pid, title in serve_workers.items():
        try:
            with open(f"/proc/{pid}/maps") as handle:
                maps = handle.read()
        except OSError:
            continue  # gone meanwhile
        loaded += [f"{title[:60]}: {name}" for name in ("pandas", "pyarrow") if f"/{name}/" in maps]
    assert loaded == []


def test_a_registry_snapshot_waits_for_a_change_and_answers_at_once(server):
    # The gateway's long poll: a snapshot call with the current version waits, and answers as soon
    # as the state changes (here: a replica registration of an endpoint no one routes to), not at
    # the next poll period.
    import ray

    from serving import ray_wing
    from serving.ray_wing.cluster import cluster_secret
    from serving.trust import keys

    registry = ray_wing.registry_handle()
    url, key = "http://127.0.0.1:9", ("long-poll-probe", "probe", "v1")
    proof = keys.registration_proof(cluster_secret(), key[0], key[1], url, key[2])
    for _ in range(20):  # until a second passes with no other change in the session's server
        current = ray.get(registry.snapshot.remote(-1), timeout=30)
        waiting = registry.snapshot.remote(current["version"], 25.0, current["epoch"])
        ready, _ = ray.wait([waiting], timeout=1.0)
        if not ready:
            break
    # the session's other endpoints (autoscalers reporting, replicas coming and going) kept it busy
    if ready:
        pytest.skip(
            "the registry changed every second for 20 s: no quiet window to see a snapshot call wait"
        )
    try:
        registered_at = time.monotonic()
        assert ray.get(registry.register.remote(*key, url, proof), timeout=30) is True
        changed = ray.get(waiting, timeout=30)
        answered_in = time.monotonic() - registered_at
        assert changed is not None and changed["version"] > current["version"]
        assert answered_in < 5.0, answered_in  # at once, not after the 25 s wait
        assert changed["registered"].get(key) == 1
    finally:
        assert ray.get(registry.deregister.remote(url, proof), timeout=30) is True
    assert key not in ray.get(registry.snapshot.remote(-1), timeout=30)["registered"]
