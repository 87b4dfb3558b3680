"""Target tracking on real Ray Serve: a load step on one container of it-scale scales that container
out (and only it), then back in once the load falls, with no failed request throughout.

it-scale's containers track 120 invocations per replica per minute (1..3 replicas, cooldowns 5 s
out, 10 s in; Serve gets metrics every 2 s, averaged over 10 s). 5 requests/s on `busy` is 300 per
minute: 3 replicas. Then a trickle of 0.5/s (30 per minute, 10 per replica) takes it back to 1.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
import ray
from suite.endpoint_server import TINY
from suite.endpoints import python_container
from suite.processes import CONTAINER_HOST, SERVE_REPLICA, supervisor_of, title

pytestmark = pytest.mark.integration

# it-scale: two containers with the same short-cooldown target tracking; the autoscaling test loads
# one.
SCALE_TARGET_PER_MINUTE = 120


def scaled(handler_models: dict[str, Path]) -> dict:
    """it-scale: two containers with the same short-cooldown target tracking; the tests load one."""
    policy = {
        "MinCapacity": 1,
        "MaxCapacity": 3,
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": SCALE_TARGET_PER_MINUTE,
            "ScaleOutCooldown": 5,
            "ScaleInCooldown": 10,
        },
    }
    containers = [
        python_container(name, handler_models, "echo", Resources=TINY, AutoScaling=policy)
        for name in ("busy", "quiet")
    ]
    return {"EndpointName": "it-scale", "Containers": containers}


ENDPOINTS = {"it-scale": scaled}  # what `server` deploys for this module, by builder

ENDPOINT = "it-scale"
STEP_TIMEOUT_S = 150  # replicas start on 2 CPUs shared with the whole session


class Load:
    """Requests to one container at a fixed pace on a thread, every answer's status kept."""

    def __init__(self, url: str, container: str) -> None:
        self.url, self.container = url, container
        self.interval = 0.2
        self.statuses: list[int] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    response = client.post(
                        f"/endpoints/{ENDPOINT}/invocations",
                        content=b'{"x": 1}',
                        headers={
                            "Content-Type": "application/json",
                            "X-Amzn-SageMaker-Target-Container-Hostname": self.container,
                        },
                    )
                    self.statuses.append(response.status_code)
                    if response.status_code != 200:
                        self.failures.append(response.text[:300])
                except httpx.HTTPError as error:
                    self.failures.append(repr(error))
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))


def containers(server) -> dict[str, dict]:
    return {
        c["ContainerHostname"]: c for c in server.client.describe_endpoint(ENDPOINT)["Containers"]
    }


def wait_for_replicas(server, container: str, count: int, load: Load) -> float:
    started = time.monotonic()
    while time.monotonic() - started < STEP_TIMEOUT_S:
        current = containers(server)[container]
        if current["CurrentReplicas"] == count and current["DesiredReplicas"] == count:
            return time.monotonic() - started
        assert not load.failures, load.failures[:3]
        time.sleep(1)
    pytest.fail(
        f"{container} did not reach {count} replicas in {STEP_TIMEOUT_S} s: {server.client.describe_endpoint(ENDPOINT)}"
    )


def registered(container: str) -> list[str]:
    """The data ports of a container's replicas in the registry's routing table."""
    from serving import ray_wing

    snapshot = ray.get(ray_wing.registry_handle().snapshot.remote(-1), timeout=30)
    return snapshot["replicas"].get((ENDPOINT, container), [])


def test_a_load_step_scales_that_container_out_and_back_in_without_failures(server) -> None:
    assert containers(server)["busy"]["CurrentReplicas"] == 1
    with Load(server.url, "busy") as load:
        scale_out_s = wait_for_replicas(server, "busy", 3, load)
        # only the loaded container scaled
        assert containers(server)["quiet"]["CurrentReplicas"] == 1
        # ... on its node's container host, by the registry's target tracking: no Serve replica
        urls = registered("busy")
        assert len(urls) == 3
        assert all(title(supervisor_of(url)).startswith(CONTAINER_HOST) for url in urls)
        assert not [
            p.pid for p in psutil.process_iter() if title(p).startswith(SERVE_REPLICA + ENDPOINT)
        ]
        load.interval = 2.0  # a trickle: 30 per minute in all, 10 per replica of 3
        scale_in_s = wait_for_replicas(server, "busy", 1, load)
        time.sleep(2)
    assert load.failures == [], load.failures[:5]
    # the load ran throughout: 5/s until three replicas served (metrics every 2 s: seconds at the
    # least), then the trickle until one. How many in all depends on how fast replicas start: a
    # hosted one serves in a fraction of a second (50 in 26 s, where Serve replicas took longer).
    assert len(load.statuses) >= 25 and set(load.statuses) == {200}
    description = server.client.describe_endpoint(ENDPOINT)
    activities = description["ScalingActivities"]  # newest first
    assert {a["ContainerHostname"] for a in activities} == {"busy"}, activities
    assert activities[0]["To"] == 1 and activities[0]["From"] > 1, activities
    assert max(a["To"] for a in activities) == 3
    out = [a for a in activities if a["To"] > a["From"]]
    assert out and all(
        a["MetricName"] == "SageMakerVariantInvocationsPerInstance" and a["MetricValue"] > 120
        for a in out
    ), out
    assert all(a["Reason"] for a in activities)
    metrics = server.http.get("/metrics").text
    assert 'serving_desired_replicas{container="busy",endpoint="it-scale"} 1.0' in metrics
    assert 'serving_desired_replicas{container="quiet",endpoint="it-scale"} 1.0' in metrics
    print(
        f"scale-out to 3 in {scale_out_s:.0f} s, back to 1 in {scale_in_s:.0f} s; {len(load.statuses)} requests"
    )
