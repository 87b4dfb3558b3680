"""What a CreateModel request may make a container read: its model data and nothing outside the
model roots.

A spec's container Environment can widen its sandbox (SERVING_SANDBOX_READ / SERVING_SANDBOX_WRITE)
and name a shared script folder (SAGEMAKER_SUBMIT_DIRECTORY), which the supervisor then lets it
read. Through the control-plane API those settings come from a caller, not the operator: the first
two are refused, the folder (or `sourcedir.tar.gz`) must lie in a model root, an `s3://` one under an
s3:// root unless the container brings its own credentials.
"""

from __future__ import annotations

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
    return CreateModelInput.model_validate(
        {
            "ModelName": "m",
            "PrimaryContainer": {
                "Image": "python",
                "ModelDataUrl": str(roots / "root" / "model"),
                "Environment": environment,
            },
        }
    )


def test_a_shared_script_folder_must_lie_in_the_model_roots(roots):
    variable = "SAGEMAKER_SUBMIT_DIRECTORY"
    with pytest.raises(ApiValidationError) as refused:
        check_model(request(roots, {variable: str(roots / "outside")}), [str(roots / "root")])
    assert f"PrimaryContainer.Environment.{variable}" in refused.value.message
    with pytest.raises(ApiValidationError):
        check_model(
            request(roots, {variable: str(roots / "root" / ".." / "outside")}),
            [str(roots / "root")],
        )
    inside = str(roots / "root" / "model" / "code")
    assert (
        check_model(request(roots, {variable: inside}), [str(roots / "root")])["containers"][0][
            "Environment"
        ][variable]
        == inside
    )


@pytest.mark.parametrize("variable", ["SERVING_SANDBOX_READ", "SERVING_SANDBOX_WRITE"])
def test_an_api_caller_cannot_widen_the_sandbox_at_all(roots, variable):
    # Issue 41, finding 2: a caller pointed SERVING_SANDBOX_WRITE at the `serving` package inside a
    # model root (the working directory by default), and the next replica ran what its container
    # wrote. Even a path inside the model roots is refused now.
    for path in (str(roots / "outside"), str(roots / "root" / "model" / "code")):
        with pytest.raises(ApiValidationError) as refused:
            check_model(request(roots, {variable: path}), [str(roots / "root")])
        assert f"PrimaryContainer.Environment.{variable}" in refused.value.message
        assert "only by the operator" in refused.value.message


def test_submit_directory_inside_the_model_folder_needs_no_root(roots):
    # /opt/ml/model/code is SageMaker's own path for the model's code: the model folder, already
    # readable.
    model = check_model(
        request(roots, {"SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code"}), [str(roots / "root")]
    )
    assert (
        model["containers"][0]["Environment"]["SAGEMAKER_SUBMIT_DIRECTORY"] == "/opt/ml/model/code"
    )


def _s3_request(
    environment: dict[str, str], url: str = "s3://private/secrets/model.tar.gz"
) -> CreateModelInput:
    return CreateModelInput.model_validate(
        {
            "ModelName": "m",
            "PrimaryContainer": {
                "Image": "sklearn",
                "ModelDataUrl": url,
                "Environment": environment,
            },
        }
    )


def test_an_s3_object_read_with_the_servers_credentials_must_be_under_an_s3_root(roots):
    # Otherwise any caller could have the server fetch (and its container read) any object its
    # credentials reach.
    with pytest.raises(ApiValidationError) as refused:
        check_model(_s3_request({}), [str(roots / "root")])
    assert (
        "PrimaryContainer.ModelDataUrl" in refused.value.message
        and "s3:// model roots" in refused.value.message
    )
    with pytest.raises(ApiValidationError):
        # a prefix, not a bucket match
        check_model(_s3_request({}, "s3://models-evil/x.tar.gz"), ["s3://models"])
    kept = check_model(_s3_request({}, "s3://models/team/model.tar.gz"), ["s3://models/team"])
    assert kept["containers"][0]["ModelDataUrl"] == "s3://models/team/model.tar.gz"
    own = check_model(
        _s3_request({"AWS_ACCESS_KEY_ID": "A", "AWS_SECRET_ACCESS_KEY": "B"}), [str(roots / "root")]
    )
    assert own["containers"][0]["ModelDataUrl"] == "s3://private/secrets/model.tar.gz"


def test_an_s3_sourcedir_read_with_the_servers_credentials_must_be_under_an_s3_root(roots):
    # The supervisor fetches and unpacks an s3:// SAGEMAKER_SUBMIT_DIRECTORY as it does model data:
    # with the server's credentials unless the container brings its own, so under the same rule.
    variable = "SAGEMAKER_SUBMIT_DIRECTORY"
    secret = {variable: "s3://private/secrets/sourcedir.tar.gz"}
    with pytest.raises(ApiValidationError) as refused:
        check_model(request(roots, secret), [str(roots / "root"), "s3://models/team"])
    assert f"PrimaryContainer.Environment.{variable}" in refused.value.message
    assert "s3:// model roots (s3://models/team/)" in refused.value.message
    kept = {variable: "s3://models/team/job/sourcedir.tar.gz"}
    model = check_model(request(roots, kept), [str(roots / "root"), "s3://models/team"])
    assert model["containers"][0]["Environment"] == kept
    own = {**secret, "AWS_ACCESS_KEY_ID": "A", "AWS_SECRET_ACCESS_KEY": "B"}
    check_model(request(roots, own), [str(roots / "root")])
    # a local sourcedir.tar.gz is held to the model roots as a folder is
    with pytest.raises(ApiValidationError):
        check_model(
            request(roots, {variable: str(roots / "outside" / "sourcedir.tar.gz")}),
            [str(roots / "root")],
        )
