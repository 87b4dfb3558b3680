"""A stack's template process: its framework imported once per machine, container processes forked
from it copy-on-write.

Every container process of one stack imports the same framework: its pages are the same in each,
yet each fresh process builds them again (seconds of CPU, and tens to hundreds of MiB of private
heap). A template imports them once; a container process forked from it shares those pages until it
writes them, and starts without the interpreter's and the framework's start-up.

The first supervisor that needs one starts it (`forked`), in the environment a launcher gets plus
the container defaults: nothing a caller chose. It imports its stack's framework and the model
server, freezes what it built (`gc.freeze`: a child's collections then leave the shared pages
alone), and waits on a Unix socket in a folder only this user can open, refusing a peer of another
user. A request carries file descriptors only, with the number each must have in the child; the
child's stdin is a memfd holding the launcher's document, which this process never reads. For each
request it forks one child, which puts the descriptors in place, closes everything else of the
template's, reseeds its random generators, takes a title naming its container and supervisor, and runs what a fresh container process runs: the
launcher's `confine` (the sandbox, while the child has one thread) and the model server's `main`.
It answers with the child's pidfd, and with its exit status once it is reaped.

A child has one thread, whatever the template had: the native pools some libraries start as they
are imported (OpenBLAS's, jemalloc's background thread) are not copied, and those libraries stop and
restart them around a fork themselves; the stacks named in `STACK_IMPORTS` are the ones whose
containers are tested forked. A template that has a Python thread after its imports (which could
hold a lock the child needs) forks nothing: its containers start fresh. It is nobody's child (Ray
kills a worker's children with it) and exits once it has had no client and no child for `LINGER_S`.
The standard library and `setproctitle` only, besides the imports it exists for.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import re
import select
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from typing import Any

import setproctitle

__all__ = ["LINGER_S", "MAX_FDS", "STACK_IMPORTS", "TITLE", "supervisor_named"]

# What a container of each stack imports as it loads, whatever its model: the framework, and the
# model server. A stack not named here starts every container fresh.
STACK_IMPORTS = {
    "python": (),
    "sklearn": ("sklearn", "joblib"),
    "xgboost": ("xgboost",),
    "lightgbm": ("lightgbm",),
    "onnx": ("onnxruntime",),
    "pytorch": ("torch",),
    "tensorflow": ("tensorflow",),
}
# Imports a stack makes through a function of its own, as its containers make them (skops.io without
# PyTorch: `skops_trust.import_skops`).
_STACK_CALLS = {"sklearn": ("serving.runtimes.skops_trust", "import_skops")}
_SERVER_IMPORTS = (
    "numpy",
    "serving.model_server.main",
    "serving.model_server.app",
    "serving.http.server",
    "serving.models.artifacts",
    "serving.runtimes.base",
    "serving.runtimes.concurrency",
)
# Seconds a template with no client and no child waits for one before it exits.
LINGER_S = 30.0
MAX_FDS = 32  # descriptors one request may carry
# A forked container process's title begins with what a fresh one's command line holds, and ends
# naming the supervisor it serves (`supervisor_named` reads it back).
TITLE = "serving.model_server.main"
_SUPERVISOR = re.compile(r" for supervisor (\d+)\)$")
_REQUEST_BYTES = 4096


def _imports(stack: str) -> None:
    from serving.runtimes import STACK_CLASSES

    for name in (*_SERVER_IMPORTS, *STACK_IMPORTS[stack]):
        importlib.import_module(name)
    importlib.import_module(STACK_CLASSES[stack].split(":")[0])
    if stack in _STACK_CALLS:
        module, function = _STACK_CALLS[stack]
        getattr(importlib.import_module(module), function)()


def _targets(message: bytes, fds: list[int]) -> list[int]:
    """The numbers the child must have the request's descriptors under (ValueError if the request is
    malformed: as many numbers as descriptors, distinct, small, and 0, 1 and 2 among them)."""
    targets = json.loads(message)["fds"]
    if (
        not isinstance(targets, list)
        or len(targets) != len(fds)
        or not all(isinstance(n, int) and 0 <= n < 1024 for n in targets)
        or len(set(targets)) != len(targets)
        or not {0, 1, 2} <= set(targets)
    ):
        raise ValueError("a request names one distinct number under 1024 per descriptor")
    return targets


def supervisor_named(title: str) -> int | None:
    """The supervisor a forked container process's title (its command line) names, or None."""
    found = _SUPERVISOR.search(title.strip())
    return int(found[1]) if found else None


def _place(fds: list[int], targets: list[int]) -> None:
    """Give the child's descriptors their numbers, and close every other descriptor it has."""
    above = max(*targets, *fds) + 1
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, above) for fd in fds]
    keep = set(high)
    for name in os.listdir("/proc/self/fd"):
        number = int(name)
        if number not in keep:
            with contextlib.suppress(OSError):
                os.close(number)
    for fd, target in zip(high, targets, strict=True):
        os.dup2(fd, target)
        os.close(fd)


