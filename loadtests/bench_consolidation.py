"""Consolidation benchmark: one 15-container endpoint against fifteen single-model endpoints.

    .venv/bin/python -m loadtests.bench_consolidation [--out FILE.json] [--write-docs]
                                                      [--scenarios consolidated,separate-endpoints,separate-servers]

Serves the fifteen models of examples/fifteen.yaml (trained by examples/train_hetero.py from
scikit-learn's bundled data into a temporary folder; three of each stack: sklearn, pytorch,
tensorflow, onnx, python), each container reserving Resources.Cpus 0.1, in three ways:

  consolidated        one embedded Ray, one endpoint with the 15 containers (Direct)
  separate-endpoints  one embedded Ray, 15 endpoints of one container each
  separate-servers    15 embedded Rays, one after another, each serving one single-container
                      endpoint: what 15 single-model endpoints on their own machines (SageMaker's
                      one-instance-per-endpoint case) cost, measured one at a time and summed

Each scenario runs in a child process that is the Ray driver, so that it starts from a fresh
Ray and its process tree holds exactly what the scenario started. It measures:

  start-up   seconds from the first deploy call to every endpoint InService (Ray and the
             endpoint server are started first and timed separately)
  memory     PSS (proportional set size, from /proc/PID/smaps_rollup) summed over the
             driver (what `serving up` is) and every process it started (GCS, raylet, agents,
             Serve controller, registry, gateway, replicas, idle workers), and per replica grouped
             by stack, with USS
             (memory no other process shares) as the marginal cost of one more replica
  idle CPU   CPU seconds all those processes use per second over 30 s without requests
  reserved   logical CPUs the containers reserve from Ray

Every wait is bounded; everything a scenario starts is stopped at its end (also on failure).
The numbers depend on the machine's load: run it when nothing else is running (`uptime`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.consolidation.report import SCENARIOS, docs_section, summarize
from loadtests.harness.models import hetero_models
from loadtests.harness.proctree import idle_cpu, parent_of, process_tree, smaps
from loadtests.harness.results import ROOT, package_versions, write_section
from loadtests.harness.stats import answers_match

FIFTEEN_SPEC = ROOT / "examples" / "fifteen.yaml"
READY_TIMEOUT_S = 600
IDLE_WINDOW_S = 30
SETTLE_S = 10
CPUS_PER_CONTAINER = 0.1


def _containers(models: Path) -> list[dict[str, Any]]:
    """examples/fifteen.yaml's containers, with model paths in `models` and the benchmark's
    reservation."""
    import yaml

    document = yaml.safe_load(FIFTEEN_SPEC.read_text())
    containers = []
    for container in document["Containers"]:
        container = dict(container)
        container["ModelDataUrl"] = str(models / Path(container["ModelDataUrl"]).name)
        container["Resources"] = {"Cpus": CPUS_PER_CONTAINER}
        containers.append(container)
    return containers


# --- measurements (run inside the scenario's child process), from /proc -------------------------
def _role(pid: int, stacks: dict[str, str]) -> str:
    """What a process of the Ray tree is: a replica's stack, or a part of Ray/Serve/serving."""
    if pid == os.getpid():
        return "driver"
    try:
        title = (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .strip()
        )
    except OSError:
        return "gone"
    if "ray::NodeGateway" in title or "ServeReplica:serving-gateway" in title:
        return "gateway"
    if "ServeReplica:" in title:  # ray::ServeReplica:<endpoint>.<container>.<version>:<container>
        deployment = title.split("ServeReplica:", 1)[1].split()[0].rsplit(":", 1)[-1]
        return "replica:" + stacks.get(deployment, "unknown")
    parent = parent_of(pid)  # a replica's container process, where the model lives
    if (
        parent is not None
        and parent != os.getpid()
        and _role(parent, stacks).startswith("replica:")
    ):
        return "container:" + _role(parent, stacks).split(":", 1)[1]
    if "ServeController" in title:
        return "serve-controller"
    if "ray::Registry" in title:
        return "registry"
    if "ray::IDLE" in title:
        return "idle-worker"
    return "ray-system"


