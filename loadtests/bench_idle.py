"""Idle cost and start-up: what an endpoint costs while nobody calls it, and how long it takes to come up.

    .venv/bin/python -m loadtests.bench_idle [--window 60] [--out FILE.json] [--write-docs] [--render FILE.json]

Serves, each on a fresh embedded Ray in a child process (the Ray driver, so its process tree holds exactly what
the scenario started):

  one        one scikit-learn container (the first of examples/fifteen.yaml)
  fifteen    the fifteen containers of examples/fifteen.yaml (three per stack), one Direct endpoint

each twice: with this runtime's settings for the embedded Ray ("ours": docs/benchmarks/bench_idle.md), and with
Ray's defaults for the variables it sets (`RAY_worker_niceness=15`, `RAY_SERVE_METRICS_EXPORT_INTERVAL_MS=100`,
no `RAY_preload_python_modules`, the log monitor's `RAY_LOG_MONITOR_MANY_FILES_THRESHOLD=1000` and
`LOG_NAME_UPDATE_INTERVAL_S=0.5`): the baseline, measured in the same run. The models are trained from
scikit-learn's bundled data into a temporary folder (examples/train_hetero.py); every container reserves
Resources.Cpus 0.1. Each scenario measures:

  start-up   seconds from the first deploy call to every container InService (Ray and the endpoint server are
             started first and timed apart), and every container's sample answer checked
  idle CPU   CPU seconds per second of every process of the tree over `--window` seconds without requests,
             by role (Ray's system processes, the Serve controller, the registry, the gateway, replicas, their
             container processes), after 10 s to settle
  memory     PSS summed over the tree (from /proc/PID/smaps_rollup)

The code changes that cut idle work (the gateway's long poll of the registry, the registry's slower status
reads when nothing changes, the API's ticks only while something is under way, the supervisors' backing off
from idle containers' counters) are in both runs: the baseline isolates the Ray/Serve settings only; the run
before those changes is quoted from bench_consolidation's last results. Run it on a quiet machine (`uptime`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.bench_consolidation import _check_answers, _containers
from loadtests.harness.models import hetero_models
from loadtests.harness.proctree import parent_of, process_cpu_seconds, process_tree, smaps, title
from loadtests.harness.results import (
    ROOT,
    machine_facts,
    package_versions,
    write_results,
    write_section,
)

# Ray's own values for what the embedded Ray sets (serving/ray_wing/cluster.py,
# EMBEDDED_RAY_ENVIRONMENT)
RAY_DEFAULTS = {
    "RAY_worker_niceness": "15",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "100",
    "RAY_preload_python_modules": "",
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "1000",
    "LOG_NAME_UPDATE_INTERVAL_S": "0.5",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1",
    "RAY_USAGE_STATS_ENABLED": "1",
}
SETTINGS = {"ours": {}, "ray-defaults": RAY_DEFAULTS}
SCENARIOS = {"one": 1, "fifteen": 15}
SETTLE_S = 10
READY_TIMEOUT_S = 600
RESULTS = ROOT / "loadtests" / "results" / "bench_idle.json"
# issue 18's targets for the fifteen-container endpoint
TARGET_IDLE_CORES, TARGET_STARTUP_S = 0.05, 30.0


# --- measurements, inside the scenario's child process --------------------------------------------
def role(pid: int) -> str:
    """What a process of the tree is; a container process counts as its replica's container."""
    if pid == os.getpid():
        return "driver"
    command = title(pid)
    if "ray::NodeGateway" in command or "ServeReplica:serving-gateway" in command:
        return "gateway"
    if "ServeReplica:" in command:
        return "replicas"
    if "ServeController" in command:
        return "serve-controller"
    if "ray::Registry" in command:
        return "registry"
    parent = parent_of(pid)
    if parent is not None and "ServeReplica:" in title(parent):
        return "container processes"
    return "ray system"


def _cpu_seconds() -> dict[int, tuple[str, float]]:
    seen = {}
    for pid in process_tree():
        try:
            seen[pid] = (role(pid), process_cpu_seconds(pid))
        except OSError:
            continue
    return seen


