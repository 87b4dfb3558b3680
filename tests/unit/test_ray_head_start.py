"""What the process that starts the embedded Ray loads on the way: Ray asks whether the node agent's
dependencies are installed by importing them all (aiohttp, grpc, OpenTelemetry, ...), between the
GCS's start and the raylet's; `cluster.dashboard_dependency_error` answers from the import system's
finders instead, and must give Ray's answer."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from serving.ray_wing import cluster

# What ray.dashboard.optional_deps imports that is heavy (Ray 2.60); none of it is the driver's.
HEAVY = ("aiohttp", "aiohttp_cors", "grpc", "opencensus", "opentelemetry.exporter.prometheus")

_CHECK = f"""
import json, sys
import ray
from serving.ray_wing.cluster import dashboard_dependency_error
ours = dashboard_dependency_error()
loaded = [name for name in {HEAVY!r} if name in sys.modules]
from ray._private.utils import get_dashboard_dependency_error
print(json.dumps({{"ours": repr(ours), "loaded": loaded, "ray": repr(get_dashboard_dependency_error())}}))
"""


def test_the_check_gives_rays_answer_and_imports_none_of_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=120, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"ours": "None", "loaded": [], "ray": "None"}


def test_a_missing_dependency_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "aiohttp_cors" else real(name, *args),
    )
    error = cluster.dashboard_dependency_error()
    assert isinstance(error, ModuleNotFoundError) and error.name == "aiohttp_cors"


@pytest.mark.parametrize(
    ("name", "findable"),
    [
        ("opentelemetry.exporter.prometheus", True),  # a distribution in a namespace package
        ("opentelemetry.exporter.nonesuch", False),  # looked for: its parents are namespaces
        ("nonesuch", False),
        ("aiohttp.web", True),  # taken to ship with aiohttp, which is not imported to look
    ],
)
def test_findable(name: str, findable: bool) -> None:
    assert cluster._findable(name) is findable


def test_without_the_list_the_check_is_rays_own(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # a Ray whose dashboard package has no optional_deps.py to read: Ray's own check, importing
    import ray.dashboard

    monkeypatch.setattr(ray.dashboard, "__file__", str(tmp_path / "__init__.py"))
    assert cluster.dashboard_dependency_error() is None
