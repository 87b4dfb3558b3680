"""The scale-out on a simulated cluster (`loadtests/cluster/`): routing capacity per gateway, and locality.

    .venv/bin/python -m loadtests.bench_cluster [--parts gateways,per_node,locality,registry] [--seconds 10] [--write-docs]

Needs root (network namespaces, cgroups) and wrk. Every host is a network namespace on a bridge with a
Ray node; calls come from wrk processes in a namespace of their own, one per gateway address, as a
balancer spreads connections over hosts. The model is the echo (`python` stack, a four-line
`inference.py`), so the container costs little.

- **gateways** (issue 61 item 2): five hosts. Host 1 holds the head, the control plane and the echo's two
  replicas, with no quota; hosts 2-5 each run one gateway, each gateway process moved into a cgroup of its
  own capped at `--gateway-cpus` of a core, so that routing is the bottleneck. Calls go to 1, 2, 3 and 4
  of those gateways at once (`--connections` each); every added gateway should add about what the first
  one routes. Reported: calls/s, each step's gain over the first gateway's calls/s, the gateways' CPU
  (against their cap), the echo's container processes' CPU (their headroom) and the machine's busy cores.
- **per_node** (issue 61 item 2, one host): two hosts; host 2 runs G gateways sharing its port
  (`--gateways-per-node G`, G = 1-4, a cluster started for each), each process capped at `--gateway-cpus`;
  `--connections` per gateway to host 2's address, which the kernel spreads over the gateways' sockets.
- **locality** (issue 61 item 3): two hosts, uncapped, a Direct container with a replica on each host and
  a 3-container Serial chain with a replica of each container on each host; calls enter both hosts
  evenly. Measured with locality routing on, then with `--no-locality-routing`, each on a cluster of its
  own: p50 and p99 at one connection per host, calls/s and CPU per call (every process of both hosts,
  Ray's idle included) at 8.
- **registry** (issue 61 item 5): no namespaces; the real registry on a local Ray, 10, 100, 400 and 1,000
  simulated gateways long-polling it from four processes (`cluster/registry_readers`,
  `cluster/registry_fanout`), one change a second: how long until every reader has a change, the
  registry's and the GCS server's CPU, the snapshot's size, the key-value writes gateways make.

Each part's results replace only that part's in `results/bench_cluster.json` and its section of the page,
with its own run line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from loadtests.cluster import machine as sim
from loadtests.cluster.cluster import HTTP_PORT, SimulatedCluster
from loadtests.cluster.echo import echo_container, echo_model
from loadtests.cluster.registry_fanout import Fanout
from loadtests.cluster.traffic import cpu_seconds, invoke_script, scratch, wrk
from loadtests.harness.results import ROOT, run_line, run_meta, write_results, write_section

RESULTS = ROOT / "loadtests" / "results" / "bench_cluster.json"
DOCS = ROOT / "docs" / "benchmarks" / "bench_cluster.md"
TITLE = "# bench_cluster: the scale-out on a simulated cluster"
PARTS = ("gateways", "per_node", "locality", "registry")
SLOTS = (
    "slot-d",
    "slot-1",
    "slot-2",
    "slot-3",
)  # one replica of each container per host (locality)


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on TCP `port`, read in its own network namespace
    (`/proc/PID/net/tcp`: psutil reads the caller's)."""
    try:
        table = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    owned = set()
    for fd in fds:
        with contextlib.suppress(OSError):  # closed meanwhile
            owned.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    for line in table:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if (
            state == "0A"
            and int(local.rsplit(":", 1)[1], 16) == port
            and f"socket:[{inode}]" in owned
        ):
            return True
    return False


def _machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def _echo_on_head(folder: Path, name: str) -> Path:
    """A spec file: the echo endpoint, its two replicas on the head host (host 1)."""
    spec = folder / name
    container = echo_container(echo_model(folder), "echo", {"host-1": 1}, 2)
    spec.write_text(json.dumps({"EndpointName": "echo", "Containers": [container]}))
    return spec


