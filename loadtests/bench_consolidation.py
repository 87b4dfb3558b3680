"""Consolidation benchmark: one 15-container endpoint against fifteen single-model endpoints.

    .venv/bin/python loadtests/bench_consolidation.py [--out FILE.json] [--write-docs]
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
import importlib.metadata as metadata
import importlib.util
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIFTEEN_SPEC = ROOT / "examples" / "fifteen.yaml"
SCENARIOS = ("consolidated", "separate-endpoints", "separate-servers")
READY_TIMEOUT_S = 600
IDLE_WINDOW_S = 30
SETTLE_S = 10
CPUS_PER_CONTAINER = 0.1
# Everything that is not a container replica: what each separate endpoint server pays again.
SYSTEM_ROLES = ("driver", "ray-system", "serve-controller", "registry", "gateway", "idle-worker")


def _containers(models: Path) -> list[dict[str, Any]]:
    """examples/fifteen.yaml's containers, with model paths in `models` and the benchmark's reservation."""
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
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state; comm may hold spaces


def _tree() -> list[int]:
    """This driver (what `serving up` is) and every process it started: Ray's, Serve's, the replicas."""
    parents = {int(entry.name): _parent_of(int(entry.name)) for entry in Path("/proc").iterdir() if entry.name.isdigit()}
    tree, frontier = [os.getpid()], [os.getpid()]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        tree += children
        frontier = children
    return tree


def _role(pid: int, stacks: dict[str, str]) -> str:
    """What a process of the Ray tree is: a replica's stack, or a part of Ray/Serve/serving."""
    if pid == os.getpid():
        return "driver"
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "gone"
    if "ServeReplica:serving-gateway" in title:
        return "gateway"
    if "ServeReplica:" in title:
        deployment = title.split("ServeReplica:", 1)[1].split()[0].split(".")[0].split(":")[-1]
        return "replica:" + stacks.get(deployment, "unknown")
    if "ServeController" in title:
        return "serve-controller"
    if "ray::Registry" in title:
        return "registry"
    if "ray::IDLE" in title:
        return "idle-worker"
    return "ray-system"