def cpu_by_role(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds between two readings, by role (a process that started meanwhile counts whole; one
    that ended meanwhile is not seen)."""
    seconds: dict[str, float] = {}
    for pid, (name, used) in after.items():
        seconds[name] = seconds.get(name, 0.0) + used - before.get(pid, (name, 0.0))[1]
    return dict(sorted(seconds.items(), key=lambda item: -item[1]))


def idle_by_role(window: float) -> dict[str, float]:
    """Cores used on average over `window` seconds, by role."""
    before = _cpu_seconds()
    started = time.monotonic()
    time.sleep(window)
    used = cpu_by_role(before, _cpu_seconds())
    elapsed = time.monotonic() - started
    return {name: seconds / elapsed for name, seconds in used.items()}


def run_scenario(scenario: str, models: Path, window: float) -> dict[str, Any]:
    from loadtests.harness.servers import in_process
    from serving.config.spec import parse_spec

    expected = json.loads((models / "expected.json").read_text())
    containers = _containers(models)[: SCENARIOS[scenario]]
    document = {"EndpointName": f"idle-{scenario}", "Containers": containers}
    targets = [
        (document["EndpointName"], c["ContainerHostname"], Path(c["ModelDataUrl"]).name)
        for c in containers
    ]
    started = time.monotonic()
    with in_process(
        num_cpus=2, ready_timeout_s=READY_TIMEOUT_S, invocation_timeout_s=60.0
    ) as server:
        server_s = time.monotonic() - started
        cpu_before = _cpu_seconds()
        deploy_started = time.monotonic()
        server.deploy(parse_spec(document))
        readiness = server.wait_ready()
        if not readiness.ready:
            raise RuntimeError(readiness.explain())
        startup_s = time.monotonic() - deploy_started
        startup_cpu = cpu_by_role(cpu_before, _cpu_seconds())
        answered = _check_answers(server.url, targets, expected)
        time.sleep(SETTLE_S)
        pss = sum((smaps(pid) or {"pss": 0})["pss"] for pid in process_tree())
        cores = idle_by_role(window)
        return {
            "containers": len(containers),
            "answered": answered,
            "server_start_s": server_s,
            "startup_s": startup_s,
            "startup_cpu_by_role": startup_cpu,
            "idle_cores": sum(cores.values()),
            "idle_by_role": cores,
            "pss_mib": pss / 2**20,
            "window_s": window,
        }


# --- orchestration --------------------------------------------------------------------------------
def _spawn(
    scenario: str, setting: str, models: Path, window: float, workdir: Path
) -> dict[str, Any]:
    result = workdir / f"{scenario}-{setting}.json"
    log = workdir / f"{scenario}-{setting}.log"
    environment = {**os.environ, **SETTINGS[setting]}
    command = [
        sys.executable,
        "-m",
        "loadtests.bench_idle",
        "--child",
        scenario,
        "--models",
        str(models),
        "--window",
        str(window),
        "--result",
        str(result),
    ]
    with log.open("w") as out:
        child = subprocess.Popen(
            command,
            cwd=ROOT,
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            child.wait(READY_TIMEOUT_S + window + 120)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 15)  # the child and the Ray processes it started
            child.wait(30)
    text = log.read_text()
    for line in text.splitlines():
        if "unexpected answer" in line:
            print(line, flush=True)
    if child.returncode != 0 or not result.exists():
        raise RuntimeError(
            f"{scenario}/{setting} failed (exit {child.returncode}):\n{text[-3000:]}"
        )
    return json.loads(result.read_text())


def docs_section(saved: dict[str, Any]) -> str:
    meta, runs = saved["meta"], saved["runs"]
    lines = [
        "## Idle cost and start-up",
        "",
        "What an endpoint costs while nobody calls it, and how long the fifteen-container example takes to come up.",
        "Written by `python -m loadtests.bench_idle --write-docs` (its docstring has the method): each scenario on a fresh",
        "embedded Ray, with this runtime's settings for it and with Ray's defaults for the same variables (the",
        "baseline, same run); idle CPU over "
        f"{runs['one']['ours']['window_s']:.0f} s without requests, after 10 s to settle.",
        "",
        "| endpoint | settings | containers answering | start-up (deploy → InService) | idle CPU (cores) | PSS, all processes |",
        "|---|---|---|---|---|---|",
    ]
    for scenario, by_setting in runs.items():
        for setting, run in by_setting.items():
            lines.append(
                f"| {scenario} | {setting} | {run['answered']}/{run['containers']} | {run['startup_s']:.1f} s | "
                f"{run['idle_cores']:.3f} | {run['pss_mib']:,.0f} MiB |"
            )
    roles = sorted(
        {name for by in runs.values() for run in by.values() for name in run["idle_by_role"]}
    )
    lines += [
        "",
        "Idle CPU by role (cores):",
        "",
        "| endpoint | settings | " + " | ".join(roles) + " |",
        "|---|---|" + "---|" * len(roles),
    ]
    for scenario, by_setting in runs.items():
        for setting, run in by_setting.items():
            cells = " | ".join(f"{run['idle_by_role'].get(name, 0.0):.4f}" for name in roles)
            lines.append(f"| {scenario} | {setting} | {cells} |")
    if all("startup_cpu_by_role" in run for by in runs.values() for run in by.values()):
        lines += [
            "",
            "CPU seconds used during start-up (deploy → InService), by role: on 2 cores, start-up takes at "
            "least half their sum.",
            "",
            "| endpoint | settings | all | " + " | ".join(roles) + " |",
            "|---|---|---|" + "---|" * len(roles),
        ]
        for scenario, by_setting in runs.items():
            for setting, run in by_setting.items():
                used = run["startup_cpu_by_role"]
                cells = " | ".join(f"{used.get(name, 0.0):.1f}" for name in roles)
                lines.append(f"| {scenario} | {setting} | {sum(used.values()):.1f} | {cells} |")
    fifteen = runs["fifteen"]["ours"]
    base = runs["fifteen"]["ray-defaults"]
    lines += [
        "",
        f"Fifteen containers, ours over Ray's defaults: idle CPU {fifteen['idle_cores'] / base['idle_cores']:.2f}×, "
        f"start-up {fifteen['startup_s'] / base['startup_s']:.2f}×. Targets (issue 18): idle ≤ {TARGET_IDLE_CORES} "
        f"cores — {'met' if fifteen['idle_cores'] <= TARGET_IDLE_CORES else 'not met'}; start-up ≤ "
        f"{TARGET_STARTUP_S:.0f} s — {'met' if fifteen['startup_s'] <= TARGET_STARTUP_S else 'not met'}.",
        "",
        f"Run: `{meta['command']}` at {meta['started']} ({meta['duration_s']:.0f} s); load average before "
        f"{meta['machine_before']['loadavg_at_start']}, after {meta['machine_after']['loadavg_at_start']}; "
        f"{meta['machine_before']['nproc']} CPUs ({meta['machine_before']['cpu_model']}). Results: `loadtests/results/bench_idle.json`.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--window", type=float, default=60.0, help="idle measurement window, seconds"
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="only rewrite the docs section from results"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        Path(args.result).write_text(
            json.dumps(run_scenario(args.child, Path(args.models), args.window))
        )
        return 0
    if args.render:
        write_section(
            ROOT / "docs" / "benchmarks" / "bench_idle.md",
            "bench_idle",
            docs_section(json.loads(args.render.read_text())),
        )
        return 0
    meta: dict[str, Any] = {
        "command": " ".join(["python", "-m", "loadtests.bench_idle", *sys.argv[1:]]),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine_before": machine_facts(),
        "versions": package_versions(
            ("ray", "torch", "tensorflow-cpu", "onnxruntime", "scikit-learn")
        ),
    }
    began = time.monotonic()
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        workdir = Path(tmp)
        models = workdir / "models"
        hetero_models(models)
        for scenario in [s for s in args.scenarios.split(",") if s]:
            for setting in SETTINGS:
                print(f"{scenario} / {setting} ...", flush=True)
                run = runs.setdefault(scenario, {})[setting] = _spawn(
                    scenario, setting, models, args.window, workdir
                )
                print(
                    f"  start-up {run['startup_s']:.1f} s, idle {run['idle_cores']:.3f} cores "
                    f"{json.dumps({k: round(v, 4) for k, v in run['idle_by_role'].items()})}",
                    flush=True,
                )
    meta["duration_s"] = time.monotonic() - began
    meta["machine_after"] = machine_facts()
    saved = {"meta": meta, "runs": runs}
    write_results(args.out, saved)
    if set(runs) == set(SCENARIOS):
        section = docs_section(saved)
        print(section)
        if args.write_docs:
            write_section(ROOT / "docs" / "benchmarks" / "bench_idle.md", "bench_idle", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