def gateways(
    folder: Path, seconds: float, connections: int, gateway_cpus: float, rounds: int
) -> dict[str, Any]:
    """Calls/s through 1-4 capped gateways on hosts of their own (item 2)."""
    spec = _echo_on_head(folder, "gateways.json")
    found: dict[str, Any] = {"gateway_cpus": gateway_cpus, "connections": connections, "steps": []}
    with SimulatedCluster(hosts=5, node_cpus=2) as cluster:
        cluster.up(spec)
        found["in_service_s"] = cluster.wait_in_service("echo")
        capped = {}
        for index in range(2, 6):
            cluster.wait_until(
                lambda index=index: bool(cluster.gateway_pids(index)), f"host {index}'s gateway"
            )
            (pid,) = cluster.gateway_pids(index)
            cluster.machine.cap_process(cluster.machine.hosts[index], pid, gateway_cpus)
            capped[index] = pid
        head = cluster.machine.hosts[1].pids() - cluster.gateway_pids(1)  # Ray, Serve, the echo
        script = invoke_script(folder, "echo", "echo")
        path = "/endpoints/echo/invocations"
        wrk(cluster, [2, 3, 4, 5], script, path, 2, connections)  # warm every gateway's pools
        runs: dict[int, list[dict[str, float]]] = {count: [] for count in (1, 2, 3, 4)}
        for number in range(rounds):
            for count in (1, 2, 3, 4) if number % 2 == 0 else (4, 3, 2, 1):
                hosts = list(range(2, 2 + count))
                pids = [capped[index] for index in hosts]
                before_gw, before_head, before_busy = (
                    cpu_seconds(pids),
                    cpu_seconds(head),
                    _machine_busy(),
                )
                traffic = wrk(cluster, hosts, script, path, seconds, connections)
                after_busy = _machine_busy()
                step = {
                    "rps": traffic.rps,
                    "p50_ms": traffic.p50_ms,
                    "p99_ms": traffic.p99_ms,
                    "failures": traffic.failures,
                    "gateway_cores": (cpu_seconds(pids) - before_gw) / traffic.seconds,
                    "head_cores": (cpu_seconds(head) - before_head) / traffic.seconds,
                    "machine_busy_cores": 2
                    * (after_busy[0] - before_busy[0])
                    / max(1, after_busy[1] - before_busy[1]),
                }
                runs[count].append(step)
                print(count, json.dumps(step), flush=True)
        found["runs"] = {str(count): steps for count, steps in runs.items()}
        found["steps"] = [
            {
                "gateways": count,
                **{key: statistics.median(s[key] for s in steps) for key in steps[0]},
            }
            for count, steps in runs.items()
        ]
    return found


def gateways_per_node(
    folder: Path, seconds: float, connections: int, gateway_cpus: float, counts: list[int]
) -> dict[str, Any]:
    """Calls/s through G capped gateways sharing one host's port (`--gateways-per-node G`), a cluster
    of its own for each G (item 2, one host)."""
    spec = _echo_on_head(folder, "per-node.json")
    script = invoke_script(folder, "echo", "echo")
    path = "/endpoints/echo/invocations"
    found: dict[str, Any] = {"gateway_cpus": gateway_cpus, "connections": connections, "steps": []}
    for count in counts:
        # every node gets G gateways, and a node needs a CPU per gateway: 4 declared per host
        with SimulatedCluster(hosts=2, node_cpus=max(counts)) as cluster:
            cluster.up(spec, "--gateways-per-node", str(count))
            cluster.wait_in_service("echo")

            def listening() -> bool:  # a gateway reads its first table before it listens
                pids = cluster.gateway_pids(2)
                return len(pids) == count and all(_listens(pid, HTTP_PORT) for pid in pids)

            cluster.wait_until(listening, f"host 2's {count} gateways listening")
            pids = sorted(cluster.gateway_pids(2))
            for pid in pids:
                cluster.machine.cap_process(cluster.machine.hosts[2], pid, gateway_cpus)
            wrk(cluster, [2], script, path, 2, connections * count)  # warm every gateway's pools
            before = cpu_seconds(pids), [cpu_seconds([pid]) for pid in pids]
            traffic = wrk(cluster, [2], script, path, seconds, connections * count)
            each = [(cpu_seconds([pid]) - b) / traffic.seconds for pid, b in zip(pids, before[1])]
            step = {
                "gateways": count,
                "rps": traffic.rps,
                "p50_ms": traffic.p50_ms,
                "p99_ms": traffic.p99_ms,
                "failures": traffic.failures,
                "gateway_cores": (cpu_seconds(pids) - before[0]) / traffic.seconds,
                "least_busy_gateway_cores": min(
                    each
                ),  # the kernel's spread over the port's sockets
            }
            found["steps"].append(step)
            print("per node", json.dumps(step), flush=True)
    return found


