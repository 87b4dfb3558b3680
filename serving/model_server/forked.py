"""A container process forked from its stack's template (`fork_template`): the supervisor's side.

`start` finds this machine's template for the container's stack (starting it if there is none), and
asks it for a child with the descriptors a fresh process would inherit; it returns None whenever the
container must start fresh instead: templates switched off (the `fork_templates` setting, SERVING_FORK_TEMPLATES=false), a stack
without one, a GPU, an `Environment` naming a variable a framework could read as it is imported
(only SAGEMAKER_*, SERVING_* and AWS_* names are known not to be), or a template that could not
start or fork. The child is not the supervisor's: `ForkedProcess` watches it through its pidfd,
and the template reports its exit status.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from serving.model_server.container_config import ContainerConfig, template_environment
from serving.model_server.fork_template import MAX_FDS, STACK_IMPORTS
from serving.private_files import private_folder

__all__ = ["ForkedProcess", "forkable", "stacks_to_warm", "start", "warm"]

logger = logging.getLogger("serving.container_process")

# Names a container's Environment may hold and still be forked: read by the model server and the
# toolkits as a model loads, by no framework as it is imported.
_NEUTRAL_PREFIXES = ("SAGEMAKER_", "SERVING_", "AWS_")
_TEMPLATE = "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); runpy.run_module('serving.model_server.fork_template', run_name='__main__')"
_START_TIMEOUT_S = 120.0  # a template imports its framework: TensorFlow takes seconds
_ANSWER_TIMEOUT_S = 30.0


def forkable(config: ContainerConfig) -> str | None:
    """Why `config`'s process must start fresh, or None if it may be forked from a template."""
    if not config.fork_template:
        return "fork_templates is off"
    return _unforkable(config.image, config.environment, config.gpus)


def _unforkable(image: str, environment: Mapping[str, str], gpus: float) -> str | None:
    if image not in STACK_IMPORTS:
        return f"no template for the {image} stack"
    if gpus > 0:
        return "a GPU container"
    named = sorted(name for name in environment if not name.startswith(_NEUTRAL_PREFIXES))
    if named:
        return f"its Environment names {', '.join(named[:3])}"
    if not hasattr(os, "pidfd_open") or not sys.platform.startswith("linux"):
        return "no pidfd on this system"
    return None


def stacks_to_warm(containers: Iterable[tuple[str, Mapping[str, str], float]]) -> list[str]:
    """The stacks whose templates these containers (image, environment, GPUs) would fork from."""
    return sorted(
        {image for image, env, gpus in containers if _unforkable(image, env, gpus) is None}
    )


def warm(stack: str) -> bool:
    """Start this machine's template for `stack` ahead of its first container (a server that is
    starting knows its containers' stacks before they are placed); whether one runs. Unused, it
    exits after `fork_template.LINGER_S`."""
    if stack not in STACK_IMPORTS:
        return False
    connection = _template(stack)
    if connection is None:
        return False
    connection.close()
    return True


def _folder() -> Path:
    return private_folder(Path(tempfile.gettempdir()) / f"serving-templates-{os.getuid()}")


def _socket_path(stack: str) -> Path:
    """One template per stack and per code: the interpreter, the `serving` package and the
    environment it starts in (not this process's `sys.path`, which a child extends itself)."""
    root = str(Path(__file__).resolve().parents[2])
    environment = template_environment(str(_folder()))
    key = json.dumps([sys.executable, root, sorted(environment.items())])
    return _folder() / f"{stack}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.sock"


def _connect(path: Path) -> socket.socket | None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.connect(str(path))
    except OSError:
        connection.close()
        return None
    return connection


