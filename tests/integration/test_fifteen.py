"""Fifteen containers of all five stacks on one endpoint each answer correctly; a sixteenth is
refused."""

from __future__ import annotations

import numpy as np
import pytest
from suite import endpoints

from serving.config.spec import SpecError, parse_spec

pytestmark = pytest.mark.integration

ENDPOINTS = {"it-fifteen": endpoints.fifteen}  # what `server` deploys for this module, by builder


def test_fifteen_heterogeneous_containers_are_in_service(server, fifteen_containers) -> None:
    description = server.client.describe_endpoint("it-fifteen")
    assert description["EndpointStatus"] == "InService", description
    containers = {c["ContainerHostname"]: c for c in description["Containers"]}
    assert list(containers) == list(fifteen_containers)
    assert {c["Image"] for c in containers.values()} == {
        "sklearn",
        "pytorch",
        "tensorflow",
        "onnx",
        "python",
    }
    assert all(c["Status"] == "InService" for c in containers.values()), containers


@pytest.mark.parametrize(
    "hostname",
    [
        "sklearn-features",
        "sklearn-iris",
        "sklearn-wine",
        "pytorch-script",
        "pytorch-export",
        "pytorch-state",
        "tensorflow-saved",
        "tensorflow-keras",
        "tensorflow-archive",
        "onnx-iris",
        "onnx-two",
        "onnx-features",
        "python-labels",
        "python-wine-labels",
        "python-rules",
    ],
)
def test_each_container_answers_correctly(
    server, fifteen_containers, hetero_expected, answer_matches, hostname
) -> None:
    image, model, _ = fifteen_containers[hostname]
    expected = hetero_expected[model]
    response = server.client.invoke("it-fifteen", expected["request"], target=hostname)
    assert response.status_code == 200, hostname
    got = response.body
    if image == "tensorflow" and not isinstance(expected["response"], dict):
        # SageMaker's TFS container: a bare JSON list is TF Serving's "instances"
        got = got["predictions"]
    # The same answer the framework gave in the training process...
    assert answer_matches(got, expected["response"]), (hostname, got, expected["response"])
    if expected["classes"]:  # ...and a right one: the probe rows are one of each class
        values = np.asarray(
            got.get("predictions", got.get("outputs")) if isinstance(got, dict) else got
        )
        assert (values.argmax(axis=1) if values.ndim == 2 else values).tolist() == expected[
            "classes"
        ], hostname


def test_sixteenth_container_is_refused():
    containers = [{"ContainerHostname": f"c{i}", "Image": "python"} for i in range(16)]
    with pytest.raises(SpecError, match="at most 15 containers"):
        parse_spec({"EndpointName": "too-many", "Containers": containers})
