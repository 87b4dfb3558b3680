"""What a container process imports to serve: its data port's server and app, without the server
settings.

Each container process pays for its imports at start, fifteen times over in examples/fifteen.yaml;
the HTTP limits' defaults used to come from `ServerSettings`, which loaded pydantic-settings (~0.13
CPU-seconds and ~10 MiB per process) for six numbers (docs/benchmarks/bench_idle.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What serving.model_server.main imports before the framework (its `_serve`).
_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import serving.model_server.main
from serving.http.server import BackgroundServer
from serving.model_server.app import ContainerApp
from serving.model_server.events import EventLog
from serving.models.artifacts import materialize
from serving.models.multimodel import MultiModelHandler
from serving.runtimes import runtime_for
from serving.runtimes.concurrency import batch_settings, inline_budget_s
print(" ".join(name for name in ("serving.settings", "pydantic_settings", "pydantic") if name in sys.modules))
"""


def test_a_container_process_serves_without_loading_the_settings() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-c", _PROBE, str(ROOT)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"a container process imports {done.stdout.strip()}"


def test_the_http_limits_defaults_are_the_settings_defaults() -> None:
    from serving.http.limits import HttpLimits
    from serving.settings import ServerSettings

    assert HttpLimits.from_settings(ServerSettings()) == HttpLimits()
