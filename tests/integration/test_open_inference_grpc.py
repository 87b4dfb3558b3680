"""The Open Inference Protocol (V2) over gRPC, driven by Triton's own client (`tritonclient.grpc`)
over TLS: health, server and model metadata, infer on every stack, a Serial chain, a MultiModel
container's models as versions, typed contents, bearer keys and Signature V4 in the call's metadata,
policies per container, errors as gRPC statuses and the metrics' protocol label. Answers are
compared with InvokeEndpoint's for the same rows. The session's gRPC port serves TLS
(tests/suite/endpoint_server.py); plaintext is refused there."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from suite import endpoints
from tritonclient.utils import InferenceServerException

from serving.open_inference import grpc_messages_pb2 as pb

pytestmark = pytest.mark.integration

ENDPOINTS = {
    "it-direct": endpoints.direct,
    "it-serial": endpoints.serial,
    "it-fifteen": endpoints.fifteen,
    "it-multi": endpoints.multi,
    "it-secure": endpoints.secure,
}  # what `server` deploys for this module, by builder
SERVICE = "/inference.GRPCInferenceService"
IRIS_ROWS = np.array(
    [[5.1, 3.5, 1.4, 0.2], [7.0, 3.2, 4.7, 1.4], [6.3, 3.3, 6.0, 2.5]], dtype=np.float32
)


@pytest.fixture(scope="module")
def client(server):
    client = triton.InferenceServerClient(
        server.grpc_target, ssl=True, root_certificates=str(server.grpc_ca)
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def channel(server):
    """A plain gRPC channel over the same TLS, for messages Triton's client does not build (typed
    contents, SigV4)."""
    credentials = grpc.ssl_channel_credentials(server.grpc_ca.read_bytes())
    with grpc.secure_channel(server.grpc_target, credentials) as channel:
        yield channel


def infer(
    client,
    model: str,
    rows: np.ndarray,
    *,
    datatype: str = "FP32",
    version: str = "",
    outputs=None,
    headers=None,
):
    tensor = triton.InferInput("input-0", list(rows.shape), datatype)
    tensor.set_data_from_numpy(rows)
    return client.infer(
        model, [tensor], model_version=version, outputs=outputs, headers=headers, client_timeout=30
    )


def status_of(error: InferenceServerException) -> str:
    return str(error.status())


def test_health_and_metadata_over_tls_and_plaintext_is_refused(server, client) -> None:
    assert client.is_server_live()
    # ready exactly when /ping is (asked again if an endpoint changed between the two)
    for _ in range(3):
        ping, ready = server.http.get("/ping").status_code == 200, client.is_server_ready()
        if ping == ready:
            break
    assert ready == ping
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "serving" and "binary_tensor_data" in metadata["extensions"]
    model = client.get_model_metadata("it-direct.wine", as_json=True)
    assert model["platform"] == "sklearn" and model["versions"] == ["1"]
    assert model["inputs"] == [{"name": "input-0", "datatype": "FP64", "shape": ["-1", "13"]}]
    assert client.is_model_ready("it-direct.wine") and not client.is_model_ready(
        "it-direct.no-such-container"
    )
    with grpc.insecure_channel(server.grpc_target) as plain:
        live = plain.unary_unary(f"{SERVICE}/ServerLive")
        with pytest.raises(grpc.RpcError) as refused:
            live(pb.ServerLiveRequest().SerializeToString(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


STACKS = ("sklearn-iris", "pytorch-script", "tensorflow-keras", "onnx-iris", "python-rules")


@pytest.mark.parametrize("container", STACKS)
def test_every_stack_answers_as_invoke_endpoint_does(
    server, client, v2_matches, container: str
) -> None:
    result = infer(client, f"it-fifteen.{container}", IRIS_ROWS)
    output = result.get_response(as_json=True)["outputs"][0]["name"]
    got = result.as_numpy(output)
    invoked = server.client.invoke("it-fifteen", IRIS_ROWS.tolist(), target=container).body
    assert v2_matches(container, got, invoked), (got, invoked)


def test_serial_chain_is_one_model(server, client) -> None:
    result = infer(client, "it-serial", IRIS_ROWS[[0, 2]].astype(np.float64), datatype="FP64")
    labels = [item.decode() for item in result.as_numpy("labels").reshape(-1)]
    assert (
        labels
        == server.client.invoke("it-serial", IRIS_ROWS[[0, 2]].tolist()).body["labels"]
        == ["setosa", "virginica"]
    )


def test_typed_contents_and_requested_outputs(channel, client) -> None:
    request = pb.ModelInferRequest(model_name="it-direct.iris", id="call-7")
    tensor = request.inputs.add(name="input-0", datatype="INT64", shape=[2, 4])
    tensor.contents.int64_contents.extend([5, 3, 1, 0, 6, 3, 6, 2])
    request.outputs.add(name="output-0")
    raw = channel.unary_unary(f"{SERVICE}/ModelInfer")(request.SerializeToString(), timeout=30)
    response = pb.ModelInferResponse.FromString(raw)
    assert response.id == "call-7" and response.model_name == "it-direct.iris"
    assert response.outputs[0].datatype == "INT64" and list(response.outputs[0].shape) == [2]
    assert np.frombuffer(response.raw_output_contents[0], "<i8").tolist() == [0, 2]
    with pytest.raises(InferenceServerException, match="'scores' is not an output") as unknown:
        infer(client, "it-direct.iris", IRIS_ROWS, outputs=[triton.InferRequestedOutput("scores")])
    assert status_of(unknown.value) == "StatusCode.INVALID_ARGUMENT"


def test_multimodel_models_are_versions(client) -> None:
    result = infer(client, "it-multi.local", IRIS_ROWS[[0, 2]], version="iris-3.tar.gz")
    assert result.as_numpy("output-0").tolist() == [0, 2]
    with pytest.raises(
        InferenceServerException, match="the model version .* is required: container local"
    ):
        infer(client, "it-multi.local", IRIS_ROWS)


def test_errors_are_grpc_statuses_and_the_server_keeps_serving(client) -> None:
    bad = triton.InferInput("input-0", [1, 4], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    bad.set_shape([1, 5])  # 16 bytes for a shape that needs 20
    with pytest.raises(InferenceServerException) as malformed:
        client.infer("it-direct.iris", [bad])
    assert (
        status_of(malformed.value) == "StatusCode.INVALID_ARGUMENT"
        and "needs 20" in malformed.value.message()
    )
    with pytest.raises(InferenceServerException) as unknown:
        infer(client, "no-such-endpoint", IRIS_ROWS)
    assert (
        status_of(unknown.value) == "StatusCode.INVALID_ARGUMENT"
        and "no-such-endpoint" in unknown.value.message()
    )
    with pytest.raises(InferenceServerException) as failing:
        infer(client, "it-direct.faulty", IRIS_ROWS)
    assert status_of(failing.value) == "StatusCode.INTERNAL" and "faulty" in failing.value.message()
    assert infer(client, "it-direct.iris", IRIS_ROWS).as_numpy("output-0").tolist() == [0, 1, 2]


def signed(server, method: str, message: bytes, caller: dict) -> list[tuple[str, str]]:
    """The metadata of a call signed with Signature V4 as an HTTP POST to the method's path, over
    its message."""
    request = AWSRequest("POST", f"https://{server.grpc_target}{SERVICE}/{method}", data=message)
    SigV4Auth(
        Credentials(caller["AccessKeyId"], caller["SecretAccessKey"]), "sagemaker", "us-east-1"
    ).add_auth(request)
    return [
        ("host", server.grpc_target),
        *((name.lower(), value) for name, value in request.headers.items()),
    ]


def test_access_policies_decide_per_container(server, client, channel, access_callers) -> None:
    # all-but-special.json
    key = {"authorization": f"Bearer {access_callers['batch-job']['ApiKey']}"}
    wine = np.zeros((1, 13))
    assert (
        infer(client, "it-secure.common-wine", wine, datatype="FP64", headers=key)
        .as_numpy("output-0")
        .size
        == 1
    )
    with pytest.raises(InferenceServerException) as denied:
        infer(
            client,
            "it-secure.special-labels",
            IRIS_ROWS[:1].astype(np.float64),
            datatype="FP64",
            headers=key,
        )
    assert status_of(denied.value) == "StatusCode.PERMISSION_DENIED"
    with pytest.raises(InferenceServerException) as anonymous:
        infer(client, "it-secure.common-wine", wine, datatype="FP64")
    assert status_of(anonymous.value) == "StatusCode.PERMISSION_DENIED"
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("it-secure.special-labels", headers=key)
    # Signature V4 over the serialized message: team-a may run customIps-iris, and a changed message
    # is refused
    request = pb.ModelInferRequest(model_name="it-secure.customIps-iris")
    tensor = request.inputs.add(name="input-0", datatype="FP64", shape=[1, 4])
    tensor.contents.fp64_contents.extend(IRIS_ROWS[0].tolist())
    message = request.SerializeToString()
    call = channel.unary_unary(f"{SERVICE}/ModelInfer")
    metadata = signed(server, "ModelInfer", message, access_callers["team-a"])
    answer = pb.ModelInferResponse.FromString(call(message, metadata=metadata, timeout=30))
    assert np.frombuffer(answer.raw_output_contents[0], "<i8").tolist() == [0]
    tensor.contents.fp64_contents[0] = 7.0
    with pytest.raises(grpc.RpcError) as tampered:
        call(request.SerializeToString(), metadata=metadata, timeout=30)
    assert (
        tampered.value.code() == grpc.StatusCode.PERMISSION_DENIED
        and "signature" in tampered.value.details()
    )


def test_counted_with_the_protocol_label(server, client) -> None:
    def counted() -> float:
        text = server.http.get("/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("serving_invocations_total{")
            and 'endpoint="it-direct"' in line
            and 'container="wine"' in line
            and 'protocol="v2-grpc"' in line
        )

    before = counted()
    for _ in range(3):
        infer(client, "it-direct.wine", np.zeros((2, 13)), datatype="FP64")
    assert counted() == before + 3


def test_repository_over_grpc(client) -> None:
    name = "it-multi.local.iris-8.tar.gz"
    index = {model.name: model for model in client.get_model_repository_index().models}
    assert index[name].state == "UNAVAILABLE"
    client.load_model(name)
    assert {model.name: model for model in client.get_model_repository_index().models}[
        name
    ].state == "READY"
    client.unload_model(name)
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("it-direct.iris")
    assert status_of(refused.value) == "StatusCode.INVALID_ARGUMENT"
