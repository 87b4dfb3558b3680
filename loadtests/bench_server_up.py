"""The one-container server as a user starts it: `serving up SPEC`, this tree against a baseline.

    .venv/bin/python -m loadtests.bench_server_up --baseline REV [--rounds 3] [--window 30] [--write-docs]

Serves one scikit-learn container (the iris pipeline, skops) with `serving up` in a child process,
from this tree and from `--baseline` (a git revision, checked out in a temporary worktree and run
with the same interpreter and packages), alternating which goes first in each round. Each run
measures:

  first answer  seconds from starting `serving up` until an InvokeEndpoint call is answered 200
                (what a user waits for; Ray's start included)
  start-up CPU  CPU seconds every process of the tree used until then
  idle CPU      cores every process of the tree uses over `--window` seconds without requests,
                after 10 s to settle, by role
  memory        PSS summed over the tree (from /proc/PID/smaps_rollup), by role

and the docs table gives the median of the rounds, with this tree's over the baseline's. Targets
(issue 60): idle <= 0.08 cores, first answer <= 8 s, PSS <= 0.8x the baseline's. Each server is
stopped with SIGINT (SIGKILL of its process group after 60 s). Run it on a quiet machine (`uptime`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadtests.harness.models import iris_models
from loadtests.harness.processes import free_port, http, log
from loadtests.harness.proctree import parent_of, process_cpu_seconds, process_tree, smaps
from loadtests.harness.results import ROOT, run_line, run_meta, write_results, write_section

RESULTS = ROOT / "loadtests" / "results" / "bench_server_up.json"
DOCS = ROOT / "docs" / "benchmarks" / "bench_server_up.md"
ENDPOINT = "up"
SETTLE_S = 10.0
FIRST_ANSWER_TIMEOUT_S = 180.0
TARGET_IDLE_CORES, TARGET_FIRST_ANSWER_S, TARGET_PSS_RATIO = 0.08, 8.0, 0.8


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="bench-server-up-base-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(folder), revision],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    try:
        yield folder
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT, capture_output=True
        )


def _title(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def role(pid: int, driver: int) -> str:
    """What a process of the server's tree is (a container process counts apart from its
    replica)."""
    if pid == driver:
        return "serving up"
    title = _title(pid)
    for marker, name in (
        ("ServeReplica:serving-gateway", "gateway"),
        ("ServeReplica:serving-control", "control plane"),
        ("ServeReplica:", "container replica"),
        ("ServeController", "serve controller"),
        ("ray::Registry", "registry"),
    ):
        if marker in title:
            return name
    parent = parent_of(pid)
    if parent is not None and "ServeReplica:" in _title(parent):
        return "container process"
    return "ray system"


def _by_role(driver: int, value) -> dict[str, float]:
    totals: dict[str, float] = {}
    for pid in process_tree(driver):
        try:
            measured = value(pid)
        except OSError:
            continue
        name = role(pid, driver)
        totals[name] = totals.get(name, 0.0) + measured
    return totals


def measure(tree: Path, model: Path, work: Path, window: float) -> dict[str, Any]:
    """One `serving up` from `tree`: first answer, start-up CPU, idle CPU and PSS by role."""
    port = free_port()
    container: dict[str, Any] = {"ContainerHostname": "iris", "Image": "sklearn"}
    container["ModelDataUrl"] = str(model)
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    if tree != ROOT:  # its container process imports `serving` from there
        container["Environment"] = {"SERVING_SANDBOX_READ": str(tree)}
    spec = work / f"spec-{port}.json"
    spec.write_text(json.dumps({"EndpointName": ENDPOINT, "Containers": [container]}))
    command = [sys.executable, "-m", "serving.cli", "up", str(spec), "--port", str(port)]
    command += ["--allow-anonymous", "--state", str(work / f"state-{port}.db")]
    started = time.monotonic()
    server = subprocess.Popen(
        command,
        cwd=tree,
        env=environment,
        stdout=open(work / f"up-{port}.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/endpoints/{ENDPOINT}/invocations"
        while True:
            with contextlib.suppress(OSError):
                status, _ = http("POST", url, "5.1,3.5,1.4,0.2", {"Content-Type": "text/csv"}, 2)
                if status == 200:
                    break
            if server.poll() is not None or time.monotonic() - started > FIRST_ANSWER_TIMEOUT_S:
                raise RuntimeError(f"`serving up` from {tree} did not answer; see {work}")
            time.sleep(0.05)
        first_answer = time.monotonic() - started
        startup_cpu = _by_role(server.pid, process_cpu_seconds)
        time.sleep(SETTLE_S)
        before = _by_role(server.pid, process_cpu_seconds)
        idle_started = time.monotonic()
        time.sleep(window)
        after = _by_role(server.pid, process_cpu_seconds)
        elapsed = time.monotonic() - idle_started
        pss = _by_role(server.pid, lambda pid: (smaps(pid) or {"pss": 0})["pss"] / 2**20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)
    idle = {name: (after[name] - before.get(name, 0.0)) / elapsed for name in after}
    return {
        "first_answer_s": first_answer,
        "startup_cpu_s": sum(startup_cpu.values()),
        "idle_cores": sum(idle.values()),
        "idle_by_role": idle,
        "pss_mib": sum(pss.values()),
        "pss_by_role": pss,
    }


def _median(runs: list[dict[str, Any]], key: str, part: str | None = None) -> float:
    return statistics.median(run[key].get(part, 0.0) if part else run[key] for run in runs)


def docs_section(saved: dict[str, Any]) -> str:
    runs = saved["runs"]
    ours, base = runs["ours"], runs["baseline"]
    rows = [
        ("first answer (s)", "first_answer_s", "{:.1f}"),
        ("start-up CPU (s)", "startup_cpu_s", "{:.1f}"),
        ("idle CPU (cores)", "idle_cores", "{:.3f}"),
        ("PSS, all processes (MiB)", "pss_mib", "{:,.0f}"),
    ]
    lines = [
        "## The one-container server, from `serving up`",
        "",
        f"`serving up` with one scikit-learn container, this tree against the baseline {saved['baseline']}, "
        f"{saved['rounds']} interleaved rounds (medians); idle over {saved['window_s']:g} s after "
        f"{SETTLE_S:g} s to settle.",
        "",
        "| | baseline | this tree | ratio |",
        "|---|---|---|---|",
    ]
    for label, key, form in rows:
        b, o = _median(base, key), _median(ours, key)
        lines.append(f"| {label} | {form.format(b)} | {form.format(o)} | {o / b:.2f} |")
    roles = sorted({name for run in ours + base for name in run["pss_by_role"]})
    lines += ["", "By role (medians): PSS in MiB, idle CPU in cores.", ""]
    lines += ["| role | PSS, baseline | PSS, this tree | idle, baseline | idle, this tree |"]
    lines += ["|---|---|---|---|---|"]
    for name in roles:
        cells = [_median(base, "pss_by_role", name), _median(ours, "pss_by_role", name)]
        idle = [_median(base, "idle_by_role", name), _median(ours, "idle_by_role", name)]
        lines.append(
            f"| {name} | {cells[0]:,.0f} | {cells[1]:,.0f} | {idle[0]:.4f} | {idle[1]:.4f} |"
        )
    idle, first = _median(ours, "idle_cores"), _median(ours, "first_answer_s")
    ratio = _median(ours, "pss_mib") / _median(base, "pss_mib")
    verdict = lambda met: "met" if met else "not met"  # noqa: E731
    lines += [
        "",
        f"Targets (issue 60): idle ≤ {TARGET_IDLE_CORES} cores — {verdict(idle <= TARGET_IDLE_CORES)}; "
        f"first answer ≤ {TARGET_FIRST_ANSWER_S:g} s — {verdict(first <= TARGET_FIRST_ANSWER_S)}; "
        f"PSS ≤ {TARGET_PSS_RATIO}× the baseline's — {verdict(ratio <= TARGET_PSS_RATIO)}.",
        "",
        run_line(saved["meta"], RESULTS),
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", required=True, help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=30.0, help="idle window, seconds")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    meta = run_meta(__file__, rounds=args.rounds, window_s=args.window)
    began = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "ours": []}
    with tempfile.TemporaryDirectory(prefix="bench-server-up-") as scratch:
        work = Path(scratch)
        model = iris_models(work)["skops_dir"]
        with worktree(args.baseline) as base_tree:
            for round_number in range(1, args.rounds + 1):
                order = [("baseline", base_tree), ("ours", ROOT)]
                for name, tree in order if round_number % 2 else order[::-1]:
                    run = measure(tree, model, work, args.window)
                    runs[name].append(run)
                    log(
                        f"round {round_number} {name}: first answer {run['first_answer_s']:.1f} s, "
                        f"idle {run['idle_cores']:.3f} cores, PSS {run['pss_mib']:,.0f} MiB"
                    )
    meta["seconds"] = time.monotonic() - began
    saved = {
        "meta": meta,
        "baseline": args.baseline,
        "rounds": args.rounds,
        "window_s": args.window,
        "runs": runs,
    }
    write_results(RESULTS, saved)
    section = docs_section(saved)
    print(section)
    if args.write_docs:
        write_section(DOCS, "bench_server_up", section, "# bench_server_up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
