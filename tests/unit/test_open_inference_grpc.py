"""The V2 gRPC service without Ray: messages built and read by Triton's own gRPC client code
(`tritonclient.grpc`, its own generated classes) against ours, a real plaintext listener answering
real calls, and the checked-in protoc output against what protoc makes of the checked-in .proto."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from serving.errors import ValidationError
from serving.gateway.invocation import Invocations
from serving.gateway.transport import ContainerTransport
from serving.open_inference import codec, grpc_codec
from serving.open_inference import grpc_messages_pb2 as pb
from serving.open_inference.dataplane import OpenInference
from serving.open_inference.grpc_service import GrpcInference
from serving.settings import ServerSettings

PACKAGE = Path(__file__).resolve().parents[2] / "serving" / "open_inference"
ARRAYS = {
    "FP32": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
    "FP16": np.arange(4, dtype=np.float16).reshape(2, 2) / 2,
    "FP64": np.array([[1.5, -2.25]]),
    "INT8": np.array([-3, 7], dtype=np.int8),
    "INT64": np.array([[2**40, -1]], dtype=np.int64),
    "UINT16": np.array([65535, 1], dtype=np.uint16),
    "UINT64": np.array([2**63 + 5], dtype=np.uint64),
    "BOOL": np.array([[True, False]]),
    "BYTES": np.array([b"a", b"", "\u00e9t\u00e9".encode()], dtype=object),
}


def triton_message(arrays: dict[str, tuple[np.ndarray, str]], outputs=None) -> pb.ModelInferRequest:
    """The request Triton's gRPC client sends (raw contents), serialized by its classes and parsed
    by ours."""
    inputs = []
    for name, (array, datatype) in arrays.items():
        tensor = triton.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    request = _get_inference_request(
        "ep.c", inputs, "", "req-1", outputs, 0, False, False, 0, None, None
    )
    return pb.ModelInferRequest.FromString(request.SerializeToString())


@pytest.mark.parametrize("datatype", ARRAYS)
def test_tritons_raw_contents_arrive_and_return_as_sent(datatype: str) -> None:
    array = ARRAYS[datatype]
    request = grpc_codec.infer_request(triton_message({"x": (array, datatype)}))
    ((name, got),) = request.inputs
    assert (
        name == "x"
        and request.id == "req-1"
        and got.shape == array.shape
        and got.tolist() == array.tolist()
    )
    answer = grpc_codec.infer_response(
        "ep.c", "1", request, codec.chosen_outputs("ep.c", request, [("y", got)])
    )
    result = triton.InferResult(service_pb2.ModelInferResponse.FromString(answer))
    assert result.get_output("y").datatype == datatype and result.get_response().id == "req-1"
    assert result.as_numpy("y").tolist() == array.tolist()


@pytest.mark.parametrize(
    "datatype, field, values",
    [
        ("FP32", "fp32_contents", [0.5, 1.5]),
        ("FP64", "fp64_contents", [0.25, 2.0]),
        ("INT32", "int_contents", [-4, 9]),
        ("INT64", "int64_contents", [2**40, 3]),
        ("UINT8", "uint_contents", [255, 0]),
        ("UINT64", "uint64_contents", [7, 8]),
        ("BOOL", "bool_contents", [True, False]),
        ("BYTES", "bytes_contents", [b"x", b"yz"]),
    ],
)
def test_typed_contents_of_every_kind(datatype: str, field: str, values: list) -> None:
    message = pb.ModelInferRequest(model_name="ep")
    tensor = message.inputs.add(name="x", datatype=datatype, shape=[1, 2])
    getattr(tensor.contents, field).extend(values)
    ((_, array),) = grpc_codec.infer_request(message).inputs
    assert array.shape == (1, 2) and array.reshape(-1).tolist() == values


def _message(
    datatype="FP32", shape=(1, 2), field="fp32_contents", values=(1.0, 2.0), raw=None
) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="ep")
    tensor = message.inputs.add(name="x", datatype=datatype, shape=list(shape))
    if raw is None:
        getattr(tensor.contents, field).extend(values)
    else:
        message.raw_input_contents.extend(raw)
    return message


@pytest.mark.parametrize(
    "message, words",
    [
        (
            _message(values=(1.0,)),
            "inputs[0].contents.fp32_contents: 1 elements given for shape [1, 2]",
        ),
        (
            _message(datatype="FP16", field="fp32_contents"),
            "FP16 has no typed contents: send it in raw_input_contents",
        ),
        (_message(datatype="INT8", field="int_contents", values=(300, 1)), "out of INT8's range"),
        (_message(datatype="BF16"), "datatype 'BF16' is not supported"),
        (_message(raw=[b"\0" * 8, b"\0" * 8]), "raw_input_contents: 2 values for 1 inputs"),
        (
            _message(raw=[b"\0" * 4]),
            "raw_input_contents[0]: its binary data is 4 bytes, shape [1, 2] of FP32 needs 8",
        ),
        (pb.ModelInferRequest(model_name="ep"), "inputs: at least one tensor is required"),
    ],
)
def test_malformed_messages_are_refused_naming_the_field(
    message: pb.ModelInferRequest, words: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        grpc_codec.infer_request(message)
    assert words in refused.value.message


def test_bytes_that_are_no_message_are_refused() -> None:
    with pytest.raises(ValidationError, match="the ModelInferRequest message could not be parsed"):
        grpc_codec.parse(pb.ModelInferRequest, b"\xff\xff\xff")


def test_model_metadata_reads_as_tritons() -> None:
    document = {
        "name": "ep.c",
        "versions": ["1"],
        "platform": "onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "INT64", "shape": [-1]}],
    }
    read = service_pb2.ModelMetadataResponse.FromString(grpc_codec.metadata_response(document))
    assert read.name == "ep.c" and read.platform == "onnx" and list(read.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in read.inputs] == [("x", "FP32", [-1, 4])]
    assert [(t.name, t.datatype, list(t.shape)) for t in read.outputs] == [("y", "INT64", [-1])]


def test_a_plaintext_listener_answers_tritons_client_and_refuses_what_it_must() -> None:
    """A real listener over the real pipeline with an empty endpoint table (port 0: the kernel picks
    one)."""

    async def scenario() -> None:
        settings = ServerSettings(port=0, grpc_port=0, max_payload_mb=0.001)
        invocations = Invocations(settings, ContainerTransport(default_limit=4))
        service = GrpcInference(
            OpenInference(invocations, lambda: ["endpoint ep is not routable yet"]), settings
        )
        await service.start()
        assert service.server is not None and service.port
        client = triton_aio.InferenceServerClient(f"127.0.0.1:{service.port}")
        try:
            assert await client.is_server_live() and not await client.is_server_ready()
            assert (await client.get_server_metadata()).name == "serving"
            tensor = triton.InferInput("x", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.zeros((1, 2), dtype=np.float32))
            with pytest.raises(triton.InferenceServerException) as unknown:
                await client.infer("no-such-endpoint.c", [tensor])
            assert str(unknown.value.status()) == "StatusCode.INVALID_ARGUMENT"
            assert "Endpoint no-such-endpoint not found" in unknown.value.message()
            big = triton.InferInput("x", [1, 1000], "FP32")  # 4 kB: over the 1 kB payload limit
            big.set_data_from_numpy(np.zeros((1, 1000), dtype=np.float32))
            with pytest.raises(triton.InferenceServerException) as too_big:
                await client.infer("ep.c", [big])
            assert str(too_big.value.status()) == "StatusCode.RESOURCE_EXHAUSTED"
        finally:
            await client.close()
            await service.stop()

    asyncio.run(scenario())


def test_the_checked_in_protoc_output_is_what_the_proto_makes(tmp_path: Path) -> None:
    root = PACKAGE.parents[1]
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{root}",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        str(PACKAGE / "grpc_messages.proto"),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=60)
    for name in ("grpc_messages_pb2.py", "grpc_messages_pb2.pyi"):
        made = (tmp_path / "serving" / "open_inference" / name).read_text()
        assert made == (PACKAGE / name).read_text(), (
            f"{name} is stale: regenerate it (grpc_messages.proto says how)"
        )