def locality(folder: Path, seconds: float, on: bool) -> dict[str, Any]:
    """Direct and a 3-container Serial chain across two hosts, locality routing on or off (item 3)."""
    model = echo_model(folder)
    direct, chain = folder / "direct.json", folder / "chain.json"
    direct.write_text(
        json.dumps(
            {"EndpointName": "direct", "Containers": [echo_container(model, "d", {"slot-d": 1}, 2)]}
        )
    )
    chain.write_text(
        json.dumps(
            {
                "EndpointName": "chain",
                "InferenceExecutionConfig": {"Mode": "Serial"},
                "Containers": [
                    echo_container(model, f"c{i}", {f"slot-{i}": 1}, 2) for i in (1, 2, 3)
                ],
            }
        )
    )
    found: dict[str, Any] = {"locality": on}
    resources = dict.fromkeys(SLOTS, 1.0)
    with SimulatedCluster(hosts=2, node_cpus=2, resources=resources) as cluster:
        cluster.up([direct, chain], *([] if on else ["--no-locality-routing"]))
        for name in ("direct", "chain"):
            cluster.wait_in_service(name)
        everything = lambda: cluster.machine.hosts[1].pids() | cluster.machine.hosts[2].pids()
        for name, container in (("direct", "d"), ("chain", None)):
            script = invoke_script(folder, name, container)
            path = f"/endpoints/{name}/invocations"
            wrk(cluster, [1, 2], script, path, 2, 4)  # warm
            sequential = wrk(cluster, [1, 2], script, path, seconds, 1)
            pids = everything()
            before = cpu_seconds(pids)
            loaded = wrk(cluster, [1, 2], script, path, seconds, 8)
            cpu = cpu_seconds(pids) - before
            found[name] = {
                "p50_ms": sequential.p50_ms,
                "p99_ms": sequential.p99_ms,
                "rps_c8": loaded.rps,
                "cpu_us_per_call": cpu / max(1, loaded.requests) * 1e6,
                "failures": sequential.failures + loaded.failures,
                "hosts_c1": sequential.hosts,
            }
            print(name, "locality", on, json.dumps(found[name]), flush=True)
    return found


def registry(sizes: list[int], changes: int, paths: list[str]) -> dict[str, Any]:
    """The registry's fan-out at each number of simulated gateways (item 5), over each path: its snapshot
    feed and Ray's long poll, in alternating order from one size to the next."""
    fanout = Fanout()
    try:
        steps = []
        for number, readers in enumerate(sizes):
            for path in paths if number % 2 == 0 else paths[::-1]:
                step = fanout.measure(readers, changes, path == "feed")
                print(json.dumps(step), flush=True)
                steps.append(step)
        return {"steps": steps}
    finally:
        fanout.close()


def render_registry(saved: dict[str, Any]) -> str:
    steps = saved["registry"]["steps"]
    lines = [
        f"One change a second ({steps[0]['changes']} changes), a snapshot of {steps[0]['snapshot_bytes']:,} "
        "bytes pickled (the fifteen-container endpoint's record); times from the change to each reader's "
        "arrival. Apply: a sample of readers applied each snapshot to a real `GatewayState`. Path: the "
        "readers' long polls over the registry's snapshot feed (the default) or through Ray (`--no-registry-feed`, "
        "the design before the feed); ÷ feed: the registry's CPU per change against the feed's at the same size.",
        "",
        "| gateways | path | applied everywhere p50 s | p99 s | one reader p50 s | p99 s | registry cores (changing) | "
        "registry ms per change | ÷ feed | registry cores idle | GCS cores (changing) | KV writes/s | apply ms |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    feed = {
        step["readers"]: step["registry_cpu_ms_per_change"]
        for step in steps
        if step.get("path", "ray") == "feed"
    }
    for step in sorted(steps, key=lambda step: (step["readers"], step.get("path", "ray"))):
        apply = f"{step['apply_ms_p50']:.2f}" if step["apply_ms_p50"] is not None else "-"
        base = feed.get(step["readers"])
        ratio = f"{step['registry_cpu_ms_per_change'] / base:.1f}×" if base else "-"
        lines.append(
            f"| {step['readers']:,} | {step.get('path', 'ray')} | {step['everywhere_p50_s']:.3f} | "
            f"{step['everywhere_p99_s']:.3f} | "
            f"{step['each_p50_s']:.3f} | {step['each_p99_s']:.3f} | {step['registry_cores_changing']:.3f} | "
            f"{step['registry_cpu_ms_per_change']:.1f} | {ratio} | {step['registry_cores_idle']:.3f} | "
            f"{step['gcs_cores_changing']:.3f} | {step['kv_writes_per_s']:.0f} | {apply} |"
        )
    return "\n".join(lines)