def _template(stack: str) -> socket.socket | None:
    """A connection to this machine's template for `stack`, started if none runs; None if there
    can be none (the reason is logged once, and kept beside the socket)."""
    path = _socket_path(stack)
    verdict = path.with_suffix(".unavailable")
    if verdict.exists():
        return None
    if (connection := _connect(path)) is not None:
        return connection
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one supervisor starts it; the others then connect
        if (connection := _connect(path)) is not None:
            return connection
        ready_r, ready_w = os.pipe()
        root = str(Path(__file__).resolve().parents[2])
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-B", "-c", _TEMPLATE, root, stack, str(path), str(ready_w)],
                stdin=subprocess.DEVNULL,
                pass_fds=(ready_w,),
                env=template_environment(str(path.parent)),
                cwd=str(path.parent),
                start_new_session=True,  # not in the replica's process group: others fork from it
            )
        finally:
            os.close(ready_w)
        process.wait(timeout=30)  # it forks the template at once and exits: nothing left to reap
        with os.fdopen(ready_r) as ready:
            readable, _, _ = select.select([ready], [], [], _START_TIMEOUT_S)
            line = ready.readline().strip() if readable else "did not start in time"
        if line != "ready":
            logger.warning(
                "no template for the %s stack (%s): its containers start fresh", stack, line
            )
            if line.startswith(("unforkable", "unavailable")):
                verdict.write_text(line + "\n")
            return None
        return _connect(path)


class ForkedProcess:
    """A container process forked from a template, watched like a `subprocess.Popen`."""

    stdin = None

    def __init__(self, connection: socket.socket, pid: int, pidfd: int) -> None:
        self._connection: socket.socket | None = connection  # the template's, for the exit status
        self.pid, self._pidfd = pid, pidfd
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def _exited(self, timeout: float | None) -> bool:
        readable, _, _ = select.select([self._pidfd], [], [], timeout)
        return bool(readable)

    def _collect(self) -> None:
        """Its exit status, from the template (-1 if the template is gone)."""
        with self._lock:
            if self.returncode is not None or self._connection is None:
                return
            code = -1
            with contextlib.suppress(OSError, ValueError, KeyError):
                self._connection.settimeout(5.0)
                code = int(json.loads(self._connection.recv(4096))["exit"])
            self._connection.close()
            self._connection = None
            self.returncode = code

    def poll(self) -> int | None:
        if self.returncode is None and self._exited(0):
            self._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._exited(timeout):
                raise subprocess.TimeoutExpired(f"container process {self.pid}", timeout or 0)
            self._collect()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.close(self._pidfd)


def start(config: ContainerConfig, document: dict, fds: list[int]) -> ForkedProcess | None:
    """`config`'s container process, forked from its stack's template with `fds` (and this process's
    stdout and stderr) under the same numbers, and `document` (the launcher's) as its stdin; None if
    it must start fresh (logged at debug level: `forkable`'s reason, or the template's)."""
    reason = forkable(config)
    if reason is not None:
        logger.debug("container %s starts fresh: %s", config.hostname, reason)
        return None
    if len(fds) + 3 > MAX_FDS:
        return None
    connection = _template(config.image)
    if connection is None:
        return None
    stdin = os.memfd_create("serving-container-launch")
    try:
        os.write(stdin, json.dumps(document).encode())
        os.lseek(stdin, 0, os.SEEK_SET)
        connection.settimeout(_ANSWER_TIMEOUT_S)
        socket.send_fds(
            connection, [json.dumps({"fds": [0, 1, 2, *fds]}).encode()], [stdin, 1, 2, *fds]
        )
        message, pidfds, _, _ = socket.recv_fds(connection, 4096, 1)
        answer = json.loads(message)
        if "pid" not in answer or len(pidfds) != 1:
            raise OSError(answer.get("error", "no child"))
    except (OSError, ValueError) as error:
        logger.warning(
            "container %s starts fresh: its template did not fork (%s)", config.hostname, error
        )
        connection.close()
        return None
    finally:
        os.close(stdin)
    connection.settimeout(None)
    return ForkedProcess(connection, int(answer["pid"]), pidfds[0])
