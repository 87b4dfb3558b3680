"""`serving loadtest` against the session's real endpoint server: the report's request count equals
the server's own `serving_invocations_total`. The harness runs in a subprocess (Locust's gevent
patching must not reach this process), bounded in time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from suite import endpoints

pytestmark = pytest.mark.integration

ENDPOINTS = {
    "it-single": endpoints.single,
    "it-serial": endpoints.serial,
}  # what `server` deploys for this module, by builder


def run_loadtest(server, tmp_path: Path, *arguments: str) -> dict:
    out = tmp_path / "report"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "serving.cli",
            "loadtest",
            *arguments,
            "--out",
            str(out),
            "--metrics-check",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert (out / "report.html").read_text().count("<img") >= 4
    return json.loads((out / "report.json").read_text())


def test_direct_run_matches_the_servers_invocation_count(server, tmp_path: Path) -> None:
    report = run_loadtest(
        server,
        tmp_path,
        "direct",
        "--endpoint",
        f"{server.url}/endpoints/it-single",
        "--rate",
        "20",
        "--duration",
        "4",
    )
    check = report["metrics_check"]
    assert check["error"] is None, check
    assert check["harness_answered"] >= 70  # 80 scheduled at 20/s for 4 s
    assert check["difference"] == check["harness_answered"], check
    assert report["totals"]["failures"] == 0, report["totals"]


def test_serial_run_counts_each_request_once(server, tmp_path: Path) -> None:
    report = run_loadtest(
        server,
        tmp_path,
        "serial",
        "--endpoint",
        f"{server.url}/endpoints/it-serial",
        "--users",
        "2",
        "--duration",
        "3",
    )
    check = report["metrics_check"]
    assert check["difference"] == check["harness_answered"] > 0, check
