"""The servers benchmarks compare ours with: the floor (the model in-process behind a bare Starlette
app, `floor_server`), the floor behind the cheapest proxy (`proxy_floor`) and MLServer with its
scikit-learn runtime, in a virtual environment of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from loadtests.harness.processes import (
    BenchError,
    Processes,
    free_port,
    http,
    log,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
MLSERVER_VERSION = "1.7.1"
MLSERVER_MODEL = "iris"


def _start_port_printer(
    processes: Processes, module: str, args: list[str], name: str, log: Path
) -> tuple[subprocess.Popen, str]:
    """Start a harness server (`python -m module`) that prints its port on its first stdout line;
    wait until it answers /ping."""
    process = processes.start(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=open(log, "wb"),
        text=True,
    )
    line = wait_until(
        f"{name} port",
        lambda: process.stdout.readline().strip() or process.poll() is not None,
        timeout=60,
    )
    if process.poll() is not None or not str(line).isdigit():
        raise BenchError(f"the {name} did not start; see {log}")
    url = f"http://127.0.0.1:{line}"
    wait_until(name, lambda: http("GET", url + "/ping", timeout=2)[0] == 200, timeout=30)
    return process, url


def start_floor(
    processes: Processes, paths: dict[str, Path], logs: Path
) -> tuple[subprocess.Popen, str]:
    return _start_port_printer(
        processes,
        "loadtests.harness.floor_server",
        [str(paths["joblib"])],
        "floor server",
        logs / "floor.log",
    )


def start_proxy_floor(
    processes: Processes, floor_url: str, logs: Path
) -> tuple[subprocess.Popen, str]:
    """The two-process floor: `proxy_floor` forwarding to the floor at `floor_url`."""
    return _start_port_printer(
        processes,
        "loadtests.harness.proxy_floor",
        [floor_url.rsplit(":", 1)[1]],
        "proxy in front of the floor",
        logs / "proxy-floor.log",
    )


def _mlserver_requirements() -> list[str]:
    import sklearn

    return [
        f"mlserver=={MLSERVER_VERSION}",
        f"mlserver-sklearn=={MLSERVER_VERSION}",
        # the version that fitted the model: joblib files are not portable
        f"scikit-learn=={sklearn.__version__}",
        # uvloop 0.22 changed its event-loop policy: MLServer 1.7.1's inference workers die at start
        # with "There is no current event loop in thread 'MainThread'" (mlserver/parallel/worker.py,
        # _ignore_signals).
        "uvloop<0.22",
    ]


def ensure_mlserver(venv: Path) -> Path:
    """The MLServer virtual environment (created on first use, repaired if its pins drifted); its
    `mlserver`."""
    binary = venv / "bin" / "mlserver"
    requirements = _mlserver_requirements()
    if binary.exists():
        versions = mlserver_versions(venv)
        import sklearn

        uvloop = tuple(int(x) for x in versions.get("uvloop", "0.0").split(".")[:2])
        if (
            versions.get("mlserver") == MLSERVER_VERSION
            and versions.get("mlserver-sklearn") == MLSERVER_VERSION
            and versions.get("scikit-learn") == sklearn.__version__
            and uvloop < (0, 22)
        ):
            return binary
        log(f"{venv}: fixing package versions ({versions}) ...")
    else:
        log(f"creating {venv} with MLServer {MLSERVER_VERSION} (first run only; needs PyPI) ...")
        venv.parent.mkdir(parents=True, exist_ok=True)
    python3 = shutil.which("python3") or sys.executable
    try:
        if not binary.exists():
            subprocess.run([python3, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", *requirements], check=True, timeout=1200
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        raise BenchError(
            f"could not prepare the MLServer environment at {venv} ({' '.join(requirements)}): {error}; "
            f"delete {venv} and run again"
        ) from None
    return binary


def mlserver_versions(venv: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n) for n in "
        "('mlserver', 'mlserver-sklearn', 'scikit-learn', 'numpy', 'uvicorn', 'uvloop', 'fastapi')} | "
        "{'python': sys.version.split()[0]}))"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=60
    )
    return (
        json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr.strip()[-300:]}
    )


def mlserver_settings(http_port: int, extra: dict[str, Any] | None = None) -> str:
    """MLServer's settings.json as its users run it in production: default settings except `debug:
    false` (its default `true` writes a uvicorn access-log line per request), where it listens (free
    ports, loopback), `extra`."""
    settings = {
        "debug": False,
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": free_port(),
    }
    return json.dumps({**settings, "metrics_port": free_port(), **(extra or {})})


def start_mlserver(
    processes: Processes,
    binary: Path,
    paths: dict[str, Path],
    logs: Path,
    extra_settings: dict[str, Any] | None = None,
    model_settings: dict[str, Any] | None = None,
) -> tuple[subprocess.Popen, str]:
    root = paths["mlserver_root"]
    http_port = free_port()
    (root / "settings.json").write_text(mlserver_settings(http_port, extra_settings))
    (root / MLSERVER_MODEL / "model-settings.json").write_text(
        json.dumps(
            {
                "name": MLSERVER_MODEL,
                "implementation": "mlserver_sklearn.SKLearnModel",
                "parameters": {"uri": "./model.joblib", "version": "v1"},
                **(model_settings or {}),
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{binary.parent}:{env.get('PATH', '')}"
    changed = {**(extra_settings or {}), **(model_settings or {})}
    log_file = logs / (
        "mlserver-" + "-".join(f"{k}-{v}" for k, v in changed.items()) + ".log"
        if changed
        else "mlserver.log"
    )
    process = processes.start(
        [str(binary), "start", str(root)],
        cwd=root,
        env=env,
        stdout=open(log_file, "wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{http_port}"

    def ready():
        if process.poll() is not None:
            raise BenchError(f"MLServer exited with {process.returncode}; see {log_file}")
        return http("GET", f"{url}/v2/models/{MLSERVER_MODEL}/ready", timeout=2)[0] == 200

    wait_until("MLServer model", ready, timeout=300, interval=0.5)
    return process, url
