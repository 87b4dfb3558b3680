"""Links in the server's state folder (issue 56, finding 6a).

The API's state was opened as `Path(path).resolve()`, so a link planted at the state path was
followed, and sqlite then opened the path by name again, with its `-wal` / `-shm` / `-journal` files
beside it by name. Now the state path, those siblings and the sealing key `.key` are refused when
they are links, naming the link, and the link's target is left alone; `serving server` refuses to
start on one, and `serving apply` reads no control token through one. Unit-level: a real ApiState
and the real CLI (Ray trapped, never started).
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from serving.cli import main
from serving.private_files import PrivateFileError
from serving.sagemaker_api.database import ApiState


def _private(folder: Path) -> Path:
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o700)
    return folder


@pytest.mark.parametrize("planted", ["", "-wal", "-shm", "-journal"])
def test_a_link_at_the_state_path_or_beside_it_is_refused_and_its_target_untouched(
    tmp_path: Path, planted: str
) -> None:
    state_dir, elsewhere = _private(tmp_path / "state"), _private(tmp_path / "elsewhere")
    victim = elsewhere / "precious.db"
    victim.write_bytes(b"not the server's to write")
    before = victim.stat()
    state = state_dir / "state.db"
    link = Path(f"{state}{planted}")
    link.symlink_to(victim)
    with pytest.raises(PrivateFileError) as refused:
        ApiState(state).close()
    assert str(link) in str(refused.value) and "link" in str(refused.value)
    after = victim.stat()
    assert victim.read_bytes() == b"not the server's to write"
    assert (after.st_size, after.st_mtime_ns, stat.S_IMODE(after.st_mode)) == (
        before.st_size,
        before.st_mtime_ns,
        stat.S_IMODE(before.st_mode),
    )
    # no -wal / -shm beside the target
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious.db"]
    assert link.is_symlink()


def test_a_state_without_links_still_opens_and_keeps_its_documents(tmp_path: Path) -> None:
    state = _private(tmp_path / "state") / "state.db"
    first = ApiState(state)
    first.put("model", "m", {"ModelName": "m"})
    first.close()
    again = ApiState(state)
    try:
        assert again.get("model", "m") == {"ModelName": "m"}
    finally:
        again.close()
    assert stat.S_IMODE(state.stat().st_mode) == 0o600


@pytest.mark.parametrize("planted", ["", ".key"])
def test_serving_server_refuses_a_state_path_or_key_that_is_a_link(
    tmp_path: Path, monkeypatch, capsys, planted: str, no_ray
) -> None:
    monkeypatch.setenv("SERVING_STATE_DIR", str(_private(tmp_path / "tokens")))
    state_dir, elsewhere = _private(tmp_path / "state"), _private(tmp_path / "elsewhere")
    (state_dir / f"state.db{planted}").symlink_to(elsewhere / "theirs")
    with pytest.raises(SystemExit) as exited:
        main(["server", "--port", "18097", "--state", str(state_dir / "state.db")])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert (
        "refusing to start" in error
        and f"{state_dir / 'state.db'}{planted} is a symbolic link" in error
    )
    assert not (elsewhere / "theirs").exists()


def test_serving_apply_reads_no_control_token_through_a_link(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    tokens = _private(tmp_path / "tokens")
    elsewhere = _private(tmp_path / "elsewhere")
    (elsewhere / "credentials").write_text("aws_secret_access_key = not-the-control-token")
    (tokens / f"control-token-{port}").symlink_to(elsewhere / "credentials")
    monkeypatch.setenv("SERVING_STATE_DIR", str(tokens))
    monkeypatch.delenv("SERVING_CONTROL_TOKEN", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:
        with pytest.raises(SystemExit) as exited:
            main(["delete", "anything", "--url", f"http://127.0.0.1:{port}"])
        assert exited.value.code == 2
        assert "is a symbolic link" in capsys.readouterr().err
        # nothing was sent: not the file the link names, not anything
        with pytest.raises(TimeoutError):
            listener.accept()[0].close()
    finally:
        listener.close()


def test_a_link_put_in_place_between_the_check_and_sqlites_open_is_caught(
    tmp_path: Path, monkeypatch
) -> None:
    import serving.sagemaker_api.state_file as state_file

    state_dir, elsewhere = _private(tmp_path / "state"), _private(tmp_path / "elsewhere")
    victim = elsewhere / "precious.db"
    victim.write_bytes(b"not the server's to write")
    real_open = state_file.open_private

    def open_then_swap(path, flags):  # the race: the name changes after it was checked and opened
        descriptor = real_open(path, flags)
        os.rename(path, f"{path}.moved")
        os.symlink(victim, path)
        return descriptor

    monkeypatch.setattr(state_file, "open_private", open_then_swap)
    with pytest.raises(PrivateFileError, match="changed while the server opened it"):
        ApiState(state_dir / "state.db")
    assert victim.read_bytes() == b"not the server's to write"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious.db"]
