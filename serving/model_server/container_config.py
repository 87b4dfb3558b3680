"""What a container process is given, decided before it starts: what it serves (`ContainerConfig`),
the files it may read and write and the devices it may open (`sandbox_paths`), and its environment,
first the launcher's (the supervisor's allowlist) then the model server's (the container's own, less
the variables that choose code). `supervisor` starts the process with them; `sandbox` enforces them.
What the process tells its supervisor back: its start report (`StartReport`) and its counters
(`ContainerStats`)."""

from __future__ import annotations

import glob
import logging
import os
import site
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from serving.model_server import sandbox
from serving.models.cache_limits import CacheLimits
from serving.protocol import MODEL_CACHE_DIR_ENV, SUBMIT_DIRECTORY_ENV
from serving.protocol import SANDBOX_READ_ENV as EXTRA_READ_ENV
from serving.protocol import SANDBOX_WRITE_ENV as EXTRA_WRITE_ENV
from serving.runtimes.sourcedir import SAGEMAKER_MODEL_DIR

__all__ = [
    "SANDBOX_MODES",
    "ContainerConfig",
    "ContainerStartError",
    "ContainerStats",
    "StartReport",
    "child_environment",
    "describe_sandbox",
    "launcher_environment",
    "sandbox_paths",
    "template_environment",
]

logger = logging.getLogger("serving.container_process")

SANDBOX_MODES = ("auto", "required", "off")
# Variables of the supervisor a Python process needs; everything else stays behind.
_PASSED_ENV = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
)
_PASSED_PREFIXES = ("LC_",)


class ContainerStartError(RuntimeError):
    """The container process exited before serving: its model did not load, or the sandbox
    failed."""


@dataclass
class ContainerConfig:
    """What a container process serves and how it is confined."""

    endpoint: str
    hostname: str
    image: str
    model_data: str | None
    environment: dict[str, str]
    hop_key: bytes = field(repr=False)
    multi_model: CacheLimits | None = None  # None: SingleModel
    sandbox: str = "auto"
    working_dir: str | None = None
    gpus: float = 0.0
    egress_ports: tuple[int, ...] = ()  # opted in: the node's network, TCP out to these ports only
    # where no network namespace can be made: the node's network, under its rules
    shared_network: bool = False
    # may be forked from its stack's template (`forked`); else a fresh interpreter
    fork_template: bool = True


def _local_model_path(model_data: str | None) -> str | None:
    if not model_data or model_data.startswith("s3://"):
        return None
    return model_data.removeprefix("file://")


def _code_paths() -> list[str]:
    """What the server runs: the Python install, its site-packages and this package. A container may
    read them, never write them (a replica started later would run what it wrote, as this process's
    user)."""
    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
    }
    paths.update(path for path in site.getsitepackages() if os.path.isdir(path))
    # the `serving` package, wherever it is installed
    paths.add(str(Path(__file__).resolve().parents[1]))
    return sorted(paths)