def _child(fds: list[int], targets: list[int], stack: str, supervisor: int) -> int:
    """The forked child: become a container process, as a fresh one would."""
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)
    _place(fds, targets)
    # The template's state is every sibling's: what is random must not be shared (Python's `random`
    # reseeds itself in a forked child; NumPy's global generator does not).
    if (numpy_random := sys.modules.get("numpy.random")) is not None:
        numpy_random.seed()
    tempfile.tempdir = None  # the container's TMPDIR, not the template's
    document = b""
    while chunk := os.read(0, 1 << 20):
        document += chunk
    config = json.loads(document)
    os.chdir(config.pop("cwd"))
    # what `ps` and the benchmarks see: whose it is, since its parent is the template
    setproctitle.setproctitle(
        f"{TITLE} {config['endpoint']}/{config['hostname']} "
        f"(forked from the {stack} template for supervisor {supervisor})"
    )
    from serving.model_server import launcher, main

    confined = launcher.confine(config)
    if confined is None:
        return 2
    config, environment = confined
    os.environ.clear()
    os.environ.update(environment)
    return main.main(config)


def _fork(connection: socket.socket, stack: str) -> int | None:
    """Fork a child for the request on `connection`; answer with its pid and pidfd. None if the
    request was malformed (answered with the reason)."""
    message, fds, _, _ = socket.recv_fds(connection, _REQUEST_BYTES, MAX_FDS)
    try:
        targets = _targets(message, fds)
    except (ValueError, KeyError, TypeError) as error:
        for fd in fds:
            os.close(fd)
        connection.send(json.dumps({"error": str(error)}).encode())
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            code = _child(fds, targets, stack, _peer(connection)[0])
        except BaseException as error:  # noqa: BLE001 - the child must never return to the loop
            with contextlib.suppress(Exception):
                os.write(2, f"container process: {type(error).__name__}: {error}\n".encode())
        finally:
            os._exit(code if isinstance(code, int) else 1)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    try:
        socket.send_fds(connection, [json.dumps({"pid": pid}).encode()], [pidfd])
    except OSError:
        pass  # the supervisor is gone: the child's lifeline ends it
    finally:
        os.close(pidfd)
    return pid


def _peer(connection: socket.socket) -> tuple[int, int]:
    """The pid and uid of the process at the other end."""
    credentials = connection.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
    )
    pid, uid, _ = struct.unpack("3i", credentials)
    return pid, uid


def _wake_on_child_exit() -> int:
    """A descriptor that becomes readable whenever a child exits (main thread only)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    return wake_r


def serve(
    listener: socket.socket, wake_r: int, stack: str = "python", linger_s: float = LINGER_S
) -> None:
    """Fork a child per request until `linger_s` pass with no client and no child; `wake_r` becomes
    readable when a child exits."""
    clients: dict[socket.socket, int | None] = {}  # connection: its child's pid
    children: dict[int, socket.socket | None] = {}  # pid: the connection waiting for its status
    busy, idle_since = False, time.monotonic()
    while True:
        timeout = None
        if not clients and not children:
            timeout = idle_since + linger_s - time.monotonic()
            if timeout <= 0:
                return
        readers: list[Any] = [listener, wake_r, *clients]
        ready, _, _ = select.select(readers, [], [], timeout)
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
        for ready_one in ready:
            if ready_one is listener:
                connection, _ = listener.accept()
                if _peer(connection)[1] == os.getuid():
                    clients[connection] = None
                else:
                    connection.close()
            elif ready_one in clients:
                connection = ready_one
                if clients[connection] is None:
                    try:
                        pid = _fork(connection, stack)
                    except OSError:
                        pid = None
                    if pid is None:
                        del clients[connection]
                        connection.close()
                    else:
                        clients[connection], children[pid] = pid, connection
                else:  # a supervisor closed its connection: it no longer waits for the status
                    with contextlib.suppress(OSError):
                        connection.recv(1)
                    children[clients.pop(connection)] = None  # type: ignore[index]
                    connection.close()
        _reap(clients, children)
        if clients or children:
            busy = True
        elif busy:  # the last one just left
            busy, idle_since = False, time.monotonic()


def _reap(
    clients: dict[socket.socket, int | None], children: dict[int, socket.socket | None]
) -> None:
    """Collect exited children and tell their supervisors how they ended."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # none left (never expected): their supervisors learn -1
            for connection in children.values():
                if connection is not None:
                    clients.pop(connection, None)
                    connection.close()
            children.clear()
            return
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
            clients.pop(connection, None)
            connection.close()


def main() -> int:
    """`fork_template <stack> <socket path> <ready fd>`: import, then serve. One line on the ready
    descriptor says how it went: `ready`, or why there is no template."""
    stack, path, ready_fd = sys.argv[1], sys.argv[2], int(sys.argv[3])
    # No process's child: Ray kills a worker's children when the worker exits, and the supervisor
    # that started this is one (its session is already its own: no process group's signal either).
    if os.fork() > 0:
        os._exit(0)
    with os.fdopen(ready_fd, "w") as ready:
        try:
            _imports(stack)
        except Exception as error:  # noqa: BLE001 - told to the supervisor, which starts fresh
            ready.write(f"unavailable: {type(error).__name__}: {error}\n")
            return 1
        from serving._gc import freeze_startup_objects

        freeze_startup_objects()
        if (threads := threading.active_count()) != 1:
            ready.write(f"unforkable: {threads} Python threads after importing {stack}\n")
            return 1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(64)
        ready.write("ready\n")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # still remove the socket
    try:
        serve(listener, _wake_on_child_exit(), stack)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
