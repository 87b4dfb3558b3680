"""The endpoints several test modules share, one builder each: a function whose parameters name the
session fixtures it is built from, returning its spec document. A module names the ones it uses in
ENDPOINTS (endpoint name -> builder); an endpoint only one module uses is built in that module
instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from suite.endpoint_server import TINY, fails_to_start
from suite.services import AWS_TEST_ENVIRONMENT, S3_BUCKET


def python_container(host: str, handlers: dict[str, Path], handler: str, **extra) -> dict:
    """A container of the Python stack serving one of `suite.handlers.HANDLERS`."""
    return {
        "ContainerHostname": host,
        "Image": "python",
        "ModelDataUrl": str(handlers[handler]),
        **extra,
    }


def sklearn_container(host: str, demo: Path, model: str, **extra) -> dict:
    """A container of the scikit-learn stack serving one of the demo's models."""
    return {
        "ContainerHostname": host,
        "Image": "sklearn",
        "ModelDataUrl": str(demo / model),
        **extra,
    }


def direct(demo_models: Path, handler_models: dict[str, Path]) -> dict:
    """it-direct: six containers of two stacks, Direct; `faulty` always fails, `sleepy` sleeps as
    asked, `narrow` takes one request at a time."""
    sk = lambda host, model, **extra: sklearn_container(host, demo_models, model, **extra)
    py = lambda host, handler, **extra: python_container(host, handler_models, handler, **extra)
    return {
        "EndpointName": "it-direct",
        "Containers": [
            sk("iris", "iris-classifier"),
            sk("wine", "wine-classifier", Environment={"SERVING_SKLEARN_METHOD": "predict_proba"}),
            {
                "ContainerHostname": "labels",
                "Image": "python",
                "ModelDataUrl": str(demo_models / "iris-labels.tar.gz"),
            },
            py("faulty", "faulty"),
            py("sleepy", "sleepy"),
            py("narrow", "sleepy", Environment={"SERVING_MAX_CONCURRENCY": "1"}),
        ],
    }


def single(demo_models: Path) -> dict:
    """it-single: one iris container on two replicas."""
    only = sklearn_container(
        "only", demo_models, "iris-classifier", AutoScaling={"MinCapacity": 2, "MaxCapacity": 2}
    )
    return {"EndpointName": "it-single", "Containers": [only]}


def serial(demo_models: Path) -> dict:
    """it-serial: the demo's Serial chain, preprocess -> classifier -> labels."""
    return {
        "EndpointName": "it-serial",
        "InferenceExecutionConfig": {"Mode": "Serial"},
        "Containers": [
            sklearn_container("preprocess", demo_models, "iris-preprocess"),
            sklearn_container("classifier", demo_models, "iris-on-features"),
            {
                "ContainerHostname": "labels",
                "Image": "python",
                "ModelDataUrl": str(demo_models / "iris-labels.tar.gz"),
            },
        ],
    }


def serial_fail(demo_models: Path, handler_models: dict[str, Path]) -> dict:
    """it-serial-fail: a Serial chain whose second container always fails (the third is never
    reached)."""
    return {
        "EndpointName": "it-serial-fail",
        "InferenceExecutionConfig": {"Mode": "Serial"},
        "Containers": [
            sklearn_container("preprocess", demo_models, "iris-preprocess"),
            python_container("faulty", handler_models, "faulty"),
            python_container("never", handler_models, "echo"),
        ],
    }


@fails_to_start
def broken(handler_models: dict[str, Path]) -> dict:
    """it-broken: one container that never loads its model, so the endpoint settles Failed."""
    containers = [
        python_container("fine", handler_models, "echo"),
        python_container("broken", handler_models, "broken"),
    ]
    return {"EndpointName": "it-broken", "Containers": containers}


def secure(demo_models: Path, identities_file: Path) -> dict:
    """it-secure: Direct, three containers named after the documented example, with
    AccessControl."""
    return {
        "EndpointName": "it-secure",
        "AccessControl": {"IdentitiesFile": str(identities_file)},
        "Containers": [
            {
                "ContainerHostname": "customIps-iris",
                "Image": "sklearn",
                "ModelDataUrl": str(demo_models / "iris-classifier"),
            },
            {
                "ContainerHostname": "common-wine",
                "Image": "sklearn",
                "ModelDataUrl": str(demo_models / "wine-classifier"),
            },
            {
                "ContainerHostname": "special-labels",
                "Image": "python",
                "ModelDataUrl": str(demo_models / "iris-labels.tar.gz"),
            },
        ],
    }


