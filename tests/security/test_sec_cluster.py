"""`serving up --address` refuses a Ray cluster that lets anyone in, and the probe behind it tells
them apart.

A Ray started here without authentication (RAY_AUTH_MODE=disabled, what today's `main` ran for its
embedded server) is the unsafe cluster; one with a token is the safe one. Each runs in a child
process of the test, stopped by its PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.ray_wing.cluster import cluster_accepts_anyone

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HOLDER = """
import ray, sys, time
ray.init(address="local", include_dashboard=False, num_cpus=1)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes our stdin
ray.shutdown()
"""


def _ray(mode: str, tmp_path: Path) -> Iterator[str]:
    environment = {
        **os.environ,
        "RAY_AUTH_MODE": mode,
        "RAY_AUTH_TOKEN": "9" * 64,
        "HOME": str(tmp_path),
    }
    environment.pop("RAY_AUTH_TOKEN_PATH", None)
    if mode == "disabled":
        environment.pop("RAY_AUTH_TOKEN")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=environment,
        text=True,
    )
    try:
        address = holder.stdout.readline().strip()
        assert address, "the test cluster did not start"
        yield address
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=10)


@pytest.fixture(scope="module")
def open_cluster(tmp_path_factory) -> Iterator[str]:
    yield from _ray("disabled", tmp_path_factory.mktemp("open-ray"))


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory) -> Iterator[str]:
    yield from _ray("token", tmp_path_factory.mktemp("token-ray"))


def test_the_probe_tells_open_from_authenticated_clusters(
    open_cluster: str, token_cluster: str
) -> None:
    assert cluster_accepts_anyone(open_cluster)
    assert not cluster_accepts_anyone(token_cluster)


def test_serving_up_refuses_an_open_cluster(open_cluster: str) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "serving.cli",
            "up",
            str(ROOT / "examples" / "direct.yaml"),
            "--address",
            open_cluster,
            "--exit-after-ready",
            "--wait-timeout",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "accepts connections without an authentication token" in done.stderr
    assert "--allow-unauthenticated-ray" in done.stderr
    assert time.monotonic() - started < 120
