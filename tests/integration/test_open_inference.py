"""The Open Inference Protocol (V2) over REST, driven by Triton's own client (`tritonclient.http`):
health, server and model metadata, infer with JSON and binary tensors on every stack, a Serial
chain, a MultiModel container's models as versions, access policies, errors in the protocol's shape
and the metrics' protocol label. Answers are compared with InvokeEndpoint's for the same rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as triton
from suite import endpoints
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

ENDPOINTS = {
    "it-direct": endpoints.direct,
    "it-serial": endpoints.serial,
    "it-fifteen": endpoints.fifteen,
    "it-multi": endpoints.multi,
    "it-secure": endpoints.secure,
}  # what `server` deploys for this module, by builder

IRIS_ROWS = np.array(
    [[5.1, 3.5, 1.4, 0.2], [7.0, 3.2, 4.7, 1.4], [6.3, 3.3, 6.0, 2.5]], dtype=np.float32
)


@pytest.fixture(scope="module")
def client(server):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=30.0)
    yield client
    client.close()


def infer(
    client,
    model: str,
    rows: np.ndarray,
    *,
    binary: bool = True,
    outputs=None,
    datatype: str = "FP32",
    version: str = "",
    headers=None,
):
    tensor = triton.InferInput("input-0", list(rows.shape), datatype)
    tensor.set_data_from_numpy(rows, binary_data=binary)
    return client.infer(model, [tensor], model_version=version, outputs=outputs, headers=headers)


def test_health_and_server_metadata(server, client) -> None:
    assert client.is_server_live()
    # Ready exactly when /ping is (every endpoint routable): in this shared session another module's
    # it-broken, Failed by design, may be deployed, and then both say why not. (Asked again if an
    # endpoint changed between the two.)
    for _ in range(3):
        ping, ready = server.http.get("/ping"), server.http.get("/v2/health/ready")
        if ping.status_code == ready.status_code:
            break
    assert ready.status_code == ping.status_code
    if ready.status_code == 200:
        assert client.is_server_ready() and ready.json() == {"ready": True}
    else:
        assert ready.status_code == 503 and ready.json()["error"] == ping.json()["message"]
    metadata = client.get_server_metadata()
    assert metadata["name"] == "serving" and "binary_tensor_data" in metadata["extensions"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_sklearn_container_answers_as_invoke_endpoint_does(server, client, binary: bool) -> None:
    result = infer(
        client,
        "it-direct.iris",
        IRIS_ROWS,
        binary=binary,
        outputs=[triton.InferRequestedOutput("output-0", binary_data=binary)],
    )
    invoked = server.client.invoke("it-direct", IRIS_ROWS.tolist(), target="iris")
    assert result.as_numpy("output-0").tolist() == invoked.body == [0, 1, 2]
    assert result.get_output("output-0")["datatype"] == "INT64"


def test_model_metadata_and_readiness_from_the_loaded_model(client) -> None:
    metadata = client.get_model_metadata("it-direct.wine")
    assert metadata["platform"] == "sklearn" and metadata["versions"] == ["1"]
    assert metadata["inputs"] == [{"name": "input-0", "datatype": "FP64", "shape": [-1, 13]}]
    # predict_proba
    assert metadata["outputs"] == [{"name": "output-0", "datatype": "FP64", "shape": [-1, 3]}]
    assert client.is_model_ready("it-direct.wine")
    assert not client.is_model_ready("it-direct.no-such-container")


# Each stack of it-fifteen through Triton's client: metadata from the loaded model, the answer
# InvokeEndpoint gives.
STACKS = {
    "sklearn-iris": "sklearn",
    "pytorch-script": "pytorch",
    "tensorflow-keras": "tensorflow",
    "onnx-iris": "onnx",
    "python-rules": "python",
}


@pytest.mark.parametrize("container", STACKS)
def test_every_stack(server, client, v2_matches, container: str) -> None:
    model = f"it-fifteen.{container}"
    metadata = client.get_model_metadata(model)
    assert metadata["platform"] == STACKS[container]
    if container in ("onnx-iris", "tensorflow-keras", "pytorch-script"):
        assert metadata["inputs"] and metadata["inputs"][0]["shape"][-1] in (4, -1), metadata
    result = infer(client, model, IRIS_ROWS)
    output = result.get_response()["outputs"][0]["name"]
    got = result.as_numpy(output)
    invoked = server.client.invoke("it-fifteen", IRIS_ROWS.tolist(), target=container).body
    assert v2_matches(container, got, invoked), (got, invoked)


def test_serial_chain_is_one_model(server, client) -> None:
    metadata = client.get_model_metadata("it-serial")
    assert metadata["inputs"][0]["shape"] == [-1, 4]  # the first container's
    result = infer(client, "it-serial", IRIS_ROWS[[0, 2]].astype(np.float64), datatype="FP64")
    labels = [item.decode() for item in result.as_numpy("labels").reshape(-1)]
    assert (
        labels
        == server.client.invoke("it-serial", IRIS_ROWS[[0, 2]].tolist()).body["labels"]
        == ["setosa", "virginica"]
    )


def test_int64_input_and_a_requested_output(client) -> None:
    rows = np.array([[5, 3, 1, 0], [6, 3, 6, 2]], dtype=np.int64)
    result = infer(
        client,
        "it-direct.iris",
        rows,
        datatype="INT64",
        outputs=[triton.InferRequestedOutput("output-0")],
    )
    assert result.as_numpy("output-0").tolist() == [0, 2]
    with pytest.raises(InferenceServerException, match="'scores' is not an output"):
        infer(
            client,
            "it-direct.iris",
            rows,
            datatype="INT64",
            outputs=[triton.InferRequestedOutput("scores")],
        )


def test_multimodel_models_are_versions(client) -> None:
    result = infer(client, "it-multi.local", IRIS_ROWS[[0, 2]], version="iris-3.tar.gz")
    assert result.as_numpy("output-0").tolist() == [0, 2]
    with pytest.raises(
        InferenceServerException, match="the model version .* is required: container local"
    ):
        infer(client, "it-multi.local", IRIS_ROWS)


def test_errors_in_the_protocols_shape_and_the_server_keeps_serving(server, client) -> None:
    bad = {"inputs": [{"name": "input-0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3]}]}
    response = server.http.post("/v2/models/it-direct.iris/infer", json=bad)
    assert (
        response.status_code == 400
        and "inputs[0].data: 3 elements given for shape [1, 4]" in response.json()["error"]
    )
    response = server.http.post("/v2/models/no-such-endpoint/infer", json=bad)
    assert response.status_code == 400 and "no-such-endpoint" in response.json()["error"]
    response = server.http.post(
        "/v2/models/it-direct.faulty/infer",
        json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]},
    )
    assert response.status_code == 424 and "faulty" in response.json()["error"]
    assert infer(client, "it-direct.iris", IRIS_ROWS).as_numpy("output-0").tolist() == [0, 1, 2]


def test_access_policies_decide_per_container(client, access_callers) -> None:
    # all-but-special.json
    key = {"Authorization": f"Bearer {access_callers['batch-job']['ApiKey']}"}
    rows = IRIS_ROWS[:1].astype(np.float64)
    assert (
        infer(client, "it-secure.common-wine", np.zeros((1, 13)), datatype="FP64", headers=key)
        .as_numpy("output-0")
        .size
        == 1
    )
    with pytest.raises(
        InferenceServerException, match="not authorized|denied|AccessDenied"
    ) as denied:
        infer(client, "it-secure.special-labels", rows, datatype="FP64", headers=key)
    assert "403" in str(denied.value.status())
    with pytest.raises(InferenceServerException):
        infer(client, "it-secure.common-wine", rows, datatype="FP64")  # no credentials at all
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("it-secure.special-labels", headers=key)


def test_counted_with_the_protocol_label(server, client) -> None:
    def counted() -> float:
        text = server.http.get("/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("serving_invocations_total{")
            and 'endpoint="it-direct"' in line
            and 'container="wine"' in line
            and 'protocol="v2-rest"' in line
        )

    before = counted()
    for _ in range(3):
        infer(client, "it-direct.wine", np.zeros((2, 13)), datatype="FP64")
    assert counted() == before + 3
    assert json.loads(server.http.get("/v2/health/live").text) == {"live": True}


def test_repository_loads_and_unloads_a_multimodel_containers_models_in_every_replica(
    client,
) -> None:
    name = "it-multi.local.iris-7.tar.gz"  # two replicas, three models each at most
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index[name]["state"] == "UNAVAILABLE" and index[name]["reason"] == "not loaded"
    assert "it-multi.cloud.iris-0.tar.gz" in index and not any(
        n.startswith("it-direct") for n in index
    )
    client.load_model(name)
    ready = {
        entry["name"] for entry in client.get_model_repository_index() if entry["state"] == "READY"
    }
    assert name in ready  # in both replicas' caches
    # the repository's name runs it too (version iris-7.tar.gz)
    result = infer(client, name, IRIS_ROWS[[0, 2]])
    assert result.as_numpy("output-0").tolist() == [0, 2]
    client.unload_model(name)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index[name]["state"] == "UNAVAILABLE"
    with pytest.raises(InferenceServerException, match="no-such-model"):
        client.load_model("it-multi.local.no-such-model.tar.gz")
    with pytest.raises(InferenceServerException, match="ModelCacheSetting Disabled"):
        client.load_model("it-multi.once.echo-model")
    with pytest.raises(InferenceServerException, match="not a MultiModel container's model"):
        client.load_model("it-direct.iris")
