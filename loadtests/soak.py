"""Soak: a long constant load at ~70% of measured capacity, watching every process's memory.

    .venv/bin/python -m loadtests.soak [--minutes 30] [--write-docs]

Serves the chaos run's endpoint (three containers, two replicas each) on an embedded Ray in this
process, measures its capacity with a short closed-loop run (`serving loadtest direct --users 32`),
then drives it open-loop at 70% of that for `--minutes`, sampling the resident memory (RSS) of the
gateway, the registry, every replica's supervisor and container process every 30 s. It reports
requests, failures, p99, and each process's memory after the first five minutes (warm) and at the
end, with the growth per hour. Results: loadtests/results/soak.json, and with --write-docs the
"Soak" section of docs/reliability.md.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from loadtests.harness.loadtest import run_loadtest
from loadtests.harness.models import demo_models
from loadtests.harness.proctree import listener
from loadtests.harness.results import ROOT, write_results, write_section
from loadtests.harness.servers import in_process

RESULTS = ROOT / "loadtests" / "results" / "soak.json"
SAMPLE_S = 30.0
WARM_S = 300.0


def _processes(url: str, snapshot) -> dict[str, int]:
    """Role -> pid of every process of the endpoint: gateway, registry, and per replica its two
    processes."""
    import psutil

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


def _loadtest(url: str, payloads: dict[str, Path], out: Path, *load: str) -> dict:
    return run_loadtest(
        "direct",
        f"{url}/endpoints/chaos",
        out,
        *(f"--payload={host}={path}" for host, path in payloads.items()),
        *load,
        quiet=True,
    )


def run(minutes: float) -> dict:
    import psutil

    from loadtests.chaos import spec

    work = Path(tempfile.mkdtemp(prefix="serving-soak-"))
    payloads = demo_models(work)
    with in_process(spec(work / "models"), num_cpus=2) as server:
        url = server.url
        capacity = _loadtest(url, payloads, work / "capacity", "--users", "32", "--duration", "20")[
            "throughput_rps"
        ]["ok"]
        rate = round(0.7 * capacity, 1)
        roles = _processes(url, server.snapshot)
        samples: dict[str, list[tuple[float, int]]] = {role: [] for role in roles}
        stop, started = threading.Event(), time.monotonic()

        def sample() -> None:
            while not stop.wait(SAMPLE_S):
                for role, pid in roles.items():
                    try:
                        samples[role].append(
                            (
                                round(time.monotonic() - started, 1),
                                psutil.Process(pid).memory_info().rss,
                            )
                        )
                    except psutil.Error:
                        pass

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        load = _loadtest(
            url, payloads, work / "soak", "--rate", str(rate), "--duration", str(minutes * 60)
        )
        stop.set()
        sampler.join(60)
        memory = {}
        for role, series in samples.items():
            warm = [rss for at, rss in series if at >= WARM_S] or [rss for _, rss in series]
            if len(warm) < 2:
                continue
            hours = max((series[-1][0] - max(WARM_S, series[0][0])) / 3600, 1e-9)
            memory[role] = {
                "warm_mib": round(warm[0] / 2**20, 1),
                "end_mib": round(warm[-1] / 2**20, 1),
                "growth_mib_per_hour": round((warm[-1] - warm[0]) / 2**20 / hours, 1),
            }
        return {
            "minutes": minutes,
            "capacity_rps": capacity,
            "rate": rate,
            "requests": load["totals"]["requests"],
            "failed": load["totals"]["failures_by_status"],
            "p99_ms": load["latency_ms"]["p99"],
            "memory": memory,
        }


def render(result: dict) -> str:
    lines = [
        f"Command: `.venv/bin/python -m loadtests.soak --minutes {result['minutes']:g} --write-docs` (one run, this "
        f"2-core machine, embedded Ray). Capacity {result['capacity_rps']} req/s (closed loop, 32 users, 20 s); soak "
        f"at {result['rate']} req/s: {result['requests']} requests, failed {result['failed'] or 0}, p99 "
        f"{result['p99_ms']} ms. Memory (RSS) from the end of the first {WARM_S / 60:g} minutes to the end:",
        "",
        "| process | warm MiB | end MiB | growth MiB/hour |",
        "|---|---|---|---|",
    ]
    for role, numbers in result["memory"].items():
        lines.append(
            f"| {role} | {numbers['warm_mib']} | {numbers['end_mib']} | {numbers['growth_mib_per_hour']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    result = run(args.minutes)
    write_results(RESULTS, result)
    print(render(result))
    if args.write_docs:
        write_section(ROOT / "docs" / "reliability.md", "soak", "## Soak\n\n" + render(result))


if __name__ == "__main__":
    main()
