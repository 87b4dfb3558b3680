"""Start, watch and stop a container process (`model_server.main`) for a replica's supervisor.

The supervisor binds the data port (loopback, or the node's address on a cluster), and a Unix socket
for the same port for a gateway on this machine (`http.local_socket`), and hands both listening
sockets to the child, which may bind nothing itself. The child is forked from its stack's template
(`forked`) where it may be, or starts fresh as `launcher`; either way it starts in an
environment of the supervisor's allowlist only, confines itself and runs the model server with
the container's environment: its `Environment` (less `protocol.STARTUP_VARIABLES`) plus what Python
needs, with a private scratch folder as HOME and TMPDIR, and nothing else of the supervisor's (no
Ray address or token, no AWS variables of the host). Its sandbox gives it a network namespace of its
own (unless the operator let it reach out: `egress_ports`), lets it read the Python install, this
package, the system's libraries and its own model, and write only its scratch folder (see `sandbox`
for the rest). A MultiModel container's S3 calls are made here for it (`models.s3_broker`), and an
`s3://` SAGEMAKER_SUBMIT_DIRECTORY is fetched and unpacked here before the process starts. No Ray
here.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from serving import s3
from serving.http import local_socket
from serving.model_server import forked, scratch
from serving.model_server.container_config import (
    SANDBOX_MODES,
    ContainerConfig,
    ContainerStartError,
    ContainerStats,
    StartReport,
    child_environment,
    launcher_environment,
    sandbox_paths,
)
from serving.models.s3_broker import S3Broker
from serving.protocol import STATS_PATH, SUBMIT_DIRECTORY_ENV
from serving.trust import hops

logger = logging.getLogger("serving.container_process")

# `-I` keeps the environment's PYTHONPATH out, `-S` site-packages (the launcher needs the standard
# library only); the launcher must still run this very `serving` package (the one the supervisor
# runs, wherever it was imported from), so its folder goes first on the path.
_LAUNCH = "import runpy, sys; sys.path.insert(0, sys.argv[1]); runpy.run_module('serving.model_server.launcher', run_name='__main__')"


# the most a container process's counters and metric events may take: one answer carries at most
# `events.DRAIN_MOST` events, each under 6.2 KB of JSON (a model name is at most 1,024 characters,
# each at most 6 bytes escaped)
MAX_STATS_BYTES = 64 * 1024 * 1024


def log_stream(endpoint: str, hostname: str) -> str | None:
    """Where a container process's output goes, as a caller may be told it (the LogStreamArn of the
    container's errors): `<endpoint>/<hostname>/<file>`, the file behind the stderr it inherits from
    its supervisor (on Ray, the replica worker's `worker-*.err` in the node's session log folder)
    named without its folder, which is a path of the server; None when that is not a file (a
    terminal, a pipe)."""
    try:
        # the descriptor the child inherits, whatever sys.stderr is now
        target = os.readlink("/proc/self/fd/2")
    except OSError:
        return None
    if not (target.startswith("/") and os.path.isfile(target)):
        return None
    return f"{endpoint}/{hostname}/{os.path.basename(target)}"


class ContainerProcess:
    """One container process and its data port, owned by a replica's supervisor."""

    def __init__(self, config: ContainerConfig, bind_host: str) -> None:
        if config.sandbox not in SANDBOX_MODES:
            raise ValueError(
                f"sandbox mode must be one of {', '.join(SANDBOX_MODES)}, not {config.sandbox!r}"
            )
        self.config = config
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.bind((bind_host, 0))
        self.listener.listen(2048)
        host, port = self.listener.getsockname()[:2]
        self.url = (
            f"http://[{host}]:{port}" if family == socket.AF_INET6 else f"http://{host}:{port}"
        )
        # The same port for a gateway on this machine, without TCP (None where no safe folder
        # exists).
        self.unix_listener = local_socket.listen(host, port)
        self.unix_path = (
            self.unix_listener.getsockname() if self.unix_listener is not None else None
        )
        self.scratch = scratch.make(config.hostname)
        self.process: subprocess.Popen | forked.ForkedProcess | None = None
        self.report: StartReport = {}
        self._lifeline_w: int | None = None
        # held by whoever closes the listeners: the watcher or `stop`
        self._released = threading.Lock()
        self._stopping = False

    def _fetch_model(self, url: str) -> Path:
        """A SingleModel's S3 model.tar.gz, fetched here, before the container starts and outside
        its sandbox, as SageMaker's platform fetches it."""
        from serving.models.artifacts import ArtifactError
        from serving.models.sources import ModelStoreError, fetch_archive

        try:
            return fetch_archive(
                url, Path(self.scratch) / "model-data", s3.client_for(self.config.environment)
            )
        except (ArtifactError, ModelStoreError) as error:
            raise ContainerStartError(f"cannot fetch the model: {error}") from None

    def _fetch_submit_directory(self, url: str) -> dict[str, str]:
        """The container's environment with its `s3://` SAGEMAKER_SUBMIT_DIRECTORY fetched and
        unpacked here (its process has no network), named by the folder it unpacked to."""
        from serving.models.artifacts import ArtifactError
        from serving.models.sources import fetch_submit_directory

        try:
            folder = fetch_submit_directory(
                url, Path(self.scratch) / "submit-directory", s3.client_for(self.config.environment)
            )
        except ArtifactError as error:
            raise ContainerStartError(f"container {self.config.hostname}: {error}") from None
        return {**self.config.environment, SUBMIT_DIRECTORY_ENV: str(folder)}

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(
        self, timeout: float | None = None, on_exit: Callable[[int], None] | None = None
    ) -> StartReport:
        """Start the process and wait until it serves (or raise ContainerStartError with its
        reason). Should it exit on its own later, its listeners are closed at once (a connection is
        refused, not left in a backlog nobody accepts from) and `on_exit(exit code)` runs, on a
        thread of its own."""
        if self.config.multi_model is None and (self.config.model_data or "").startswith("s3://"):
            self.config = replace(
                self.config, model_data=str(self._fetch_model(self.config.model_data or ""))
            )
        if self.config.environment.get(SUBMIT_DIRECTORY_ENV, "").startswith("s3://"):
            environment = self._fetch_submit_directory(
                self.config.environment[SUBMIT_DIRECTORY_ENV]
            )
            self.config = replace(self.config, environment=environment)
        status_r, status_w = os.pipe()
        lifeline_r, self._lifeline_w = os.pipe()
        os.set_inheritable(self._lifeline_w, False)
        paths = sandbox_paths(self.config, self.scratch)
        sandbox_policy = {
            "mode": self.config.sandbox,
            **paths,
            "network": "host" if self.config.egress_ports else "isolated",
            "connect_ports": list(self.config.egress_ports),
            "own_port": self.listener.getsockname()[1],
            "shared_fallback": self.config.shared_network,
        }
        broker = None
        if self.config.multi_model is not None and (self.config.model_data or "").startswith(
            "s3://"
        ):
            client = s3.client_for(self.config.environment)
            broker = S3Broker(self.config.model_data or "", client, Path(self.scratch) / "s3")
        document = {
            "endpoint": self.config.endpoint,
            "hostname": self.config.hostname,
            "image": self.config.image,
            "model_data": self.config.model_data,
            "environment": self.config.environment,
            "multi_model": self.config.multi_model,
            "hop_key": self.config.hop_key.hex(),
            "listen_fd": self.listener.fileno(),
            "data_url": self.url,
            "unix_fd": self.unix_listener.fileno() if self.unix_listener is not None else None,
            "status_fd": status_w,
            "scratch": self.scratch,
            "lifeline_fd": lifeline_r,
            "sandbox": sandbox_policy,  # the launcher's
            # the launcher's, for the exec
            "process_environment": child_environment(self.config, self.scratch),
            "s3_broker": list(broker.child_fds) if broker is not None else None,
            "sys_path": [p for p in sys.path if p],
            "log_stream": log_stream(self.config.endpoint, self.config.hostname),
        }
        fds = [
            self.listener.fileno(),
            *([self.unix_listener.fileno()] if self.unix_listener is not None else []),
            status_w,
            lifeline_r,
            *(broker.child_fds if broker is not None else ()),
        ]
        cwd = self.config.working_dir or self.scratch
        try:
            self.process = forked.start(self.config, {**document, "cwd": cwd}, fds) or self._launch(
                document, fds, cwd
            )
        finally:
            os.close(status_w)
            os.close(lifeline_r)
            if broker is not None:
                broker.start()
        try:
            line = _read_line(status_r, timeout)
        finally:
            os.close(status_r)
        if not line:
            code = (
                self.process.wait(timeout=10)
                if self.process.poll() is None
                else self.process.returncode
            )
            raise ContainerStartError(
                f"container {self.config.hostname}: its process exited ({code}) before serving"
                + self._output()
            )
        self.report = json.loads(line)
        if "error" in self.report:
            self.process.wait(timeout=10)
            raise ContainerStartError(self.report["error"] + self._output())
        if not self.report.get("landlock_abi") and self.config.sandbox != "off":
            logger.warning(
                "container %s runs WITHOUT a filesystem sandbox (Landlock unavailable on this kernel): "
                "its model code can read whatever this user can",
                self.config.hostname,
            )
        if (
            self.report.get("network") == "host"
            and not self.config.egress_ports
            and self.config.sandbox != "off"
        ):
            logger.warning(
                "container %s shares the node's network (no network namespace could be made; "
                "--shared-container-network): only Landlock's TCP rules and seccomp wall it off (docs/security.md)",
                self.config.hostname,
            )
        threading.Thread(
            target=self._watch, args=(on_exit,), name="container-watch", daemon=True
        ).start()
        return self.report

    def _launch(self, document: dict, fds: list[int], cwd: str) -> subprocess.Popen:
        """A fresh container process: the launcher, with the document on its stdin."""
        process = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                "-B",
                "-c",
                _LAUNCH,
                str(Path(__file__).resolve().parents[2]),
            ],
            stdin=subprocess.PIPE,
            pass_fds=fds,
            env=launcher_environment(),
            cwd=cwd,
        )
        assert process.stdin is not None
        try:
            # on stdin: never in argv or the environment
            process.stdin.write(json.dumps(document).encode())
            process.stdin.close()
        except BrokenPipeError:  # it exited first: the status pipe says why
            pass
        return process

    def _watch(self, on_exit: Callable[[int], None] | None) -> None:
        assert self.process is not None
        code = self.process.wait()
        if self._stopping:
            return
        logger.warning(
            "container %s: its process exited (%s); closing its data port",
            self.config.hostname,
            code,
        )
        self._release_listeners()
        if on_exit is not None:
            on_exit(code)

    def _release_listeners(self) -> None:
        """Close the data port and its Unix socket (once, whoever asks first)."""
        with self._released:
            # before the TCP port is freed: no new replica
            if self.unix_listener is not None and self.unix_path:
                local_socket.remove(self.unix_listener, self.unix_path)  # can be at this path yet
                self.unix_listener = None
            self.listener.close()

    def stats(self, timeout: float = 5.0) -> ContainerStats:
        """The process's counters and the metric events since the last call."""
        host, _, port = self.url.removeprefix("http://").rpartition(":")
        connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
        try:
            headers = hops.sign(self.config.hop_key, "GET", STATS_PATH, b"", {})
            connection.request("GET", STATS_PATH, headers=headers)
            response = connection.getresponse()
            # the container process runs tenant code: its answer is read to a bound, so that it
            # cannot grow the supervisor, which may serve other containers (`container_host`)
            body = response.read(MAX_STATS_BYTES + 1)
            if len(body) > MAX_STATS_BYTES:
                raise RuntimeError(f"stats answer over {MAX_STATS_BYTES} bytes")
            if response.status != 200:
                raise RuntimeError(f"stats answered {response.status}: {body[:200]!r}")
            return json.loads(body)
        finally:
            connection.close()

    def _output(self) -> str:
        """Where its output went, for a start failure's message (the console and the endpoint's
        failure reason show it): its log stream, if it has one."""
        stream = log_stream(self.config.endpoint, self.config.hostname)
        return f"; its output: {stream}" if stream else ""

    def stop(self, grace_s: float = 15.0) -> None:
        """Ask the process to finish its requests and exit; kill it after `grace_s`; remove its
        files."""
        self._stopping = True
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if self._lifeline_w is not None:
            os.close(self._lifeline_w)
            self._lifeline_w = None
        self._release_listeners()
        shutil.rmtree(self.scratch, ignore_errors=True)


def _read_line(fd: int, timeout: float | None) -> bytes:
    """One line from a pipe, or what arrived before end of file (bounded by `timeout` if given)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        wait = None if deadline is None else max(deadline - time.monotonic(), 0)
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            raise ContainerStartError(f"the container process did not report within {timeout:g} s")
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data.strip()