def v2_output_matches(container: str, got, invoked) -> bool:
    """Whether an it-fifteen container's V2 output tensor says what its InvokeEndpoint answer says:
    python-rules' labels as a BYTES tensor, tensorflow-keras' TF Serving `{"predictions": ...}`, the
    others the same numbers."""
    import numpy as np

    if container == "python-rules":
        return [item.decode() for item in got.reshape(-1)] == invoked
    if container == "tensorflow-keras":
        return bool(np.allclose(got, np.asarray(invoked["predictions"]), atol=1e-5))
    return bool(np.allclose(got, np.asarray(invoked), atol=1e-5))


@pytest.fixture(scope="session")
def v2_matches():
    """`v2_matches(container, got, invoked)`: see v2_output_matches."""
    return v2_output_matches


# it-fifteen: three containers of each of the five stacks, one per artifact layout of
# examples/train_hetero.py. Hostname -> (Image, model folder in hetero_models, Environment).
FIFTEEN = {
    "sklearn-features": ("sklearn", "hetero-features", {}),
    "sklearn-iris": ("sklearn", "hetero-iris-sklearn", {}),
    "sklearn-wine": ("sklearn", "hetero-wine-sklearn", {"SERVING_SKLEARN_METHOD": "predict_proba"}),
    "pytorch-script": ("pytorch", "hetero-iris-torchscript", {}),
    # a .pt2 runs code
    "pytorch-export": ("pytorch", "hetero-wine-export", {"SERVING_ALLOW_PICKLE": "true"}),
    "pytorch-state": ("pytorch", "hetero-iris-state", {}),
    "tensorflow-saved": ("tensorflow", "hetero-tf-features", {}),
    "tensorflow-keras": ("tensorflow", "hetero-tf-iris", {}),
    "tensorflow-archive": ("tensorflow", "hetero-tf-wine.tar.gz", {}),
    "onnx-iris": ("onnx", "hetero-onnx-iris", {}),
    "onnx-two": ("onnx", "hetero-onnx-two", {}),
    "onnx-features": ("onnx", "hetero-onnx-features", {}),
    "python-labels": ("python", "hetero-labels", {}),
    "python-wine-labels": ("python", "hetero-wine-labels", {}),
    "python-rules": ("python", "hetero-rules", {}),
}


@pytest.fixture(scope="session")
def fifteen_containers() -> dict[str, tuple[str, str, dict]]:
    """it-fifteen's containers: hostname -> (Image, model folder of hetero_models, Environment)."""
    return FIFTEEN


def fifteen(hetero_models: Path) -> dict:
    """it-fifteen: three containers of each of the five stacks, Direct (FIFTEEN)."""
    containers = [
        {
            "ContainerHostname": host,
            "Image": image,
            "ModelDataUrl": str(hetero_models / model),
            "Environment": environment,
            "Resources": {"Cpus": 0.05},
        }
        for host, (image, model, environment) in FIFTEEN.items()
    ]
    return {"EndpointName": "it-fifteen", "Containers": containers}


def multi(multi_model_prefix: Path, s3_models: str) -> dict:
    """it-multi: MultiModel containers. `local` serves a folder of models through a cache of 3 on
    two replicas; `cloud` the same models from the session's S3 server; `once` loads a model for
    each request (no cache)."""
    return {
        "EndpointName": "it-multi",
        "Containers": [
            {
                "ContainerHostname": "local",
                "Image": "sklearn",
                "Mode": "MultiModel",
                "ModelDataUrl": str(multi_model_prefix),
                "Environment": {"SERVING_MAX_MODELS": "3"},
                "AutoScaling": {"MinCapacity": 2, "MaxCapacity": 2},
                "Resources": TINY,
            },
            {
                "ContainerHostname": "cloud",
                "Image": "sklearn",
                "Mode": "MultiModel",
                "ModelDataUrl": f"s3://{S3_BUCKET}/team-a/",
                "Environment": {
                    **AWS_TEST_ENVIRONMENT,
                    "SERVING_S3_ENDPOINT_URL": s3_models,
                    "SERVING_MAX_MODELS": "3",
                },
                "Resources": TINY,
            },
            {
                "ContainerHostname": "once",
                "Image": "python",
                "Mode": "MultiModel",
                "ModelDataUrl": str(multi_model_prefix),
                "MultiModelConfig": {"ModelCacheSetting": "Disabled"},
                "Resources": TINY,
            },
        ],
    }
