"""MultiModel containers on real Ray Serve: a folder prefix and an S3 prefix, TargetModel routing,
the LRU cache cycling more models than it holds, and the errors a caller can cause."""

from __future__ import annotations

import pytest
from suite import endpoints

from serving.client import ValidationError

pytestmark = pytest.mark.integration

ENDPOINTS = {
    "it-direct": endpoints.direct,
    "it-multi": endpoints.multi,
}  # what `server` deploys for this module, by builder

ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]


def invoke(server, container: str, model: str | None, body=ROWS):
    return server.client.invoke("it-multi", body, target=container, model=model)


def test_the_endpoint_is_in_service(server) -> None:
    description = server.client.describe_endpoint("it-multi")
    assert description["EndpointStatus"] == "InService", description
    assert {c["ContainerHostname"]: c["Mode"] for c in description["Containers"]} == {
        "local": "MultiModel",
        "cloud": "MultiModel",
        "once": "MultiModel",
    }


@pytest.mark.parametrize("container", ["local", "cloud"])
def test_more_models_than_the_cache_holds(server, multi_model_prefix, container: str) -> None:
    # 12 models through caches of 3: every one loads, answers, and is evicted again, twice over.
    models = sorted(path.name for path in multi_model_prefix.glob("iris-*.tar.gz"))
    assert len(models) == 12
    for _ in range(2):
        for model in models:
            response = invoke(server, container, model)
            assert response.status_code == 200
            assert response.body == [0, 2]


def test_folder_model_and_disabled_cache(server) -> None:
    for container in ("local", "once"):
        response = invoke(server, container, "echo-model", body=[1, 2])
        assert response.status_code == 200
    assert invoke(server, "once", "echo-model", body=[3]).body == {
        "model": "echo-model",
        "input": [3],
    }


@pytest.mark.parametrize(
    ("container", "model", "words"),
    [
        ("local", None, ["Target-Model is required", "local"]),
        ("local", "../iris-0.tar.gz", ["TargetModel '../iris-0.tar.gz' is invalid", ".."]),
        ("local", "nosuch.tar.gz", ["nosuch.tar.gz", "not found"]),
        ("cloud", "nosuch.tar.gz", ["nosuch.tar.gz", "not found"]),
    ],
)
def test_bad_target_model_is_a_validation_error(server, container, model, words) -> None:
    with pytest.raises(ValidationError) as raised:
        invoke(server, container, model)
    response = raised.value
    assert response.status_code == 400, response
    assert response.body["__type"] == "ValidationError"
    for word in words:
        assert word in response.body["message"]
    assert invoke(server, container, "iris-1.tar.gz").status_code == 200  # still serving


def test_target_model_on_a_single_model_container(server) -> None:
    with pytest.raises(ValidationError) as raised:
        server.client.invoke("it-direct", ROWS, target="iris", model="iris-0.tar.gz")
    response = raised.value
    assert (
        response.status_code == 400
        and "only valid for MultiModel containers" in response.body["message"]
    )
