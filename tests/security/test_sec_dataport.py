"""Container data ports answer only the gateway: every hop must be signed with that container's key.

Before the fix any local process (and, on a cluster, any network peer) could POST /invocations on
a replica's data port and run a container no policy allowed it to. Here the test plays such a
caller against the real replicas of the session's endpoints.
"""

from __future__ import annotations

import time

import httpx
import pytest
import ray
from suite import endpoints

from serving import protocol

pytestmark = pytest.mark.integration

ENDPOINTS = {
    "it-direct": endpoints.direct,
    "it-secure": endpoints.secure,
    "it-broken": endpoints.broken,
}  # what `server` deploys for this module, by builder

BODY = b"[[5.1, 3.5, 1.4, 0.2]]"
# what httpx sends: all of it is signed
JSON = {"content-type": "application/json", "accept": "*/*"}


@pytest.fixture(scope="module")
def replicas(server) -> dict[tuple[str, str], list[str]]:
    from serving import ray_wing

    return ray.get(ray_wing.registry_handle().snapshot.remote(-1), timeout=30)["replicas"]


def _post(url: str, body: bytes = BODY, headers: dict | None = None) -> httpx.Response:
    return httpx.post(
        url + "/invocations", content=body, headers={**JSON, **(headers or {})}, timeout=10
    )


def test_data_ports_listen_on_loopback_in_embedded_mode(replicas) -> None:
    urls = [url for urls in replicas.values() for url in urls]
    assert urls and all(url.startswith("http://127.0.0.1:") for url in urls), urls


def test_unsigned_calls_are_refused_with_403(server, replicas) -> None:
    # it-broken's failed container has none
    live = {key: urls for key, urls in replicas.items() if urls}
    every = {
        (name, c["ContainerHostname"])
        for name in ENDPOINTS
        for c in server.client.describe_endpoint(name)["Containers"]
    }
    assert every - {("it-broken", "broken")} <= set(live), every - set(live)  # each is tried below
    for (endpoint, container), urls in live.items():
        response = _post(urls[0])
        assert response.status_code == 403, (endpoint, container, response.text)
        assert response.json()["__type"] == "AccessDeniedException"


def test_another_containers_key_is_refused(replicas) -> None:
    # A tenant that somehow held its own container's key still cannot call a neighbour with it.
    from serving.ray_wing.operations import root_secret
    from serving.trust import hops, keys

    own_key = keys.hop_key(root_secret(), "it-secure", "common-wine")
    url = replicas[("it-secure", "customIps-iris")][0]
    response = _post(url, headers=hops.sign(own_key, "POST", "/invocations", BODY, JSON))
    assert response.status_code == 403


def test_a_signed_hop_cannot_be_altered_or_replayed_late(replicas) -> None:
    from serving.ray_wing.operations import root_secret
    from serving.trust import hops, keys

    key = keys.hop_key(root_secret(), "it-secure", "customIps-iris")
    url = replicas[("it-secure", "customIps-iris")][0]
    signed = hops.sign(key, "POST", "/invocations", BODY, JSON)
    # the real key works: the refusals below are the checks
    assert _post(url, headers=signed).json() == [0]
    # another body
    assert _post(url, body=b"[[6.7, 3.0, 5.2, 2.3]]", headers=signed).status_code == 403
    retargeted = {**signed, protocol.TARGET_MODEL: "other.tar.gz"}
    assert _post(url, headers=retargeted).status_code == 403  # a header the container acts on
    stale = hops.sign(key, "POST", "/invocations", BODY, JSON, clock=lambda: time.time() - 600)
    assert _post(url, headers=stale).status_code == 403


def test_refused_hops_are_counted(server, replicas) -> None:
    url = replicas[("it-direct", "iris")][0]
    for _ in range(3):
        assert _post(url).status_code == 403
    # the supervisor relays counts every 2 s; Ray exports every 5 s
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = server.http.get("/metrics").text
        counted = [
            line
            for line in text.splitlines()
            if line.startswith("serving_refused_hops_total")
            and 'container="iris"' in line
            and 'endpoint="it-direct"' in line
        ]
        if counted and float(counted[0].rsplit(" ", 1)[1]) >= 3:
            return
        time.sleep(2)
    raise AssertionError(f"refused hops not counted: {counted}")
