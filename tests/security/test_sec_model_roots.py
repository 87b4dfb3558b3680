"""No caller widens a sandbox onto code the server runs (issue 41, finding 2).

Before the fix an API caller could set SERVING_SANDBOX_WRITE to any path inside a model root, the
model root was the working directory by default (often a checkout holding `serving/`), and Ray
workers imported `serving` from the driver's working directory: a sandboxed container rewrote
`serving/model_server/supervisor.py` and the next replica ran it as the server's user. Now API
callers cannot widen a sandbox (test_sagemaker_translate.py), no model root is implicit, a root that
holds the package, the Python environment, the state or identities is refused, no container may
write code the server runs, and Ray workers do not import from the driver's directory
(test_sec_ray.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

import serving.model_server
from serving.cli.up import _settings
from serving.model_server.container_config import ContainerConfig, ContainerStartError
from serving.model_server.supervisor import ContainerProcess
from serving.sagemaker_api.model_roots import ModelRootError, check_model_roots
from serving.settings import ServerSettings

PACKAGE = Path(serving.model_server.__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "root",
    [PACKAGE.parent, PACKAGE, Path(sys.prefix), Path(sys.prefix) / "lib"],
    ids=["checkout", "package", "venv", "inside-venv"],
)
def test_a_model_root_holding_the_servers_code_is_refused(root: Path) -> None:
    with pytest.raises(ModelRootError, match="model root"):
        check_model_roots(ServerSettings(model_roots=str(root)))


def test_a_model_root_holding_the_state_or_identities_is_refused(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with pytest.raises(ModelRootError, match="state.db"):
        check_model_roots(
            ServerSettings(model_roots=str(tmp_path), state_file=str(tmp_path / "state.db"))
        )
    with pytest.raises(ModelRootError, match="identities.yaml"):
        check_model_roots(
            ServerSettings(model_roots=str(tmp_path)), (str(tmp_path / "identities.yaml"),)
        )
    check_model_roots(
        ServerSettings(model_roots=str(tmp_path / "models"), state_file=str(tmp_path / "state.db"))
    )


def test_no_model_root_is_implicit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVING_MODEL_ROOTS", raising=False)
    monkeypatch.chdir(PACKAGE.parent)  # a checkout: once the default root, holding `serving/`
    flags = {
        "host": None,
        "port": 18098,
        "state": str(tmp_path / "s.db"),
        "api_identities": None,
        "model_root": None,
        "instance_types": None,
        "allow_anonymous": False,
    }
    assert _settings(argparse.Namespace(**flags), None).model_roots == ""


def test_serving_server_refuses_a_root_holding_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from serving.cli import main

    monkeypatch.setenv("SERVING_STATE_DIR", str(tmp_path))
    assert main(["server", "--port", "18097", "--model-root", str(PACKAGE.parent)]) == 2


def test_a_container_may_not_write_the_servers_code(tmp_path: Path) -> None:
    # The operator's own spec, or a state file of an older version: refused where the sandbox is
    # built.
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(
        "def predict_fn(data, model):\n    return data\n"
    )
    for target in (PACKAGE / "model_server", Path(sys.prefix)):
        process = ContainerProcess(
            ContainerConfig(
                endpoint="e",
                hostname="writer",
                image="python",
                model_data=str(tmp_path),
                hop_key=b"w" * 32,
                environment={"SERVING_SANDBOX_WRITE": str(target)},
            ),
            "127.0.0.1",
        )
        try:
            with pytest.raises(ContainerStartError, match="may not write it"):
                process.start(timeout=60)
        finally:
            process.stop()
