"""The README's demo, end to end, exactly as a user runs it (`examples/demo.py`).

It starts its own embedded Ray in a subprocess, so it runs before the shared
integration instance is started (tests/e2e sorts first) and stops it itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


# a pid and its start time: a pid the kernel gives to another process is not the same one
Process = tuple[int, str]


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), None when the pid is
    gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _descendants(pid: int) -> list[Process]:
    """Every process below `pid` now (its children, theirs, ...), from /proc."""
    stats = {
        int(entry.name): _stat(int(entry.name))
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
    }
    found: list[Process] = []
    frontier = [pid]
    while frontier:
        frontier = [
            child for child, fields in stats.items() if fields and int(fields[1]) in frontier
        ]
        # field 22 of stat: the start time
        found += [(child, stats[child][19]) for child in frontier]
    return found


def _templates_since(start: str) -> list[str]:
    """The stacks of this checkout's stack templates started since `start` (a start time from
    /proc), one entry per template."""
    stacks = []
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is None or int(fields[19]) < int(start):
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "serving.model_server.fork_template" in " ".join(argv) and str(ROOT) in argv:
            stacks.append(argv[argv.index(str(ROOT)) + 1])
    return stacks


def _alive(process: Process) -> bool:
    fields = _stat(process[0])
    return fields is not None and fields[0] != "Z" and fields[19] == process[1]


@pytest.mark.timeout(720)
def test_demo_trains_its_model_serves_the_endpoints_and_sample_calls_succeed():
    """As a user runs it: `make demo`, the calls, then a stop. SIGTERM (what a service manager or
    `kill` sends, and the one stop that works for a background job, which ignores SIGINT) stops the
    server and every process it started: before, the demo died alone and left `serving up` and its
    Ray running."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    errors: list[str] = []
    readers = [
        threading.Thread(target=lambda: lines.extend(demo.stdout), daemon=True),
        threading.Thread(target=lambda: errors.extend(demo.stderr), daemon=True),
    ]
    for reader in readers:
        reader.start()
    started: list[Process] = []
    try:
        deadline = time.monotonic() + 600  # includes `serving train` of the digits CNN
        while not any(line.startswith("Demo endpoints are up") for line in lines):
            assert demo.poll() is None and time.monotonic() < deadline, (
                "".join(lines)[-3000:] + "".join(errors)[-3000:]
            )
            time.sleep(0.5)
        started = _descendants(demo.pid)  # `serving up`, its Ray and every replica
        assert started
        # one template per stack: every container process of a stack forks from the one its
        # node's container host started ahead (`ContainerHost.warm`)
        templates = _templates_since(_stat(demo.pid)[19])
        assert templates and len(templates) == len(set(templates)), templates
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(120) == 0, "".join(errors)[-3000:]
        for reader in readers:
            reader.join(10)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [p for p in started if _alive(p)], "processes the demo started outlived it"
    finally:
        if demo.poll() is None:
            demo.kill()
        for process in started:  # only what this test started, checked by start time
            if _alive(process):
                os.kill(process[0], signal.SIGKILL)
    result = subprocess.CompletedProcess(
        demo.args, demo.returncode, "".join(lines), "".join(errors)
    )
    assert "\nStopped.\n" in result.stdout, result.stdout[-500:]
    output = result.stdout
    assert output.count("-> 200") == 5
    assert '{"labels": ["setosa", "virginica"]}' in output
    assert (
        "botocore ValidationError" in output
        and "X-Amzn-SageMaker-Target-Container-Hostname" in output
    )
    assert (
        "mce-direct: InService" in output
        and "mce-serial: InService" in output
        and "mce-trained: InService" in output
    )
    assert (ROOT / "model-store" / "digits-cnn" / "latest" / "model.json").is_file()
    # Issue 42, item 8: the console reads as the project's own (Ray's chatter stays in its log
    # files). On a fresh clone the demo trains the CNN first: then every epoch's line appears once
    # (it appeared twice).
    console = output + result.stderr
    epochs = [
        line for line in output.splitlines() if line.startswith("[serving train] digits-cnn: epoch")
    ]
    assert len(epochs) == len(set(epochs)), epochs
    for chatter in (
        "Reporting training result",
        "Checkpoint successfully created",
        "Connecting to existing Serve app",
        "State API may be temporarily unavailable",
        "SharedRouterLongPollClient",
        "graceful_shutdown failed",
        "infinite retries remaining",
    ):
        assert chatter not in console, chatter