def _smaps(pid: int) -> dict[str, int] | None:
    """PSS, USS (private pages) and RSS of a process, in bytes, from /proc/PID/smaps_rollup."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kib = {}
    for line in text.splitlines()[1:]:
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            kib[key] = int(value.split()[0])
    return {"pss": kib.get("Pss", 0) * 1024, "rss": kib.get("Rss", 0) * 1024,
            "uss": (kib.get("Private_Clean", 0) + kib.get("Private_Dirty", 0)) * 1024}


def _memory(stacks: dict[str, str]) -> dict[str, Any]:
    total_pss = 0
    groups: dict[str, list[dict[str, int]]] = {}
    for pid in _tree():
        info = _smaps(pid)
        if info is None:  # exited meanwhile
            continue
        total_pss += info["pss"]
        groups.setdefault(_role(pid, stacks), []).append(info)
    return {"total_pss": total_pss, "groups": groups}


def _cpu_seconds() -> float:
    total = 0.0
    for pid in _tree():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    return total


def _idle_cpu(window: float) -> float:
    before = _cpu_seconds()
    time.sleep(window)
    return (_cpu_seconds() - before) / window


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_in_service(url: str, names: list[str]) -> float:
    import httpx

    started = time.monotonic()
    pending = set(names)
    while pending:
        if time.monotonic() - started > READY_TIMEOUT_S:
            raise TimeoutError(f"not InService after {READY_TIMEOUT_S} s: {sorted(pending)}")
        for name in list(pending):
            state = httpx.get(f"{url}/endpoints/{name}", timeout=10).json().get("EndpointStatus")
            if state == "Failed":
                raise RuntimeError(f"endpoint {name} failed: {httpx.get(f'{url}/endpoints/{name}').json()}")
            if state == "InService":
                pending.discard(name)
        time.sleep(0.2)
    return time.monotonic() - started


def _check_answers(url: str, targets: list[tuple[str, str, str]], expected: dict[str, Any]) -> int:
    """Invoke every container once with its sample request; how many gave the expected answer."""
    import httpx

    ok = 0
    for endpoint, hostname, model in targets:
        response = httpx.post(f"{url}/endpoints/{endpoint}/invocations", json=expected[model]["request"], timeout=60,
                              headers={"X-Amzn-SageMaker-Target-Container-Hostname": hostname})
        if response.status_code == 200 and _same(response.json(), expected[model]["response"]):
            ok += 1
        else:
            print(f"  {endpoint}/{hostname}: unexpected answer {response.status_code} {response.text[:300]}", flush=True)
    return ok


def _same(got: Any, want: Any, atol: float = 1e-4) -> bool:
    """Nested JSON equal, numbers within `atol` (frameworks differ in the last float32 bits)."""
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        return isinstance(got, (int, float)) and abs(got - want) <= atol
    return got == want


def run_scenario(name: str, models: Path, containers: list[dict[str, Any]]) -> dict[str, Any]:
    """Start Ray + the endpoint server, deploy, measure, stop. Runs in a child process."""
    sys.path.insert(0, str(ROOT))
    from serving import ray_wing
    from serving.config.spec import parse_spec
    from serving.settings import ServerSettings

    expected = json.loads((models / "expected.json").read_text())
    if name == "consolidated":
        documents = [{"EndpointName": "fifteen", "Containers": containers}]
    else:
        documents = [{"EndpointName": f"single-{c['ContainerHostname']}", "Containers": [c]} for c in containers]
    targets = [(d["EndpointName"], c["ContainerHostname"], Path(c["ModelDataUrl"]).name)
               for d in documents for c in d["Containers"]]
    stacks = {c["ContainerHostname"]: c["Image"] for c in containers}
    settings = ServerSettings(port=_free_port(), invocation_timeout_s=60.0)
    load_start = os.getloadavg()[0]
    started = time.monotonic()
    ray_wing.start_local_ray(num_cpus=2)
    try:
        url = ray_wing.start_gateway(settings)
        server_s = time.monotonic() - started
        specs = [parse_spec(document) for document in documents]
        deploy_started = time.monotonic()
        for spec in specs:
            ray_wing.deploy_endpoint(spec, settings)
        _wait_in_service(url, [spec.EndpointName for spec in specs])
        startup_s = time.monotonic() - deploy_started
        answered = _check_answers(url, targets, expected)
        time.sleep(SETTLE_S)
        memory = _memory(stacks)
        idle_cpu = _idle_cpu(IDLE_WINDOW_S if len(containers) > 1 else IDLE_WINDOW_S / 3)
        return {"scenario": name, "containers": len(containers), "endpoints": len(documents), "load_start": load_start,
                "load_end": os.getloadavg()[0],
                "server_start_s": server_s, "startup_s": startup_s, "answered": answered, "memory": memory,
                "idle_cpu_cores": idle_cpu, "reserved_cpus": CPUS_PER_CONTAINER * len(containers)}
    finally:
        ray_wing.shutdown()


def _child(args: argparse.Namespace) -> int:
    containers = json.loads(Path(args.containers).read_text())
    result = run_scenario(args.child, Path(args.models), containers)
    Path(args.result).write_text(json.dumps(result))
    return 0


# --- orchestration (parent process) ---------------------------------------------------------
def _spawn(scenario: str, models: Path, containers: list[dict[str, Any]], workdir: Path, tag: str,
           attempts: int = 2) -> dict[str, Any]:
    """Run one scenario in a child process; once more if it fails or hangs (a `ray.init` can hang on a
    machine where other Ray instances come and go)."""
    spec_file = workdir / f"{tag}.containers.json"
    result_file = workdir / f"{tag}.result.json"
    log_file = workdir / f"{tag}.log"
    spec_file.write_text(json.dumps(containers))
    command = [sys.executable, __file__, "--child", scenario, "--models", str(models), "--containers", str(spec_file),
               "--result", str(result_file)]
    timeout = 240 + 40 * len(containers)
    for attempt in range(1, attempts + 1):
        with log_file.open("w") as log:
            child = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, 15)  # the child and the Ray processes it started
                child.wait(30)
        if child.returncode == 0 and result_file.exists():
            return json.loads(result_file.read_text())
        print(f"  {tag}: attempt {attempt} failed (exit {child.returncode}):\n{log_file.read_text()[-2000:]}", flush=True)
    raise RuntimeError(f"scenario {scenario} ({tag}) failed {attempts} times")


def _train(models: Path) -> None:
    spec = importlib.util.spec_from_file_location("train_hetero", ROOT / "examples" / "train_hetero.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.train(models)


def _per_stack(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    stacks = {}
    for role, entries in result["memory"]["groups"].items():
        if role.startswith("replica:"):
            stacks[role.split(":", 1)[1]] = {
                "replicas": len(entries),
                "pss_mb": statistics.mean(e["pss"] for e in entries) / 2**20,
                "uss_mb": statistics.mean(e["uss"] for e in entries) / 2**20,
                "rss_mb": statistics.mean(e["rss"] for e in entries) / 2**20,
            }
    return stacks


def _group_mb(result: dict[str, Any], role: str) -> float:
    return sum(e["pss"] for e in result["memory"]["groups"].get(role, [])) / 2**20


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("ray", "torch", "tensorflow-cpu", "keras", "onnxruntime", "scikit-learn", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "-"
    return versions


def _machine() -> dict[str, Any]:
    total_kib = int(Path("/proc/meminfo").read_text().split("MemTotal:", 1)[1].split()[0])
    return {"cpus": os.cpu_count(), "memory_gib": round(total_kib / 2**20, 1),
            "load_average": [round(x, 2) for x in os.getloadavg()], "platform": platform.platform()}


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """One row per scenario (separate-servers summed over its fifteen runs) plus per-stack footprints."""
    rows = {}
    for scenario, result in results.items():
        if scenario == "separate-servers":
            runs = result
            rows[scenario] = {
                "load": max(max(r["load_start"], r["load_end"]) for r in runs),
                "endpoints": len(runs), "startup_s": sum(r["startup_s"] for r in runs),
                "startup_max_s": max(r["startup_s"] for r in runs),
                "server_start_s": sum(r["server_start_s"] for r in runs),
                "pss_mb": sum(r["memory"]["total_pss"] for r in runs) / 2**20,
                "idle_cpu_cores": sum(r["idle_cpu_cores"] for r in runs),
                "reserved_cpus": sum(r["reserved_cpus"] for r in runs),
                "answered": sum(r["answered"] for r in runs), "containers": len(runs),
                "system_mb": sum(_group_mb(r, g) for r in runs for g in SYSTEM_ROLES),
            }
        else:
            rows[scenario] = {
                "load": max(result["load_start"], result["load_end"]),
                "endpoints": result["endpoints"], "startup_s": result["startup_s"], "startup_max_s": result["startup_s"],
                "server_start_s": result["server_start_s"], "pss_mb": result["memory"]["total_pss"] / 2**20,
                "idle_cpu_cores": result["idle_cpu_cores"], "reserved_cpus": result["reserved_cpus"],
                "answered": result["answered"], "containers": result["containers"],
                "system_mb": sum(_group_mb(result, g) for g in SYSTEM_ROLES),
            }
    stacks = {}
    if "consolidated" in results:
        stacks["consolidated"] = _per_stack(results["consolidated"])
    if "separate-servers" in results:
        merged: dict[str, list[dict[str, float]]] = {}
        for run in results["separate-servers"]:
            for stack, numbers in _per_stack(run).items():
                merged.setdefault(stack, []).append(numbers)
        stacks["alone"] = {stack: {key: statistics.mean(n[key] for n in entries) for key in ("pss_mb", "uss_mb", "rss_mb")}
                           | {"replicas": len(entries)} for stack, entries in merged.items()}
        stacks["alone_system_mb"] = statistics.mean(
            sum(_group_mb(r, g) for g in SYSTEM_ROLES)
            for r in results["separate-servers"])
    return {"rows": rows, "stacks": stacks}


def markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    rows, stacks = summary["rows"], summary["stacks"]
    lines = ["| scenario | endpoints | containers answering | start-up (deploy → InService) | memory (PSS, all Ray processes) "
             "| of which not replicas | idle CPU (cores) | reserved CPUs | load avg (max seen) |",
             "|---|---|---|---|---|---|---|---|---|"]
    labels = {"consolidated": "one endpoint, {n} containers", "separate-endpoints": "{n} endpoints, one Ray",
              "separate-servers": "{n} endpoints, {n} Rays (summed)"}
    for scenario in SCENARIOS:
        if scenario not in rows:
            continue
        row = rows[scenario]
        startup = f"{row['startup_s']:.1f} s" + (f" (sum; longest {row['startup_max_s']:.1f} s)"
                                                 if scenario == "separate-servers" else "")
        lines.append(f"| {labels[scenario].format(n=row['containers'])} | {row['endpoints']} | {row['answered']}/15 | {startup} | "
                     f"{row['pss_mb']:,.0f} MiB | {row['system_mb']:,.0f} MiB | {row['idle_cpu_cores']:.3f} | "
                     f"{row['reserved_cpus']:.1f} | {row['load']:.1f} |")
    for key, title in (("consolidated", "Per-stack replica footprint in the consolidated endpoint (mean per replica)"),
                       ("alone", "Per-stack replica footprint alone on its own Ray (mean over that stack's runs)")):
        if key not in stacks:
            continue
        lines += ["", f"{title}:", "", "| stack | replicas | PSS | USS | RSS |", "|---|---|---|---|---|"]
        for stack in ("sklearn", "pytorch", "tensorflow", "onnx", "python"):
            if stack in stacks[key]:
                s = stacks[key][stack]
                lines.append(f"| {stack} | {s['replicas']} | {s['pss_mb']:.0f} MiB | {s['uss_mb']:.0f} MiB | {s['rss_mb']:.0f} MiB |")
    if "alone_system_mb" in stacks:
        lines += ["", f"Everything but the replica in one single-container server (driver, Ray, Serve, gateway, registry): {stacks['alone_system_mb']:.0f} MiB PSS."]
    lines += ["", f"Run: `{meta['command']}` at {meta['started']} ({meta['duration_s']:.0f} s); load average before "
              f"{meta['machine_before']['load_average']}, after {meta['machine_after']['load_average']}; "
              f"{meta['machine_before']['cpus']} CPUs, {meta['machine_before']['memory_gib']} GiB.",
              "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + "."]
    return "\n".join(lines) + "\n"


INTRO = """\
## Consolidation: one 15-container endpoint vs fifteen endpoints

