"""The container process: one model (or a MultiModel container's models) on a data port, with no
Ray.

Started by a container replica's supervisor (`supervisor.ContainerProcess`) through `launcher`,
which confines the process (`sandbox`) and then `exec`s this module, so that this runs confined from
its first instruction; or forked from its stack's template (`fork_template`), confined by the same
steps before this runs. Its configuration comes on stdin, its sockets and pipes as inherited file
descriptors: the listening data-port socket (and its Unix socket, where the supervisor made one; and
the launcher's listener on the same port number in the loopback of the process's own network
namespace, where it calls itself), a status pipe (it writes one JSON line: ready, or the error that
kept the model from loading) and a lifeline pipe (end of file = the supervisor is gone, so this
process exits too). It imports the framework, loads the model and serves. It holds no Ray
credentials, so a tenant's `code/inference.py` cannot reach the cluster; it knows only its own
container's hop key.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading

from serving._gc import defer_collections, freeze_startup_objects
from serving.errors import without_capabilities


class _WithoutCapabilities(logging.Formatter):
    """Log lines less the URL of this process's TF Serving route: its output goes to Ray's log
    files, which other users of the machine may read, and a handler's failure names the URL it
    posted to."""

    def format(self, record: logging.LogRecord) -> str:
        return without_capabilities(super().format(record))


def _lifeline(fd: int, stop: threading.Event, orphaned: threading.Event) -> None:
    """Exit when the supervisor is gone (its end of the pipe closed)."""
    while os.read(fd, 1):
        pass
    orphaned.set()
    stop.set()


def _empty(folder: str) -> None:
    """Remove what this process left in its scratch folder (the unpacked model); the folder itself
    is its supervisor's to remove (the sandbox lets this process change only what lies inside
    it)."""
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _report(fd: int, document: dict) -> None:
    with os.fdopen(fd, "w") as status:
        status.write(json.dumps(document) + "\n")


def main(config: dict | None = None) -> int:
    """Serve until told to stop. `config`: the launcher's, when this process was forked from its
    stack's template (`fork_template`) rather than started by `exec` (then it is read from stdin)."""
    defer_collections()  # until the model is loaded and serving (freeze_startup_objects)
    # what logging's last resort did (warnings and worse, on stderr), redacted
    handler = logging.StreamHandler()
    handler.setFormatter(_WithoutCapabilities("%(message)s"))
    logging.getLogger().addHandler(handler)
    if config is None:
        config = json.loads(sys.stdin.read())
    sys.stdin.close()
    status_fd = config["status_fd"]
    sys.path.extend(path for path in config["sys_path"] if path not in sys.path)
    stop, orphaned = threading.Event(), threading.Event()
    threading.Thread(
        target=_lifeline, args=(config["lifeline_fd"], stop, orphaned), name="lifeline", daemon=True
    ).start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        server = _serve(config)
    # the model did not load: the supervisor reports it as the container's failure
    except Exception as error:
        _report(status_fd, {"error": f"{type(error).__name__}: {error}"})
        return 1
    _report(
        status_fd,
        {"ready": True, "pid": os.getpid(), **config["sandbox_report"]},
    )
    freeze_startup_objects()  # after the report: serving does not wait for it
    stop.wait()
    server.stop()
    # a supervisor that was killed cannot clean up after this process: do it here
    if orphaned.is_set():
        _empty(config["scratch"])
    return 0


def _serve(config: dict):
    """Load the model and start serving on the inherited socket (imports the framework: after the
    sandbox)."""
    import socket

    from serving.http.server import BackgroundServer
    from serving.model_server.app import build_container_app
    from serving.model_server.events import EventLog
    from serving.models.artifacts import materialize
    from serving.models.multimodel import MultiModelHandler
    from serving.models.s3_broker import BrokeredS3
    from serving.runtimes import runtime_for
    from serving.runtimes.concurrency import batch_settings, inline_budget_s

    listener = socket.socket(fileno=config["listen_fd"])
    # the data port's Unix socket, and its number on the loopback of the process's own network
    # namespace
    also = tuple(
        socket.socket(fileno=config[key])
        for key in ("unix_fd", "loopback_fd")
        if config.get(key) is not None
    )
    events = EventLog()
    hop_key = bytes.fromhex(config["hop_key"])
    hostname, environment = config["hostname"], config["environment"]
    log_stream = config.get("log_stream")
    if config["multi_model"] is not None:
        # an S3 prefix: its supervisor makes the calls (this process has no network)
        broker = config.get("s3_broker")
        models = MultiModelHandler(
            config["image"],
            config["model_data"],
            environment,
            hostname=hostname,
            s3_client=BrokeredS3(*broker) if broker else None,
            observer=events,
            downloaded=events.downloaded,
            model_latency=events.model_latency,
            **config["multi_model"],
        )
        app = build_container_app(
            None, hostname, models, events=events, hop_key=hop_key, log_stream=log_stream
        )
    else:
        runtime = runtime_for(config["image"], materialize(config["model_data"]), environment)
        runtime.only_model_in_process = True
        runtime.events = events  # a generating stack reports its tokens' timing
        runtime.load()
        # how this container runs its model, chosen once: threads, inline, batching
        app = build_container_app(
            runtime,
            hostname,
            threads=runtime.prediction_threads(),
            batching=batch_settings(environment),
            inline_budget_s=inline_budget_s(environment),
            model_latency=events.model_latency,
            events=events,
            hop_key=hop_key,
            log_stream=log_stream,
            data_url=config["data_url"],
        )
    server = BackgroundServer(app, sock=listener, also=also)
    if not server.wait_started():
        raise RuntimeError("the data port did not start")
    return server


if __name__ == "__main__":
    sys.exit(main())