def render_gateways(saved: dict[str, Any]) -> str:
    part = saved["gateways"]
    first = part["steps"][0]["rps"]
    lines = [
        f"Each gateway process capped at {part['gateway_cpus']} of a core (its own cgroup), {part['connections']} "
        "connections to each; the echo's two replicas on the head host, uncapped (its cores: every process there but "
        "its own gateway, Ray's and Serve's included). Medians over rounds, run in alternating order.",
        "",
        "| gateways | calls/s | × one gateway | last gateway added | gateways' cores | head host's cores | machine busy (of 2) | p50 ms | p99 ms | failed |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    previous = 0.0
    for step in part["steps"]:
        gain = (step["rps"] - previous) / first
        previous = step["rps"]
        lines.append(
            f"| {step['gateways']} | {step['rps']:,.0f} | {step['rps'] / first:.2f}× | {gain:.2f}× | "
            f"{step['gateway_cores']:.2f} | {step['head_cores']:.2f} | {step['machine_busy_cores']:.2f} | "
            f"{step['p50_ms']:.2f} | {step['p99_ms']:.2f} | {step['failures']:.0f} |"
        )
    return "\n".join(lines)


def render_per_node(saved: dict[str, Any]) -> str:
    part = saved["per_node"]
    first = part["steps"][0]["rps"]
    lines = [
        f"One host's gateways sharing its port (`--gateways-per-node G`, a cluster started for each G), each "
        f"process capped at {part['gateway_cpus']} of a core, {part['connections']} connections per gateway to "
        "the host's address, spread over the gateways by the kernel (`SO_REUSEPORT`); the echo's replicas on the "
        "head host. One run per G.",
        "",
        "| gateways on the host | calls/s | × one gateway | per gateway, × one | last gateway added | gateways' cores | least busy gateway's cores | p50 ms | p99 ms | failed |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    previous = 0.0
    for step in part["steps"]:
        gain, previous = (step["rps"] - previous) / first, step["rps"]
        lines.append(
            f"| {step['gateways']} | {step['rps']:,.0f} | {step['rps'] / first:.2f}× | "
            f"{step['rps'] / first / step['gateways']:.2f}× | {gain:.2f}× | "
            f"{step['gateway_cores']:.2f} | {step['least_busy_gateway_cores']:.2f} | {step['p50_ms']:.2f} | "
            f"{step['p99_ms']:.2f} | {step['failures']:.0f} |"
        )
    return "\n".join(lines)


def render_locality(saved: dict[str, Any]) -> str:
    on, off = saved["locality"]["on"], saved["locality"]["off"]
    lines = [
        "| endpoint | locality | p50 ms (c1 per host, the worse host) | p99 ms | calls/s (c8 per host) | CPU µs per call | off ÷ on CPU |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in ("direct", "chain"):
        for label, part in (("on", on), ("off", off)):
            row = part[name]
            ratio = row["cpu_us_per_call"] / on[name]["cpu_us_per_call"]
            lines.append(
                f"| {name} | {label} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['rps_c8']:,.0f} | "
                f"{row['cpu_us_per_call']:,.0f} | {ratio:.2f}× |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="gateways,locality")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=8, help="per gateway (gateways part)")
    parser.add_argument("--gateway-cpus", type=float, default=0.15)
    parser.add_argument("--rounds", type=int, default=2, help="of the gateways part")
    parser.add_argument("--readers", default="10,100,400,1000", help="registry part: sizes")
    parser.add_argument("--changes", type=int, default=20, help="registry part: per size")
    parser.add_argument(
        "--registry-paths",
        default="feed,ray",
        help="registry part: the snapshot feed, Ray's long poll",
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    # stopped (a timeout, a CI's kill): unwind, so the simulated hosts are torn down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sim.preflight()
    parts = args.parts.split(",")
    saved = run_meta(__file__, parts=parts, seconds_each=args.seconds)
    earlier = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    started = time.monotonic()
    folder = scratch()
    try:
        if "gateways" in parts:
            saved["gateways"] = gateways(
                folder, args.seconds, args.connections, args.gateway_cpus, args.rounds
            )
        if "per_node" in parts:
            saved["per_node"] = gateways_per_node(
                folder, args.seconds, args.connections, args.gateway_cpus, [1, 2, 3, 4]
            )
        if "locality" in parts:
            saved["locality"] = {
                "on": locality(folder, args.seconds, True),
                "off": locality(folder, args.seconds, False),
            }
        if "registry" in parts:
            sizes = [int(size) for size in args.readers.split(",")]
            saved["registry"] = registry(sizes, args.changes, args.registry_paths.split(","))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    saved["seconds"] = time.monotonic() - started
    # each part keeps its own run's facts: the parts not run this time keep theirs
    merged = {part: earlier[part] for part in PARTS if part in earlier}
    for part in parts:
        merged[part] = {**saved[part], "run": {k: v for k, v in saved.items() if k not in PARTS}}
    write_results(RESULTS, merged)
    sections = {}
    if "gateways" in saved:
        sections["bench_cluster_gateways"] = render_gateways(saved)
    if "per_node" in saved:
        sections["bench_cluster_per_node"] = render_per_node(saved)
    if "locality" in saved:
        sections["bench_cluster_locality"] = render_locality(saved)
    if "registry" in saved:
        sections["bench_cluster_registry"] = render_registry(saved)
    for name, text in sections.items():
        text += "\n\n" + run_line(saved, RESULTS)
        print(text)
        if args.write_docs:
            write_section(DOCS, name, text, TITLE)


if __name__ == "__main__":
    main()
