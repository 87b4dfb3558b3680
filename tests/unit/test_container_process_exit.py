"""A container process that dies on its own gives its port up at once (issue 41, finding 6).

The supervisor bound the data port and holds it: before the fix a killed container process left it
listening, so the kernel queued new connections in a backlog nobody accepted from, and they waited
until Serve replaced the whole replica. Now the supervisor watches its child, closes the port and
its Unix socket when it exits (a connection is then refused, which the gateway retries elsewhere at
once) and tells the replica (`on_exit`).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

import pytest

from serving.model_server.container_config import ContainerConfig
from serving.model_server.supervisor import ContainerProcess


def test_a_killed_container_process_closes_its_port_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(
        "def predict_fn(data, model):\n    return data\n"
    )
    process = ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname="doomed",
            image="python",
            model_data=str(tmp_path),
            environment={},
            hop_key=b"d" * 32,
        ),
        "127.0.0.1",
    )
    exited: list[int] = []
    done = threading.Event()
    try:
        process.start(timeout=60, on_exit=lambda code: (exited.append(code), done.set()))
        host, port = process.url.removeprefix("http://").rsplit(":", 1)
        unix_path = process.unix_path
        os.kill(process.pid, signal.SIGKILL)
        assert done.wait(30), "on_exit was not called"
        assert exited == [-signal.SIGKILL]
        with pytest.raises(ConnectionRefusedError):  # before: accepted into a backlog, then silence
            socket.create_connection((host, int(port)), timeout=5)
        assert unix_path is None or not os.path.exists(unix_path)
    finally:
        process.stop()


def test_a_stopped_container_process_does_not_report_an_exit(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text(
        "def predict_fn(data, model):\n    return data\n"
    )
    process = ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname="calm",
            image="python",
            model_data=str(tmp_path),
            environment={},
            hop_key=b"c" * 32,
        ),
        "127.0.0.1",
    )
    exited: list[int] = []
    process.start(timeout=60, on_exit=exited.append)
    process.stop()
    assert exited == []


def test_a_container_process_whose_supervisor_died_empties_its_scratch_folder(
    tmp_path: Path,
) -> None:
    # Issue 41, finding 7d: a killed supervisor could not remove the scratch folder, which kept the
    # unpacked model.
    import tarfile

    source = tmp_path / "source"
    (source / "code").mkdir(parents=True)
    (source / "code" / "inference.py").write_text("def predict_fn(data, model):\n    return data\n")
    (source / "weights.bin").write_bytes(b"w" * 1024)
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname=".")
    process = ContainerProcess(
        ContainerConfig(
            endpoint="e",
            hostname="orphan",
            image="python",
            model_data=str(archive),
            environment={},
            hop_key=b"o" * 32,
        ),
        "127.0.0.1",
    )
    try:
        process.start(timeout=60)
        assert any(Path(process.scratch).rglob("weights.bin"))  # unpacked there
        os.close(process._lifeline_w)  # what the supervisor's death does to the pipe
        process._lifeline_w = None
        assert process.process is not None
        process.process.wait(timeout=30)
        assert list(Path(process.scratch).rglob("*")) == []
    finally:
        process.stop()
