"""The one-container server as a user starts it: `serving up SPEC`, this tree against a baseline.

    .venv/bin/python -m loadtests.bench_server_up --baseline REV [--rounds 3] [--window 30]
                                                  [--endpoint one|fifteen] [--write-docs]

Serves one scikit-learn container (the iris pipeline, skops), or with `--endpoint fifteen` the
fifteen containers of examples/fifteen.yaml (models trained by examples/train_hetero.py, each
answer checked against its expected one), with `serving up` in a child process,
from this tree and from `--baseline` (a git revision, checked out in a temporary worktree and run
with the same interpreter and packages), alternating which goes first in each round. Each run
measures:

  first answer  seconds from starting `serving up` until every container has answered an
                InvokeEndpoint call (what a user waits for; Ray's start included)
  start-up CPU  CPU seconds every process of the tree used until then
  idle CPU      cores every process of the tree uses over `--window` seconds without requests,
                after 10 s to settle, by role
  memory        PSS summed over the tree (from /proc/PID/smaps_rollup), by role

and the docs table gives the median of the rounds, with this tree's over the baseline's. Targets
(issue 60), one container: idle <= 0.08 cores, first answer <= 8 s, PSS <= 0.8x the baseline's;
fifteen: idle <= 0.10 cores, all answering <= 15 s, PSS <= 0.5x. Each server is
stopped with SIGINT (SIGKILL of its process group after 60 s). Every run starts cold: the stack
templates of its tree's code are stopped before it and after it (a server started within
`fork_template.LINGER_S` of another of the same code would find its frameworks imported; the rounds
alternate, so without this a tree's second run in a row started warm; it also stops those of any
other server of the same checkout, so run none beside it). Run it on a quiet machine (`uptime`).
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
from pathlib import Path
from typing import Any

from loadtests.bench_consolidation import _containers
from loadtests.harness.models import hetero_models, iris_models
from loadtests.harness.processes import free_port, http, log
from loadtests.harness.proctree import (
    is_template,
    parent_of,
    process_cpu_seconds,
    process_tree,
    smaps,
    stop_templates,
    title,
)
from loadtests.harness.results import (
    ROOT,
    run_line,
    run_meta,
    worktree,
    write_results,
    write_section,
)
from loadtests.harness.stats import answers_match

# a container's sample call: hostname, body, content type, the expected answer (None: any 200)
Sample = tuple[str, str, str, Any]

RESULTS = ROOT / "loadtests" / "results" / "bench_server_up.json"
DOCS = ROOT / "docs" / "benchmarks" / "bench_server_up.md"
ENDPOINT = "up"
SETTLE_S = 10.0
FIRST_ANSWER_TIMEOUT_S = 600.0
# idle cores, seconds to every container answering, PSS against the baseline's (issue 60)
TARGETS = {"one": (0.08, 8.0, 0.8), "fifteen": (0.10, 15.0, 0.5)}


def role(pid: int, driver: int) -> str:
    """What a process of the server's tree is (a container process counts apart from its
    replica)."""
    if pid == driver:
        return "serving up"
    command = title(pid)
    for marker, name in (
        ("ray::NodeGateway", "gateway"),
        ("ServeReplica:serving-gateway", "gateway"),  # a baseline's, before 2026-12-01
        ("ServeReplica:serving-control", "control plane"),
        ("ServeReplica:", "container replica"),
        ("ray::ContainerHost", "container host"),
        ("ServeController", "serve controller"),
        ("ray::Registry", "registry"),
    ):
        if marker in command:
            return name
    if is_template(pid):
        return "container templates"
    parent = parent_of(pid)
    if parent is not None and (
        "ServeReplica:" in title(parent) or "ray::ContainerHost" in title(parent)
    ):
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


def _samples(endpoint: str, models: Path, work: Path) -> tuple[list[dict[str, Any]], list[Sample]]:
    """The endpoint's containers and each one's sample call (body, content type, expected answer)."""
    if endpoint == "one":
        model = iris_models(work)["skops_dir"]
        container = {"ContainerHostname": "iris", "Image": "sklearn", "ModelDataUrl": str(model)}
        return [container], [("iris", "5.1,3.5,1.4,0.2", "text/csv", None)]
    hetero_models(models)
    expected = json.loads((models / "expected.json").read_text())
    containers = _containers(models)
    samples = [
        (
            c["ContainerHostname"],
            json.dumps(expected[Path(c["ModelDataUrl"]).name]["request"]),
            "application/json",
            expected[Path(c["ModelDataUrl"]).name]["response"],
        )
        for c in containers
    ]
    return containers, samples


def _answered(base: str, sample: Sample) -> bool:
    hostname, body, content_type, want = sample
    headers = {"Content-Type": content_type, "X-Amzn-SageMaker-Target-Container-Hostname": hostname}
    status, answer = http("POST", f"{base}/endpoints/{ENDPOINT}/invocations", body, headers, 10)
    if status != 200:
        return False
    if want is None:
        return True
    got = json.loads(answer)
    if isinstance(got, dict) and set(got) == {"predictions"} and isinstance(want, list):
        got = got["predictions"]  # the tensorflow stack answers as TFS does
    if not answers_match(got, want):
        raise RuntimeError(f"{hostname} answered {answer[:200]!r}, not {want!r}")
    return True


def measure(
    tree: Path, containers: list[dict[str, Any]], samples: list[Sample], work: Path, window: float
) -> dict[str, Any]:
    """One `serving up` from `tree`: first answer of every container, start-up CPU, idle CPU and
    PSS by role."""
    port = free_port()
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    if tree != ROOT:  # their container processes import `serving` from there
        containers = [
            {**c, "Environment": {**c.get("Environment", {}), "SERVING_SANDBOX_READ": str(tree)}}
            for c in containers
        ]
    spec = work / f"spec-{port}.json"
    spec.write_text(json.dumps({"EndpointName": ENDPOINT, "Containers": containers}))
    command = [sys.executable, "-m", "serving.cli", "up", str(spec), "--port", str(port)]
    command += ["--allow-anonymous", "--state", str(work / f"state-{port}.db")]
    stop_templates(tree)  # cold: no framework already imported by an earlier run's template
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
        base, waiting = f"http://127.0.0.1:{port}", list(samples)
        while waiting:
            with contextlib.suppress(OSError):
                waiting = [sample for sample in waiting if not _answered(base, sample)]
            if not waiting:
                break
            if server.poll() is not None or time.monotonic() - started > FIRST_ANSWER_TIMEOUT_S:
                output = (work / f"up-{port}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"`serving up` from {tree} did not answer; it said:\n{output}")
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
        stop_templates(tree)
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


def _results(endpoint: str) -> Path:
    return RESULTS if endpoint == "one" else RESULTS.with_name(f"bench_server_up_{endpoint}.json")


def docs_section(saved: dict[str, Any]) -> str:
    runs = saved["runs"]
    ours, base = runs["ours"], runs["baseline"]
    rows = [
        ("first answer (s)", "first_answer_s", "{:.1f}"),
        ("start-up CPU (s)", "startup_cpu_s", "{:.1f}"),
        ("idle CPU (cores)", "idle_cores", "{:.3f}"),
        ("PSS, all processes (MiB)", "pss_mib", "{:,.0f}"),
    ]
    fifteen = saved.get("endpoint") == "fifteen"
    what = (
        "the fifteen containers of `examples/fifteen.yaml`"
        if fifteen
        else "one scikit-learn container"
    )
    lines = [
        f"## The {'fifteen' if fifteen else 'one'}-container server, from `serving up`",
        "",
        f"`serving up` with {what} (first answer: every container's sample call answered), this tree against the baseline {saved['baseline']}, "
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
    target_idle, target_first, target_pss = TARGETS["fifteen" if fifteen else "one"]
    lines += [
        "",
        f"Targets (issue 60): idle ≤ {target_idle} cores — {verdict(idle <= target_idle)}; "
        f"{'all fifteen answering' if fifteen else 'first answer'} ≤ {target_first:g} s — "
        f"{verdict(first <= target_first)}; PSS ≤ {target_pss}× the baseline's — {verdict(ratio <= target_pss)}.",
        "",
        run_line(saved["meta"], _results(saved.get("endpoint", "one"))),
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", required=True, help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=30.0, help="idle window, seconds")
    parser.add_argument("--endpoint", choices=("one", "fifteen"), default="one")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    meta = run_meta(__file__, rounds=args.rounds, window_s=args.window)
    began = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "ours": []}
    with tempfile.TemporaryDirectory(prefix="bench-server-up-") as scratch:
        work = Path(scratch)
        containers, samples = _samples(args.endpoint, work / "models", work)
        with worktree(args.baseline) as base_tree:
            for round_number in range(1, args.rounds + 1):
                order = [("baseline", base_tree), ("ours", ROOT)]
                for name, tree in order if round_number % 2 else order[::-1]:
                    run = measure(tree, containers, samples, work, args.window)
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
        "endpoint": args.endpoint,
        "runs": runs,
    }
    name = _results(args.endpoint).stem
    write_results(_results(args.endpoint), saved)
    section = docs_section(saved)
    print(section)
    if args.write_docs:
        write_section(DOCS, name, section, "# bench_server_up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