SageMaker sells multi-container endpoints as a cost saving (up to 90%) over one endpoint per model. This
section measures what consolidation saves here, on one machine, for the fifteen models of
`examples/fifteen.yaml` (three per stack: scikit-learn, PyTorch, TensorFlow, ONNX, Python), each
container reserving `Resources.Cpus: 0.1`, served three ways: one endpoint with the fifteen containers;
fifteen single-container endpoints on one Ray; and fifteen single-container endpoints each on its own
embedded Ray, started one after another and summed (one endpoint per machine, SageMaker's default).
Memory is PSS (shared pages split between the processes sharing them) over the driver and every
process it started; idle CPU is what all of them use with no requests. Written by
`loadtests/bench_consolidation.py --write-docs` (its docstring has the method); every scenario checks
that all fifteen containers answer their sample request correctly before it is measured.
"""


def savings(summary: dict[str, Any]) -> list[str]:
    """What consolidation saves, as ratios of the same run's scenarios."""
    rows = summary["rows"]
    one = rows.get("consolidated")
    lines = []
    for other, label in (("separate-servers", "fifteen endpoints on their own Ray each"),
                         ("separate-endpoints", "fifteen endpoints sharing one Ray")):
        if one is None or other not in rows:
            continue
        row = rows[other]
        memory = 1 - one["pss_mb"] / row["pss_mb"]
        idle = 1 - one["idle_cpu_cores"] / row["idle_cpu_cores"] if row["idle_cpu_cores"] else 0.0
        lines.append(f"- Against {label}: {_less(memory)} memory ({one['pss_mb']:,.0f} vs {row['pss_mb']:,.0f} MiB), "
                     f"{_less(idle)} idle CPU ({one['idle_cpu_cores']:.3f} vs {row['idle_cpu_cores']:.3f} cores).")
    if one and "separate-servers" in rows:
        row = rows["separate-servers"]
        lines.append(f"- Start-up: the fifteen containers of one endpoint were all InService {one['startup_s']:.0f} s after "
                     f"the deploy call, sharing this machine's 2 cores; one single-container endpoint alone took "
                     f"{row['startup_s'] / row['endpoints']:.0f} s on average (longest {row['startup_max_s']:.0f} s), "
                     f"so fifteen machines would be up in about that, and this machine takes {row['startup_s']:.0f} s "
                     "to start them one after another.")
    if "alone_system_mb" in summary["stacks"] and one:
        lines.append(f"- Where the saving comes from: each endpoint of its own pays {summary['stacks']['alone_system_mb']:.0f} MiB "
                     "for Ray, Serve, the gateway and the registry before its model, and keeps Ray's background work "
                     f"running; the consolidated endpoint pays that once ({one['system_mb']:,.0f} MiB). The replicas "
                     "themselves cost about the same either way (per-stack tables), and so do the CPUs they reserve. "
                     "Fifteen endpoints on one shared Ray already get most of it: the saving is in sharing the "
                     "runtime, which on SageMaker means sharing an instance.")
    return lines


def _less(fraction: float) -> str:
    return f"{fraction:.0%} less" if fraction >= 0 else f"{-fraction:.0%} more"


def docs_section(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    return "\n".join([INTRO, "### Results", "", markdown(summary, meta), "### What consolidation saves", "",
                       *savings(summary)]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--out", type=Path, help="write all results as JSON")
    parser.add_argument("--write-docs", action="store_true", help="(re)write this benchmark's section of docs/performance.md")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="only rewrite the docs section from a results file an earlier run wrote with --out")
    parser.add_argument("--limit", type=int, default=15, help="serve only the first N containers (a quick smoke run)")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                        help="first wait up to S seconds for the 1-minute load average to drop below 1")
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
    while args.wait_quiet and os.getloadavg()[0] >= 1.0 and time.monotonic() - waited < args.wait_quiet:
        time.sleep(10)
    meta: dict[str, Any] = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
                            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                            "machine_before": _machine(), "versions": _versions()}
    began = time.monotonic()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-consolidation-") as tmp:
        workdir = Path(tmp)
        models = workdir / "models"
        print("training the fifteen models ...", flush=True)
        _train(models)
        containers = _containers(models)[:args.limit]
        for scenario in scenarios:
            print(f"scenario {scenario} ...", flush=True)
            if scenario == "separate-servers":
                results[scenario] = []
                for index, container in enumerate(containers):
                    run = _spawn(scenario, models, [container], workdir, f"{scenario}-{index}")
                    print(f"  {container['ContainerHostname']}: start-up {run['startup_s']:.1f} s, "
                          f"{run['memory']['total_pss'] / 2**20:.0f} MiB", flush=True)
                    results[scenario].append(run)
            else:
                results[scenario] = _spawn(scenario, models, containers, workdir, scenario)
                print(f"  start-up {results[scenario]['startup_s']:.1f} s, "
                      f"{results[scenario]['memory']['total_pss'] / 2**20:.0f} MiB", flush=True)
    meta["duration_s"] = time.monotonic() - began
    meta["machine_after"] = _machine()
    summary = summarize(results)
    report = docs_section(summary, meta)
    print(report)
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "summary": summary, "results": results}, indent=1))
    if args.write_docs:
        if len(containers) < 15 or set(scenarios) != set(SCENARIOS):
            print("not writing docs: a partial run (--limit or --scenarios)")
        else:
            _write_docs(report)
    return 0


def _write_docs(section: str) -> None:
    sys.path.insert(0, str(ROOT))
    from loadtests.doc_sections import write_section

    write_section(ROOT / "docs" / "performance.md", "bench_consolidation", section)
    print("wrote docs/performance.md")


if __name__ == "__main__":
    sys.exit(main())
