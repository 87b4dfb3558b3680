"""What a CreateModel request may make a container read: its model data and nothing outside the model roots.

A container's Environment can widen its sandbox (SERVING_SANDBOX_READ / SERVING_SANDBOX_WRITE) and name a
shared script folder (SAGEMAKER_SUBMIT_DIRECTORY), which the supervisor then lets it read. Through the
control-plane API those settings come from a caller, not the operator: each path must lie in a model root.
"""

from __future__ import annotations

import os

import pytest

from serving.errors import ApiValidationError
from serving.sagemaker_api.shapes import CreateModelInput
from serving.sagemaker_api.translate import check_model


@pytest.fixture
def roots(tmp_path):
    model = tmp_path / "root" / "model" / "code"
    model.mkdir(parents=True)
    (model / "inference.py").write_text("def predict_fn(data, model):\n    return data\n")
    (tmp_path / "outside").mkdir()
    return tmp_path


def request(roots, environment: dict[str, str]) -> CreateModelInput:
    return CreateModelInput.model_validate({"ModelName": "m", "PrimaryContainer": {
        "Image": "python", "ModelDataUrl": str(roots / "root" / "model"), "Environment": environment}})


@pytest.mark.parametrize("variable", ["SERVING_SANDBOX_READ", "SERVING_SANDBOX_WRITE", "SAGEMAKER_SUBMIT_DIRECTORY"])
def test_environment_cannot_open_the_sandbox_outside_the_model_roots(roots, variable):
    with pytest.raises(ApiValidationError) as refused:
        check_model(request(roots, {variable: str(roots / "outside")}), [str(roots / "root")])
    assert f"PrimaryContainer.Environment.{variable}" in refused.value.message
    sneaky = os.pathsep.join([str(roots / "root"), str(roots / "root" / ".." / "outside")])
    with pytest.raises(ApiValidationError):
        check_model(request(roots, {variable: sneaky}), [str(roots / "root")])


@pytest.mark.parametrize("variable", ["SERVING_SANDBOX_READ", "SAGEMAKER_SUBMIT_DIRECTORY"])
def test_environment_paths_inside_the_model_roots_are_kept(roots, variable):
    model = check_model(request(roots, {variable: str(roots / "root" / "model" / "code")}), [str(roots / "root")])
    assert model["containers"][0]["Environment"][variable] == str(roots / "root" / "model" / "code")


def test_submit_directory_inside_the_model_folder_needs_no_root(roots):
    # /opt/ml/model/code is SageMaker's own path for the model's code: the model folder, already readable.
    model = check_model(request(roots, {"SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code"}), [str(roots / "root")])
    assert model["containers"][0]["Environment"]["SAGEMAKER_SUBMIT_DIRECTORY"] == "/opt/ml/model/code"


def _s3_request(environment: dict[str, str], url: str = "s3://private/secrets/model.tar.gz") -> CreateModelInput:
    return CreateModelInput.model_validate({"ModelName": "m", "PrimaryContainer": {
        "Image": "sklearn", "ModelDataUrl": url, "Environment": environment}})


def test_an_s3_object_read_with_the_servers_credentials_must_be_under_an_s3_root(roots):
    # Otherwise any caller could have the server fetch (and its container read) any object its credentials reach.
    with pytest.raises(ApiValidationError) as refused:
        check_model(_s3_request({}), [str(roots / "root")])
    assert "PrimaryContainer.ModelDataUrl" in refused.value.message and "s3:// model roots" in refused.value.message
    with pytest.raises(ApiValidationError):
        check_model(_s3_request({}, "s3://models-evil/x.tar.gz"), ["s3://models"])  # a prefix, not a bucket match
    kept = check_model(_s3_request({}, "s3://models/team/model.tar.gz"), ["s3://models/team"])
    assert kept["containers"][0]["ModelDataUrl"] == "s3://models/team/model.tar.gz"
    own = check_model(_s3_request({"AWS_ACCESS_KEY_ID": "A", "AWS_SECRET_ACCESS_KEY": "B"}), [str(roots / "root")])
    assert own["containers"][0]["ModelDataUrl"] == "s3://private/secrets/model.tar.gz"
