"""Direct and Serial invocation through real Ray Serve replicas over loopback HTTP."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_iris, load_wine
from suite import endpoints
from suite.endpoints import python_container

pytestmark = pytest.mark.integration


def handoff(handler_models: dict[str, Path]) -> dict:
    """it-handoff: a Serial chain whose first container answers CSV whatever it gets, the second
    echoes it."""
    return {
        "EndpointName": "it-handoff",
        "InferenceExecutionConfig": {"Mode": "Serial"},
        "Containers": [
            python_container("first", handler_models, "to-csv"),
            python_container("second", handler_models, "echo"),
        ],
    }


ENDPOINTS = {
    "it-direct": endpoints.direct,
    "it-single": endpoints.single,
    "it-serial": endpoints.serial,
    "it-handoff": handoff,
}  # what `server` deploys for this module, by builder

IRIS = load_iris()
WINE = load_wine()


def test_direct_routes_to_each_named_container(server):
    iris = server.client.invoke("it-direct", IRIS.data[[0, 60, 120]].tolist(), target="iris")
    assert iris.status_code == 200
    assert iris.body == [0, 1, 2]
    assert iris.headers["x-amzn-invoked-production-variant"] == "AllTraffic"

    wine = server.client.invoke("it-direct", WINE.data[:2].tolist(), target="wine")
    assert wine.status_code == 200
    probabilities = np.array(wine.body)
    assert probabilities.shape == (2, 3) and np.allclose(probabilities.sum(axis=1), 1.0)

    labels = server.client.invoke("it-direct", [0, 2], target="labels")
    assert labels.body == {"labels": ["setosa", "virginica"]}


def test_single_container_endpoint_needs_no_target_header(server):
    response = server.client.invoke("it-single", IRIS.data[:1].tolist())
    assert response.status_code == 200 and response.body == [0]


def test_fixed_replica_count_serves_from_every_replica(server):
    container = server.client.describe_endpoint("it-single")["Containers"][0]
    assert container["DesiredReplicas"] == container["CurrentReplicas"] == 2
    answers = [
        server.client.invoke("it-single", IRIS.data[i : i + 1].tolist()).body
        for i in (0, 50, 100) * 4
    ]
    assert answers == [[0], [1], [2]] * 4


@pytest.mark.parametrize(
    "content_type, body",
    [
        ("text/csv", b"5.1,3.5,1.4,0.2\n6.7,3.0,5.2,2.3\n"),
        ("application/x-npy", None),
        (
            "application/json",
            json.dumps({"instances": [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]}).encode(),
        ),
    ],
)
def test_content_types_are_decoded(server, content_type, body):
    if body is None:
        buffer = io.BytesIO()
        np.save(buffer, np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]))
        body = buffer.getvalue()
    response = server.client.invoke("it-single", body, content_type=content_type)
    assert response.status_code == 200
    assert response.body == [0, 2]


@pytest.mark.parametrize(
    "accept, expected_type", [("text/csv", "text/csv"), ("application/x-npy", "application/x-npy")]
)
def test_accept_selects_the_response_encoding(server, accept, expected_type):
    response = server.client.invoke("it-single", [[5.1, 3.5, 1.4, 0.2]], accept=accept)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith(expected_type)
    if expected_type == "text/csv":
        assert response.body.strip() == "0"
    else:
        assert np.load(io.BytesIO(response.raw)).tolist() == [0]


def test_serial_chain_runs_every_container_in_order(server):
    rows = IRIS.data[[0, 60, 120]].tolist()
    response = server.client.invoke("it-serial", rows)
    assert response.status_code == 200
    assert response.body == {"labels": ["setosa", "versicolor", "virginica"]}


def test_serial_hands_off_body_and_content_type(server):
    response = server.client.invoke(
        "it-handoff", b"ignored", content_type="application/octet-stream"
    )
    assert response.status_code == 200
    received = response.body
    assert received["content_type"] == "text/csv"
    assert received["body"] == "1.0,2.0\n3.0,4.0\n"


def test_custom_attributes_reach_the_container_and_come_back(server):
    response = server.client.invoke(
        "it-serial", IRIS.data[:2].tolist(), custom_attributes="trace-id=abc"
    )
    assert response.status_code == 200
    assert response.headers["x-amzn-sagemaker-custom-attributes"] == "trace-id=abc;labelled=2"


def test_the_gateway_reaches_a_replica_on_its_machine_over_the_unix_socket(server):
    # hop_unix_socket is on by default: each container process accepts the gateway's hops on the
    # Unix socket beside its data port (serving.http.local_socket), and none of them on its TCP
    # port.
    import psutil
    import ray

    from serving import ray_wing
    from serving.http import local_socket

    for _ in range(3):
        assert server.client.invoke("it-single", IRIS.data[:1].tolist()).status_code == 200
    snapshot = ray.get(ray_wing.registry_handle().snapshot.remote(-1), timeout=30)
    urls = snapshot["replicas"][("it-single", "only")]
    seen_unix = 0
    for url in urls:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        path = local_socket.path_for(host, int(port))
        assert path is not None
        holders = [
            c.pid
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == int(port) and c.pid
        ]
        container = next(
            psutil.Process(pid)
            for pid in holders
            if "serving.model_server.main" in " ".join(psutil.Process(pid).cmdline())
        )
        tcp_in = [
            c
            for c in container.net_connections("tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == int(port)
        ]
        unix_in = [c for c in container.net_connections("unix") if c.laddr == path]
        assert not tcp_in, tcp_in
        seen_unix += len(unix_in) - 1  # the listening socket has the path too
    assert seen_unix >= 1