def _memory(stacks: dict[str, str]) -> dict[str, Any]:
    total_pss = 0
    groups: dict[str, list[dict[str, int]]] = {}
    for pid in process_tree():
        info = smaps(pid)
        if info is None:  # exited meanwhile
            continue
        total_pss += info["pss"]
        groups.setdefault(_role(pid, stacks), []).append(info)
    return {"total_pss": total_pss, "groups": groups}


def _check_answers(url: str, targets: list[tuple[str, str, str]], expected: dict[str, Any]) -> int:
    """Invoke every container once with its sample request; how many gave the expected answer."""
    import httpx

    ok = 0
    for endpoint, hostname, model in targets:
        response = httpx.post(
            f"{url}/endpoints/{endpoint}/invocations",
            json=expected[model]["request"],
            timeout=60,
            headers={"X-Amzn-SageMaker-Target-Container-Hostname": hostname},
        )
        got, want = (
            (response.json() if response.status_code == 200 else None),
            expected[model]["response"],
        )
        if isinstance(got, dict) and set(got) == {"predictions"} and isinstance(want, list):
            # the tensorflow stack answers as TFS does; the trainer kept the bare rows
            got = got["predictions"]
        if response.status_code == 200 and answers_match(got, want):
            ok += 1
        else:
            print(
                f"  {endpoint}/{hostname}: unexpected answer {response.status_code} {response.text[:300]}",
                flush=True,
            )
    return ok


def run_scenario(
    name: str, models: Path, containers: list[dict[str, Any]], extra: Any = None
) -> dict[str, Any]:
    """Start Ray + the endpoint server, deploy, measure, stop. Runs in a child process. `extra(stacks)`
    measures more (bench_density), after the idle window so as not to count in it."""
    from loadtests.harness.servers import in_process
    from serving.config.spec import parse_spec

    expected = json.loads((models / "expected.json").read_text())
    if name == "consolidated":
        documents = [{"EndpointName": "fifteen", "Containers": containers}]
    else:
        documents = [
            {"EndpointName": f"single-{c['ContainerHostname']}", "Containers": [c]}
            for c in containers
        ]
    targets = [
        (d["EndpointName"], c["ContainerHostname"], Path(c["ModelDataUrl"]).name)
        for d in documents
        for c in d["Containers"]
    ]
    stacks = {c["ContainerHostname"]: c["Image"] for c in containers}
    load_start = os.getloadavg()[0]
    started = time.monotonic()
    with in_process(
        num_cpus=2, ready_timeout_s=READY_TIMEOUT_S, invocation_timeout_s=60.0
    ) as server:
        url = server.url
        server_s = time.monotonic() - started
        specs = [parse_spec(document) for document in documents]
        deploy_started = time.monotonic()
        for spec in specs:
            server.deploy(spec)
        readiness = server.wait_ready()
        if not readiness.ready:
            raise RuntimeError(readiness.explain())
        startup_s = time.monotonic() - deploy_started
        answered = _check_answers(url, targets, expected)
        answered_at = time.time()  # wall clock: bench_density times from its own start
        time.sleep(SETTLE_S)
        memory = _memory(stacks)
        idle_cores = idle_cpu(IDLE_WINDOW_S if len(containers) > 1 else IDLE_WINDOW_S / 3)
        return {
            "scenario": name,
            "containers": len(containers),
            "endpoints": len(documents),
            "load_start": load_start,
            "load_end": os.getloadavg()[0],
            "server_start_s": server_s,
            "startup_s": startup_s,
            "answered": answered,
            "memory": memory,
            "idle_cpu_cores": idle_cores,
            "reserved_cpus": CPUS_PER_CONTAINER * len(containers),
            "answered_at": answered_at,
            **({"extra": extra(stacks)} if extra else {}),
        }


def _child(args: argparse.Namespace) -> int:
    containers = json.loads(Path(args.containers).read_text())
    result = run_scenario(args.child, Path(args.models), containers)
    Path(args.result).write_text(json.dumps(result))
    return 0