def sandbox_paths(config: ContainerConfig, scratch: str) -> dict[str, list[str]]:
    """The sandbox policy of a container process: what it may read, write and open as a device.

    Raises ContainerStartError when an extra writable path (SERVING_SANDBOX_WRITE) holds or lies
    inside code the server runs."""
    code = _code_paths()
    read = list(sandbox.SYSTEM_READ) + code
    model = _local_model_path(config.model_data)
    if model:
        read.append(os.path.realpath(model))
    if config.working_dir:
        read.append(os.path.realpath(config.working_dir))
    read += [path for path in config.environment.get(EXTRA_READ_ENV, "").split(os.pathsep) if path]
    submit = config.environment.get(SUBMIT_DIRECTORY_ENV, "").removeprefix("file://")
    # a shared script (MultiModel)
    if os.path.isabs(submit) and not submit.startswith(SAGEMAKER_MODEL_DIR):
        read.append(os.path.realpath(submit))
    extra_write = [
        path for path in config.environment.get(EXTRA_WRITE_ENV, "").split(os.pathsep) if path
    ]
    for path in extra_write:
        resolved = Path(path).resolve()
        overlap = [
            c for c in code if resolved.is_relative_to(c) or Path(c).is_relative_to(resolved)
        ]
        if overlap:
            raise ContainerStartError(
                f"container {config.hostname}: {EXTRA_WRITE_ENV} names {path}, which holds or lies in code this "
                f"server runs ({overlap[0]}): a container may not write it"
            )
    write = [scratch, *extra_write]
    devices = list(sandbox.SYSTEM_DEVICES)
    if config.gpus > 0:
        devices += sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri/*"))
    return {"read": read, "write": write, "devices": devices}


# joblib's process pools need POSIX semaphores in /dev/shm, which the sandbox keeps from it: say so up
# front rather than have it warn on every import (scikit-learn then predicts in one process).
# OpenMP's threads (PyTorch's intra-op pool, XGBoost, scikit-learn) sleep when out of work instead of
# spinning for it: a spinning pool takes the cores the replica's other requests and the node's other
# containers need. Both are read as the framework is imported: a stack's template starts with them.
_DEFAULTS = {"JOBLIB_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "PASSIVE"}


def launcher_environment() -> dict[str, str]:
    """The environment the container process starts in: the supervisor's allowlisted variables,
    nothing of the container's (the launcher confines the process before the container's environment
    applies)."""
    return {
        key: value
        for key, value in os.environ.items()
        if key in _PASSED_ENV or key.startswith(_PASSED_PREFIXES)
    }


def child_environment(config: ContainerConfig, scratch: str) -> dict[str, str]:
    """The model server's environment, applied once confined: the container's `Environment` less the
    variables that choose code as a process starts (a spec or API call naming one is refused; one
    that got here anyway, say from an older state file, is dropped and logged), plus what Python
    needs."""
    refused = sandbox.startup_variables(config.environment)
    if refused:
        logger.warning(
            "container %s: not passing %s to its process (docs/security.md)",
            config.hostname,
            refused,
        )
    return {
        **launcher_environment(),
        **_DEFAULTS,
        **{key: value for key, value in config.environment.items() if key not in refused},
        "HOME": scratch,
        "TMPDIR": scratch,
        MODEL_CACHE_DIR_ENV: os.path.join(scratch, "models"),
        "PYTHONUNBUFFERED": "1",
    }


def template_environment(home: str) -> dict[str, str]:
    """The environment a stack's template starts in (`fork_template`): the launcher's and the
    container defaults, with `home` (its own folder) as HOME and TMPDIR; nothing a caller chose."""
    return {**launcher_environment(), **_DEFAULTS, "HOME": home, "TMPDIR": home}


class StartReport(TypedDict, total=False):
    """The one line a container process writes on its status pipe: `error`, or `ready` with its pid
    and what its sandbox applied (the launcher's `sandbox_report`)."""

    error: str
    ready: bool
    pid: int
    landlock_abi: int  # 0: no Landlock
    seccomp: bool
    capabilities_dropped: bool
    network: str  # "host", or the namespaces it has of its own ("network", "user+network")
    connect_ports: list[int]


class ContainerStats(TypedDict):
    """What a container process answers on STATS_PATH: its counters, its model's autoscaling
    metrics, and the metric events since the last call (where it records them)."""

    invocations: int
    in_flight: int
    refused: int  # requests without a valid hop signature
    inline: int  # requests answered on the event loop's thread
    custom: dict[str, float]  # the model's `autoscaling_metrics`, by name
    events: NotRequired[list[tuple[Any, ...]]]  # (method, *arguments) of the metrics to record
    dropped_events: NotRequired[int]


def describe_sandbox(report: StartReport) -> str:
    """One line for logs: which layers confine the process."""
    if not report:
        return "not started"
    network = report.get("network", "host")
    parts = [
        "the node's network" if network == "host" else f"its own {network} namespace",
        f"Landlock ABI {report['landlock_abi']}" if report.get("landlock_abi") else "no Landlock",
        "seccomp" if report.get("seccomp") else "no seccomp",
        "no capabilities" if report.get("capabilities_dropped") else "capabilities kept",
    ]
    return ", ".join(parts)
