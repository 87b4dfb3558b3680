"""Soak: a long constant load at ~70% of measured capacity, watching every process's memory.

    .venv/bin/python loadtests/soak.py [--minutes 30] [--write-docs]

Serves the chaos run's endpoint (three containers, two replicas each) on an embedded Ray in this process,
measures its capacity with a short closed-loop run (`serving loadtest direct --users 32`), then drives it
open-loop at 70% of that for `--minutes`, sampling the resident memory (RSS) of the gateway, the registry,
every replica's supervisor and container process every 30 s. It reports requests, failures, p99, and each
process's memory after the first five minutes (warm) and at the end, with the growth per hour. Results:
loadtests/results/soak.json, and with --write-docs the "Soak" section of docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "loadtests" / "results" / "soak.json"
SAMPLE_S = 30.0
WARM_S = 300.0


def _processes(url: str, snapshot) -> dict[str, int]:
    """Role -> pid of every process of the endpoint: gateway, registry, and per replica its two processes."""
    import psutil

    from loadtests.chaos import listener

    roles = {"gateway": listener(url).pid}
    for process in psutil.process_iter(["cmdline"]):
        if "ray::Registry" in " ".join(process.info["cmdline"] or []):
            roles["registry"] = process.pid
    for (_, host), urls in sorted(snapshot()["replicas"].items()):
        for index, replica in enumerate(sorted(urls)):
            child = listener(replica)
            if child is not None:
                roles[f"{host}[{index}] container"] = child.pid
                roles[f"{host}[{index}] supervisor"] = child.ppid()
    return roles


def _loadtest(url: str, work: Path, out: Path, *load: str) -> dict:
    subprocess.run([sys.executable, "-m", "serving.cli", "loadtest", "direct", "--endpoint", f"{url}/endpoints/chaos",
                    "--payload", f"iris={work / 'iris.json'}", "--payload", f"wine={work / 'wine.json'}",
                    "--payload", f"labels={work / 'labels.json'}", "--out", str(out), "--no-html", *load],
                   check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "report.json").read_text())


def run(minutes: float) -> dict:
    import psutil
    import ray

    from loadtests.chaos import spec
    from serving import ray_wing
    from serving.config.spec import parse_spec
    from serving.settings import ServerSettings

    sys.path.insert(0, str(ROOT / "examples"))
    from train_demo import train

    work = Path(tempfile.mkdtemp(prefix="serving-soak-"))
    train(work / "models")
    (work / "iris.json").write_text("[[5.1, 3.5, 1.4, 0.2]]")
    (work / "wine.json").write_text("[[13.2, 1.78, 2.14, 11.2, 100, 2.65, 2.76, 0.26, 1.28, 4.38, 1.05, 3.4, 1050]]")
    (work / "labels.json").write_text("[0, 2]")
    settings = ServerSettings(port=0)
    ray_wing.start_local_ray(num_cpus=2)
    try:
        url = ray_wing.start_gateway(settings)
        ray_wing.deploy_endpoint(parse_spec(spec(work / "models")), settings)
        deadline = time.monotonic() + 300
        while ray_wing.describe_endpoints().get("chaos", {}).get("EndpointStatus") != "InService":
            assert time.monotonic() < deadline, "not InService"
            time.sleep(1)
        time.sleep(3)
        capacity = _loadtest(url, work, work / "capacity", "--users", "32", "--duration", "20")["throughput_rps"]["ok"]
        rate = round(0.7 * capacity, 1)
        roles = _processes(url, lambda: ray.get(ray_wing.registry_handle().snapshot.remote(-1), timeout=60))
        samples: dict[str, list[tuple[float, int]]] = {role: [] for role in roles}
        stop, started = threading.Event(), time.monotonic()

        def sample() -> None:
            while not stop.wait(SAMPLE_S):
                for role, pid in roles.items():
                    try:
                        samples[role].append((round(time.monotonic() - started, 1), psutil.Process(pid).memory_info().rss))
                    except psutil.Error:
                        pass

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        load = _loadtest(url, work, work / "soak", "--rate", str(rate), "--duration", str(minutes * 60))
        stop.set()
        sampler.join(60)
        memory = {}
        for role, series in samples.items():
            warm = [rss for at, rss in series if at >= WARM_S] or [rss for _, rss in series]
            if len(warm) < 2:
                continue
            hours = max((series[-1][0] - max(WARM_S, series[0][0])) / 3600, 1e-9)
            memory[role] = {"warm_mib": round(warm[0] / 2**20, 1), "end_mib": round(warm[-1] / 2**20, 1),
                            "growth_mib_per_hour": round((warm[-1] - warm[0]) / 2**20 / hours, 1)}
        return {"minutes": minutes, "capacity_rps": capacity, "rate": rate,
                "requests": load["totals"]["requests"], "failed": load["totals"]["failures_by_status"],
                "p99_ms": load["latency_ms"]["p99"], "memory": memory}
    finally:
        ray_wing.shutdown()


def render(result: dict) -> str:
    lines = [
        f"Command: `.venv/bin/python loadtests/soak.py --minutes {result['minutes']:g} --write-docs` (one run, this "
        f"2-core machine, embedded Ray). Capacity {result['capacity_rps']} req/s (closed loop, 32 users, 20 s); soak "
        f"at {result['rate']} req/s: {result['requests']} requests, failed {result['failed'] or 0}, p99 "
        f"{result['p99_ms']} ms. Memory (RSS) from the end of the first {WARM_S / 60:g} minutes to the end:",
        "",
        "| process | warm MiB | end MiB | growth MiB/hour |",
        "|---|---|---|---|",
    ]
    for role, numbers in result["memory"].items():
        lines.append(f"| {role} | {numbers['warm_mib']} | {numbers['end_mib']} | {numbers['growth_mib_per_hour']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    result = run(args.minutes)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(render(result))
    if args.write_docs:
        from loadtests.doc_sections import write_section

        write_section(ROOT / "docs" / "reliability.md", "soak", "## Soak\n\n" + render(result))


if __name__ == "__main__":
    main()