# --- orchestration (parent process) ---------------------------------------------------------
def _spawn(
    scenario: str,
    models: Path,
    containers: list[dict[str, Any]],
    workdir: Path,
    tag: str,
    attempts: int = 2,
) -> dict[str, Any]:
    """Run one scenario in a child process; once more if it fails or hangs (a `ray.init` can hang on
    a machine where other Ray instances come and go)."""
    spec_file = workdir / f"{tag}.containers.json"
    result_file = workdir / f"{tag}.result.json"
    log_file = workdir / f"{tag}.log"
    spec_file.write_text(json.dumps(containers))
    command = [
        sys.executable,
        "-m",
        "loadtests.bench_consolidation",
        "--child",
        scenario,
        "--models",
        str(models),
        "--containers",
        str(spec_file),
        "--result",
        str(result_file),
    ]
    timeout = 240 + 40 * len(containers)
    for attempt in range(1, attempts + 1):
        with log_file.open("w") as log:
            child = subprocess.Popen(
                command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, 15)  # the child and the Ray processes it started
                child.wait(30)
        if child.returncode == 0 and result_file.exists():
            return json.loads(result_file.read_text())
        print(
            f"  {tag}: attempt {attempt} failed (exit {child.returncode}):\n{log_file.read_text()[-2000:]}",
            flush=True,
        )
    raise RuntimeError(f"scenario {scenario} ({tag}) failed {attempts} times")


def _machine() -> dict[str, Any]:
    total_kib = int(Path("/proc/meminfo").read_text().split("MemTotal:", 1)[1].split()[0])
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(total_kib / 2**20, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--out", type=Path, help="write all results as JSON")
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="(re)write this benchmark's section of docs/benchmarks/bench_consolidation.md",
    )
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="only rewrite the docs section from a results file an earlier run wrote with --out",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=15,
        help="serve only the first N containers (a quick smoke run)",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0,
        metavar="S",
        help="first wait up to S seconds for the 1-minute load average to drop below 1",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", help=argparse.SUPPRESS)
    parser.add_argument("--containers", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)
    if args.render:
        saved = json.loads(args.render.read_text())
        _write_docs(docs_section(saved["summary"], saved["meta"]))
        return 0

    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    waited = time.monotonic()
    while (
        args.wait_quiet
        and os.getloadavg()[0] >= 1.0
        and time.monotonic() - waited < args.wait_quiet
    ):
        time.sleep(10)
    meta: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine_before": _machine(),
        "versions": package_versions(
            ("ray", "torch", "tensorflow-cpu", "keras", "onnxruntime", "scikit-learn", "numpy")
        ),
    }
    began = time.monotonic()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-consolidation-") as tmp:
        workdir = Path(tmp)
        models = workdir / "models"
        print("training the fifteen models ...", flush=True)
        hetero_models(models)
        containers = _containers(models)[: args.limit]
        for scenario in scenarios:
            print(f"scenario {scenario} ...", flush=True)
            if scenario == "separate-servers":
                results[scenario] = []
                for index, container in enumerate(containers):
                    run = _spawn(scenario, models, [container], workdir, f"{scenario}-{index}")
                    print(
                        f"  {container['ContainerHostname']}: start-up {run['startup_s']:.1f} s, "
                        f"{run['memory']['total_pss'] / 2**20:.0f} MiB",
                        flush=True,
                    )
                    results[scenario].append(run)
            else:
                results[scenario] = _spawn(scenario, models, containers, workdir, scenario)
                print(
                    f"  start-up {results[scenario]['startup_s']:.1f} s, "
                    f"{results[scenario]['memory']['total_pss'] / 2**20:.0f} MiB",
                    flush=True,
                )
    meta["duration_s"] = time.monotonic() - began
    meta["machine_after"] = _machine()
    summary = summarize(results)
    report = docs_section(summary, meta)
    print(report)
    if args.out:
        args.out.write_text(
            json.dumps({"meta": meta, "summary": summary, "results": results}, indent=1)
        )
    if args.write_docs:
        if len(containers) < 15 or set(scenarios) != set(SCENARIOS):
            print("not writing docs: a partial run (--limit or --scenarios)")
        else:
            _write_docs(report)
    return 0


def _write_docs(section: str) -> None:
    write_section(
        ROOT / "docs" / "benchmarks" / "bench_consolidation.md", "bench_consolidation", section
    )
    print("wrote docs/benchmarks/bench_consolidation.md")


if __name__ == "__main__":
    sys.exit(main())
