"""Another user of the machine, and what the server keeps on disk (issue 41, findings 7a, 7b and
7e).

- 7a: the state file and the control token were opened with O_TRUNC, following links, in whatever
  folder SERVING_STATE_DIR named: a file another user created there first was reused, so the token
  went into a file that user could read. Now the folder must be one no other user can write, and the
  file this user's own.
- 7b: the API's state held callers' Environment secrets in clear, and DescribeModel returned them,
  while the docs said the file held none. Now secret values are sealed, and described as a mask.
- 7e: `serving apply --url` sent the local control token to whatever host the URL named.

The other user is played by uid 65534 (nobody): these tests chown files to it, so they need root, as
CI has.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
from pathlib import Path

import psutil
import pytest
import yaml

from serving.cli import main
from serving.private_files import PrivateFileError, open_private
from serving.sagemaker_api.sealed import MASK
from tests.unit.sagemaker_harness import Harness

OTHER_UID = 65534
as_root = pytest.mark.skipif(
    os.getuid() != 0, reason="plays another user by chown, which needs root"
)


@as_root
def test_a_token_file_another_user_created_first_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    os.chmod(shared, 0o1777)  # like /tmp: anyone may create files
    planted = shared / "control-token-8080"
    planted.write_text("")
    os.chown(planted, OTHER_UID, OTHER_UID)
    os.chmod(planted, 0o666)
    with pytest.raises(PrivateFileError, match="other users"):
        open_private(planted, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    theirs = private / "state.db"
    theirs.write_text("")
    os.chown(theirs, OTHER_UID, OTHER_UID)
    # even in a private folder (root put it there)
    with pytest.raises(PrivateFileError, match="another user"):
        open_private(theirs, os.O_RDWR | os.O_CREAT)
    (private / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PrivateFileError):
        open_private(private / "link", os.O_WRONLY | os.O_CREAT)
    assert not (tmp_path / "elsewhere").exists()


def test_serving_server_refuses_a_state_folder_others_can_write(
    tmp_path: Path, monkeypatch, capsys, no_ray
) -> None:
    monkeypatch.setenv("SERVING_STATE_DIR", str(tmp_path / "private"))
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(SystemExit) as exited:
        main(["server", "--port", "18096", "--state", str(shared / "state.db")])
    assert exited.value.code == 2
    assert "can be written by other users" in capsys.readouterr().err


def test_the_state_keeps_environment_secrets_sealed_and_describes_them_masked(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state" / "api.db"
    secret = "wJalrXUtnFEMI-not-a-real-secret-but-secret-enough"
    harness = Harness(tmp_path, state_file=str(state))
    try:
        harness.model(
            "m1",
            image="python",
            Environment={"AWS_SECRET_ACCESS_KEY": secret, "MODEL_FLAG": "plain"},
        )
        described = harness.sm.describe_model(ModelName="m1")["PrimaryContainer"]["Environment"]
        # before: the secret itself
        assert described == {"AWS_SECRET_ACCESS_KEY": MASK, "MODEL_FLAG": "plain"}
        harness.config("c1", ("A", "m1"))
        harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
        # The container still gets the value: the spec applied carries it in clear.
        applied = harness.deployer.spec("e1@A@1")["Containers"][0]["Environment"]
        assert applied["AWS_SECRET_ACCESS_KEY"] == secret
    finally:
        harness.stop()
    with sqlite3.connect(state) as db:
        stored = " ".join(row[0] for row in db.execute("SELECT document FROM resources"))
    assert "MODEL_FLAG" in stored and secret not in stored  # before: in clear in the file
    assert oct(Path(str(state) + ".key").stat().st_mode & 0o777) == "0o600"
    # A server restarted on the same state and key deploys it with the secret again.
    again = Harness(tmp_path, state_file=str(state))
    try:
        again.api.restore()
        assert (
            again.deployer.spec("e1@A@1")["Containers"][0]["Environment"]["AWS_SECRET_ACCESS_KEY"]
            == secret
        )
    finally:
        again.stop()


def _own_address() -> str | None:
    """An address of this machine's that is not loopback (the test's stand-in for another host)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return None


def test_serving_apply_sends_the_local_token_to_no_other_host(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    address = _own_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    listener = socket.socket()
    listener.bind((address, 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    received: list[bytes] = []

    def accept() -> None:
        listener.settimeout(10)
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection:
            connection.settimeout(5)
            try:
                received.append(connection.recv(65536))
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    monkeypatch.setenv("SERVING_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("SERVING_CONTROL_TOKEN", raising=False)
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / f"control-token-{port}").write_text("local-control-token-never-to-leave")
    (tmp_path / "model").mkdir()
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "EndpointName": "e",
                "Containers": [
                    {
                        "ContainerHostname": "a",
                        "Image": "python",
                        "ModelDataUrl": str(tmp_path / "model"),
                    }
                ],
            }
        )
    )
    try:
        with pytest.raises(SystemExit) as exited:
            main(["apply", str(spec), "--url", f"http://{address}:{port}"])
        assert exited.value.code == 2
        assert "refusing to send" in capsys.readouterr().err
    finally:
        listener.close()
        thread.join(15)
    assert not any(b"local-control-token-never-to-leave" in data for data in received), received
