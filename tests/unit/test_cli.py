"""serving.cli: what `serving up` refuses or warns about before Ray starts, and `validate` with
identities."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import yaml

from serving.cli import check_anonymous, example_calls, main
from serving.config.spec import load_spec

SECRET = "cli-test-secret-0001"
API_KEY = "cli-test-api-key-0001"


@pytest.fixture
def specs(tmp_path: Path) -> dict[str, Path]:
    """An open spec, a secured one, and the identities file the secured one names."""
    (tmp_path / "model").mkdir()
    (tmp_path / "policy.json").write_text(
        json.dumps({"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})
    )
    (tmp_path / "identities.yaml").write_text(
        yaml.safe_dump(
            {
                "Identities": [
                    {
                        "Principal": "team-a",
                        "AccessKeyId": "AKIACLITEST000001",
                        "SecretAccessKey": SECRET,
                        "PolicyDocuments": ["policy.json"],
                    },
                    {"Principal": "batch", "ApiKey": API_KEY, "PolicyDocuments": ["policy.json"]},
                ]
            }
        )
    )
    containers = [{"ContainerHostname": "a", "Image": "python", "ModelDataUrl": "model"}]
    (tmp_path / "open.yaml").write_text(
        yaml.safe_dump({"EndpointName": "open", "Containers": containers})
    )
    (tmp_path / "secure.yaml").write_text(
        yaml.safe_dump(
            {
                "EndpointName": "secure",
                "Containers": containers,
                "AccessControl": {"IdentitiesFile": "identities.yaml"},
            }
        )
    )
    return {
        "open": tmp_path / "open.yaml",
        "secure": tmp_path / "secure.yaml",
        "identities": tmp_path / "identities.yaml",
    }


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any attempt of `serving up` to go on and start Ray fail at once instead."""
    trap = types.ModuleType("serving.ray_wing")
    trap.__getattr__ = lambda name: pytest.fail(f"serving up went on to serving.ray_wing.{name}")
    monkeypatch.setitem(sys.modules, "serving.ray_wing", trap)
    monkeypatch.setattr("serving.ray_wing", trap, raising=False)


