"""Runs of `serving loadtest` (Locust, open or closed loop) against an endpoint, and their JSON
reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def loadtest_command(scenario: str, endpoint_url: str, out: Path, *options: str) -> list[str]:
    """`python -m serving.cli loadtest SCENARIO --endpoint URL ... --out OUT --no-html`."""
    return [
        sys.executable,
        "-m",
        "serving.cli",
        "loadtest",
        scenario,
        "--endpoint",
        endpoint_url,
        *options,
        "--out",
        str(out),
        "--no-html",
    ]


def read_report(out: Path) -> dict[str, Any]:
    """The report.json a load test wrote into `out`."""
    return json.loads((out / "report.json").read_text())


def run_loadtest(
    scenario: str,
    endpoint_url: str,
    out: Path,
    *options: str,
    timeout: float | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run one load test to its end (raising if it fails) and return its report."""
    subprocess.run(
        loadtest_command(scenario, endpoint_url, out, *options),
        check=True,
        timeout=timeout,
        stdout=subprocess.DEVNULL if quiet else None,
    )
    return read_report(out)
