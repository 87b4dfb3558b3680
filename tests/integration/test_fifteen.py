"""Fifteen containers on one endpoint each answer on their own hostname; a sixteenth is refused."""

from __future__ import annotations

import pytest
from sklearn.datasets import load_iris, load_wine

from serving.spec import SpecError, parse_spec

pytestmark = pytest.mark.integration


def test_fifteen_containers_each_answer(server):
    iris_row, wine_row = load_iris().data[:1].tolist(), load_wine().data[:1].tolist()
    description = server.describe("it-fifteen")
    assert description["EndpointStatus"] == "InService"
    hostnames = [c["ContainerHostname"] for c in description["Containers"]]
    assert len(hostnames) == 15
    for hostname in hostnames:
        kind = hostname.split("-")[0]
        body = {"iris": iris_row, "wine": wine_row, "echo": {"from": hostname}}[kind]
        response = server.invoke("it-fifteen", body, target=hostname)
        assert response.status_code == 200, (hostname, response.text)
        if kind == "echo":
            assert f'\\"from\\": \\"{hostname}\\"' in response.text or hostname in response.json()["body"]
        else:
            assert response.json() == [0]


def test_sixteenth_container_is_refused():
    containers = [{"ContainerHostname": f"c{i}", "Image": "python"} for i in range(16)]
    with pytest.raises(SpecError, match="at most 15 containers"):
        parse_spec({"EndpointName": "too-many", "Containers": containers})