def test_non_loopback_host_without_access_control_exits_2(
    specs, no_ray, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["up", str(specs["open"]), str(specs["secure"]), "--host", "0.0.0.0"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "refusing to serve open without authentication on 0.0.0.0" in error
    assert "--allow-anonymous" in error


@pytest.mark.parametrize(
    ("host", "allow", "fragment"),
    [
        ("127.0.0.1", False, "anyone who can reach this machine"),
        ("localhost", False, "anyone who can reach this machine"),
        ("::1", False, "anyone who can reach this machine"),
        ("0.0.0.0", True, "ANYONE who can reach 0.0.0.0"),
        ("10.1.2.3", True, "ANYONE who can reach 10.1.2.3"),
    ],
)
def test_anonymous_endpoints_are_announced_loudly(
    specs, host: str, allow: bool, fragment: str
) -> None:
    warning = check_anonymous([load_spec(specs["open"]), load_spec(specs["secure"])], host, allow)
    assert "WARNING: no authentication for open:" in warning and fragment in warning


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.com", "::"])
def test_non_loopback_hosts_are_refused(
    specs, host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        check_anonymous([load_spec(specs["open"])], host, False)
    assert exited.value.code == 2


def test_no_warning_when_every_endpoint_has_access_control(specs) -> None:
    assert check_anonymous([load_spec(specs["secure"])], "0.0.0.0", False) is None
    assert (
        check_anonymous(
            [load_spec(specs["open"], identities_file=specs["identities"])], "0.0.0.0", False
        )
        is None
    )


def test_identities_flag_secures_every_spec(
    specs, no_ray, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(specs["open"]), "--identities", str(specs["identities"])]) == 0
    assert "AccessControl: 2 identities (team-a, batch)" in capsys.readouterr().out


def test_validate_reports_a_bad_policy(specs, capsys: pytest.CaptureFixture[str]) -> None:
    specs["identities"].with_name("policy.json").write_text(
        json.dumps({"Statement": [{"Effect": "Allow", "Action": "*"}]})
    )
    with pytest.raises(SystemExit) as exited:
        main(["validate", str(specs["secure"])])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "secure.yaml: INVALID" in error
    assert (
        "Identities[0].PolicyDocuments[0] (policy.json): Statement[0]: exactly one of Resource or NotResource"
        in error
    )


def test_example_calls_for_a_secured_endpoint_show_placeholders_never_secrets(specs) -> None:
    lines = example_calls("http://127.0.0.1:8080", load_spec(specs["secure"]), region="eu-west-1")
    text = "\n".join(lines)
    assert "Authorization: Bearer <ApiKey>" in text and "aws_access_key_id='<AccessKeyId>'" in text
    assert "region_name='eu-west-1'" in text
    assert SECRET not in text and API_KEY not in text


def test_api_settings_flags_override_environment_which_overrides_cli_defaults(
    tmp_path: Path, monkeypatch
) -> None:
    """SERVING_MODEL_ROOTS / SERVING_STATE_FILE hold unless a flag names them (the CLI's defaults
    used to win)."""
    import argparse

    from serving.cli.up import _settings

    def settings(**flags):
        values = {
            "host": None,
            "port": None,
            "state": None,
            "api_identities": None,
            "model_root": None,
            "instance_types": None,
            "allow_anonymous": False,
        }
        return _settings(argparse.Namespace(**{**values, **flags}), None)

    monkeypatch.setenv("SERVING_MODEL_ROOTS", str(tmp_path / "env-root"))
    monkeypatch.setenv("SERVING_STATE_FILE", str(tmp_path / "env.db"))
    assert settings().model_roots == str(tmp_path / "env-root")
    assert settings().state_file == str(tmp_path / "env.db")
    flagged = settings(model_root=[str(tmp_path / "flag-root")], state=str(tmp_path / "flag.db"))
    assert flagged.model_roots == str(tmp_path / "flag-root")
    assert flagged.state_file == str(tmp_path / "flag.db")
    monkeypatch.delenv("SERVING_MODEL_ROOTS")
    monkeypatch.delenv("SERVING_STATE_FILE")
    monkeypatch.chdir(tmp_path)
    defaults = settings(port=18099)
    # no implicit root from the working directory (issue 41, finding 2)
    assert defaults.model_roots == ""
    assert defaults.state_file.endswith("state-18099.db")


def test_a_model_whose_requirements_would_install_packages_exits_2_before_ray(
    specs, no_ray, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = specs["open"].parent / "model" / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("surely-not-installed-pkg==1.0\n")
    monkeypatch.delenv("SERVING_ALLOW_MODEL_REQUIREMENTS", raising=False)
    try:
        status = main(["up", str(specs["open"])])
    except SystemExit as exited:
        status = exited.code
    assert status == 2
    error = capsys.readouterr().err
    assert "refusing to deploy: open: Containers[a].ModelDataUrl" in error
    assert (
        "surely-not-installed-pkg==1.0" in error and "SERVING_ALLOW_MODEL_REQUIREMENTS=1" in error
    )


def test_example_calls_use_each_models_own_input_where_its_model_json_says(tmp_path: Path) -> None:
    # Issue 42, item 8: the digits CNN was shown an iris row. `serving train` writes model.json
    # beside every model.
    from serving.config.spec import parse_spec

    digits, other = tmp_path / "digits", tmp_path / "other"
    digits.mkdir()
    other.mkdir()
    (digits / "model.json").write_text(json.dumps({"signature": {"inputs": [{"shape": [-1, 64]}]}}))
    spec = parse_spec(
        {
            "EndpointName": "e",
            "Containers": [
                {"ContainerHostname": "digits", "Image": "python", "ModelDataUrl": str(digits)},
                {"ContainerHostname": "other", "Image": "python", "ModelDataUrl": str(other)},
            ],
        }
    )
    lines = example_calls("http://127.0.0.1:8080", spec)
    digits_line = next(line for line in lines if "Hostname: digits'" in line)
    assert json.loads(digits_line.split("-d '", 1)[1].rstrip("'")) == [[0.0] * 64]
    other_line = next(line for line in lines if "Hostname: other'" in line)
    assert "[[5.1, 3.5, 1.4, 0.2]]" in other_line  # nothing known: the generic row, as before
