"""Density benchmark: the fifteen models of examples/fifteen.yaml in one plain Python process (the
floor), in one MLServer, and on our consolidated fifteen-container endpoint, in one run.

    .venv/bin/python -m loadtests.bench_density [--out FILE.json] [--write-docs]
                                                [--scenarios floor,mlserver,ours]

Models are trained by examples/train_hetero.py into a temporary folder (three per stack: sklearn,
pytorch, tensorflow, onnx, python). Each scenario is started from nothing and measured the same way:

  start-up   seconds from starting its first process to every model having answered its sample
             request (checked against expected.json)
  memory     PSS summed over that first process and every process it started (/proc/PID/smaps_rollup)
  idle CPU   CPU seconds those processes use per second over 30 s without requests, after 10 s of rest

  floor      `loadtests.density.floor`: one Python process loads every model with its framework
             (skops, TorchScript / torch.export / a state dict with its model_fn, a SavedModel /
             .keras / model.tar.gz, ONNX Runtime, the scripts' four hooks) and answers in-process:
             no server, no isolation
  mlserver   MLServer 1.7.1, one model repository of fifteen models, default settings (one
             inference worker) but `debug: false`: mlserver-sklearn for scikit-learn (joblib files
             converted from the skops ones), a user's custom runtime for the other four stacks
             (`loadtests.density.mlserver_runtime`); its own virtual environment (--mlserver-venv),
             with torch, onnxruntime, tensorflow-cpu and keras at our versions
  ours       bench_consolidation's `consolidated` scenario (embedded Ray, one endpoint of fifteen
             containers, 0.1 CPU each), timed from the start of its driver process; then, per
             container, what its Ray worker (Serve replica and supervisor) and its container process
             hold, and both processes' memory by package for one container of each stack

Every wait is bounded; everything started is stopped at the end of its scenario, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.bench_consolidation import _containers, _machine
from loadtests.density import mlserver, report
from loadtests.density import smaps as by_package
from loadtests.density.imports import import_costs, outside_sharers
from loadtests.density.loaders import bare
from loadtests.harness.processes import BenchError, Processes, http, log
from loadtests.harness.proctree import idle_cpu, process_tree, smaps, title
from loadtests.harness.results import ROOT, package_versions, write_results, write_section
from loadtests.harness.stats import answers_match

IDLE_WINDOW_S = 30
SETTLE_S = 10
START_TIMEOUT_S = 600
PAGE = ROOT / "docs" / "benchmarks" / "bench_density.md"
RESULTS = ROOT / "loadtests" / "results" / "bench_density.json"


def _measure(root: int) -> dict[str, Any]:
    """Memory of `root`'s process tree (each process, and the largest one by package), then its
    idle CPU."""
    processes = []
    for pid in process_tree(root):
        info = smaps(pid)
        if info is not None:
            processes.append({"pid": pid, "title": title(pid)[:120] or "gone", **info})
    largest = max(processes, key=lambda p: p["pss"])
    packages = by_package.read(largest["pid"])
    return {
        "outside_sharers": outside_sharers([p["pid"] for p in processes]),
        "total_pss": sum(p["pss"] for p in processes),
        "processes": processes,
        "largest_packages": packages,
        "idle_cpu_cores": idle_cpu(IDLE_WINDOW_S, root),
    }


def _matches(got: Any, want: Any) -> bool:
    return answers_match(bare(got), bare(want))


def run_floor(models: Path, containers: list[dict[str, Any]], workdir: Path) -> dict[str, Any]:
    expected = json.loads((models / "expected.json").read_text())
    spec = workdir / "floor.containers.json"
    spec.write_text(json.dumps(containers))
    processes = Processes()
    started = time.monotonic()
    try:
        process = processes.start(
            [sys.executable, "-m", "loadtests.density.floor", str(models), str(spec)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(workdir / "floor.log", "wb"),
        )
        ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
        line = process.stdout.readline() if ready else b""
        if not line:
            raise BenchError(f"the floor did not answer; see {workdir / 'floor.log'}")
        startup = time.monotonic() - started
        answers = json.loads(line)["answers"]
        answered = sum(
            _matches(
                answers.get(c["ContainerHostname"]),
                expected[Path(c["ModelDataUrl"]).name]["response"],
            )
            for c in containers
        )
        time.sleep(SETTLE_S)
        return {"startup_s": startup, "answered": answered, **_measure(process.pid)}
    finally:
        processes.stop_all()


def run_mlserver(
    models: Path, containers: list[dict[str, Any]], workdir: Path, venv: Path
) -> dict[str, Any]:
    from loadtests.batching.over_http import mlserver_ensure_frameworks
    from loadtests.harness.peers import ensure_mlserver, mlserver_versions

    binary = ensure_mlserver(venv)
    mlserver_ensure_frameworks(venv)
    mlserver.ensure_tensorflow(venv)
    expected = json.loads((models / "expected.json").read_text())
    root = workdir / "mlserver"  # built by `prepare`
    processes = Processes()
    log_file = workdir / "mlserver.log"
    started = time.monotonic()
    try:
        process, url = mlserver.start(binary, root, log_file, processes)
        pending, answered = {c["ContainerHostname"]: c for c in containers}, 0
        while pending and time.monotonic() - started < START_TIMEOUT_S:
            if process.poll() is not None:
                raise BenchError(f"MLServer exited with {process.returncode}; see {log_file}")
            for name, container in list(pending.items()):
                try:
                    if http("GET", f"{url}/v2/models/{name}/ready", timeout=2)[0] != 200:
                        continue
                except OSError:
                    continue
                want = expected[Path(container["ModelDataUrl"]).name]
                body = json.dumps(mlserver.v2_request(container, want["request"]))
                status, text = http(
                    "POST",
                    f"{url}/v2/models/{name}/infer",
                    body,
                    {"Content-Type": "application/json"},
                    timeout=60,
                )
                got = (
                    mlserver.v2_answer(json.loads(text), want["response"])
                    if status == 200
                    else None
                )
                if _matches(got, want["response"]):
                    answered += 1
                else:
                    log(f"  mlserver {name}: unexpected answer {status} {text[:300]!r}")
                del pending[name]
            time.sleep(0.1)
        if pending:
            raise BenchError(f"MLServer models not ready: {sorted(pending)}; see {log_file}")
        startup = time.monotonic() - started
        time.sleep(SETTLE_S)
        return {
            "startup_s": startup,
            "answered": answered,
            "versions": mlserver_versions(venv),
            **_measure(process.pid),
        }
    finally:
        processes.stop_all()


def run_ours(
    models: Path, containers: list[dict[str, Any]], workdir: Path, sandbox_read: str
) -> dict[str, Any]:
    """bench_consolidation's `consolidated` scenario in a child process (the Ray driver), timed
    from its start."""
    for container in containers:  # the container process imports `serving` from this checkout
        container["Environment"] = {
            **container.get("Environment", {}),
            "SERVING_SANDBOX_READ": sandbox_read,
        }
    spec, result = workdir / "ours.containers.json", workdir / "ours.result.json"
    spec.write_text(json.dumps(containers))
    command = [sys.executable, "-m", "loadtests.bench_density", "--child-ours", str(models)]
    processes = Processes()
    started, started_wall = time.monotonic(), time.time()
    try:
        with (workdir / "ours.log").open("wb") as out:
            child = processes.start(
                command + [str(spec), str(result)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
            )
            child.wait(START_TIMEOUT_S + 120)
    except subprocess.TimeoutExpired:
        raise BenchError(f"ours did not finish; see {workdir / 'ours.log'}") from None
    finally:
        processes.stop_all()
    if child.returncode != 0 or not result.exists():
        tail = (workdir / "ours.log").read_text(errors="replace")[-3000:]
        raise BenchError(f"ours failed (exit {child.returncode}):\n{tail}")
    outcome = json.loads(result.read_text())
    outcome["total_startup_s"] = outcome["answered_at"] - started_wall
    outcome["wall_s"] = time.monotonic() - started
    return outcome


def _child_ours(models: str, spec: str, result: str) -> int:
    from loadtests.bench_consolidation import run_scenario
    from loadtests.density.ours import per_container

    containers = json.loads(Path(spec).read_text())
    outcome = run_scenario("consolidated", Path(models), containers, extra=per_container)
    Path(result).write_text(json.dumps(outcome))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenarios", default=",".join(report.SCENARIOS))
    parser.add_argument("--out", type=Path, default=RESULTS, help="results JSON")
    parser.add_argument(
        "--write-docs", action="store_true", help=f"(re)write {PAGE.name}'s section"
    )
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="only rewrite the docs from a results file"
    )
    parser.add_argument("--mlserver-venv", type=Path, default=ROOT / ".bench" / "mlserver-venv")
    parser.add_argument(
        "--sandbox-read",
        default=str(ROOT),
        help="SERVING_SANDBOX_READ for our containers (default: this checkout, so a git worktree works)",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0,
        metavar="S",
        help="first wait up to S seconds for the 1-minute load average to drop below 1",
    )
    parser.add_argument("--child-ours", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_ours:
        return _child_ours(*args.child_ours)
    if args.render:
        saved = json.loads(args.render.read_text())
        _write_docs(report.docs_section(saved["results"], saved["meta"]))
        return 0
    waited = time.monotonic()
    while os.getloadavg()[0] >= 1.0 and time.monotonic() - waited < args.wait_quiet:
        time.sleep(10)
    scenarios = [s for s in args.scenarios.split(",") if s]
    if set(scenarios) - set(report.SCENARIOS):
        parser.error(f"scenarios are {', '.join(report.SCENARIOS)}")
    meta: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "loadtests.bench_density", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine_before": _machine(),
        "versions": package_versions(
            ("ray", "torch", "tensorflow-cpu", "keras", "onnxruntime", "scikit-learn", "numpy")
        ),
    }
    began = time.monotonic()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-density-") as tmp:
        workdir = Path(tmp)
        models = workdir / "models"
        log("training the fifteen models, building MLServer's repository ...")
        spec = workdir / "containers.json"
        spec.write_text(json.dumps(_containers(models)))
        with (workdir / "prepare.log").open("wb") as out:
            subprocess.run(
                [sys.executable, "-m", "loadtests.density.prepare", str(models), str(spec)]
                + [str(workdir / "mlserver")],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=600,
            )
        for scenario in scenarios:
            log(f"scenario {scenario} ...")
            load_before = os.getloadavg()[0]
            containers = _containers(models)
            if scenario == "floor":
                results[scenario] = run_floor(models, containers, workdir)
            elif scenario == "mlserver":
                results[scenario] = run_mlserver(models, containers, workdir, args.mlserver_venv)
            else:
                results[scenario] = run_ours(models, containers, workdir, args.sandbox_read)
            results[scenario]["load"] = [load_before, os.getloadavg()[0]]
            row = report.row(scenario, results[scenario])
            log(
                f"  {row['answered']}/15 answering, start-up {row['startup_s']:.1f} s, "
                f"{row['pss_mb']:,.0f} MiB PSS, idle {row['idle_cpu_cores']:.3f} cores"
            )
        log("what importing each framework costs a fresh Python ...")
        results["imports"] = import_costs()
    meta["duration_s"] = time.monotonic() - began
    meta["machine_after"] = _machine()
    section = report.docs_section(results, meta)
    print(section)
    write_results(args.out, {"meta": meta, "results": results})
    if args.write_docs:
        if set(scenarios) != set(report.SCENARIOS):
            print("not writing docs: a partial run (--scenarios)")
        else:
            _write_docs(section)
    return 0


def _write_docs(section: str) -> None:
    write_section(PAGE, "bench_density", section)
    log(f"wrote {PAGE.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
