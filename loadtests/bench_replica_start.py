"""Serve replica start: CPU-seconds a replica's Ray worker has used when its constructor runs, with
and without a runtime_env.

    .venv/bin/python -m loadtests.bench_replica_start [--replicas 6] [--write-docs]

On an embedded Ray (this runtime's settings), deploys `--replicas` one-replica Serve applications of
a trivial deployment with no `runtime_env`, and as many whose `runtime_env` holds one `env_vars`
entry (what every container replica had until this runtime passed its `Environment` to the container
process instead), alternating. Each replica reports its own process's CPU time (user + system,
`getrusage`) from its constructor: everything its worker process did to get there, i.e. what Ray and
Serve cost before a container's own start. Ray starts a worker whose actor has a runtime_env through
`setup_worker.py`, a Python that imports Ray and then `exec`s the worker, so the process pays for
Python and `import ray` twice.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from typing import Any

from loadtests.harness.results import (
    ROOT,
    command_line,
    machine_facts,
    run_line,
    write_results,
    write_section,
)

RESULTS = ROOT / "loadtests" / "results" / "bench_replica_start.json"
DOCS = ROOT / "docs" / "benchmarks" / "bench_replica_start.md"
CASES = {
    "no runtime_env": {},
    "runtime_env with env_vars": {"runtime_env": {"env_vars": {"SERVING_BENCH": "1"}}},
}


def measure(replicas: int) -> dict[str, list[float]]:
    import ray
    from ray import serve

    from serving.ray_wing.cluster import start_local_ray

    @serve.deployment(ray_actor_options={"num_cpus": 0.01})
    class Probe:
        def __init__(self) -> None:
            import resource

            usage = resource.getrusage(resource.RUSAGE_SELF)
            self.cpu_s = usage.ru_utime + usage.ru_stime

        def __call__(self, *_: Any) -> float:
            return self.cpu_s

    start_local_ray(num_cpus=2)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 0})
        time.sleep(5)  # let Ray's own start-up settle
        found: dict[str, list[float]] = {case: [] for case in CASES}
        for index in range(replicas):
            for case, options in CASES.items():
                app = Probe.options(ray_actor_options={"num_cpus": 0.01, **options}).bind()
                handle = serve.run(
                    app, name=f"probe-{len(found[case])}-{case.split()[0]}", route_prefix=None
                )
                found[case].append(handle.remote().result(timeout_s=120))
                print(case, index, f"{found[case][-1]:.2f}", flush=True)
        return found
    finally:
        serve.shutdown()
        ray.shutdown()


def docs_section(saved: dict[str, Any]) -> str:
    found = saved["cpu_s"]
    median = {case: statistics.median(values) for case, values in found.items()}
    plain, with_env = median["no runtime_env"], median["runtime_env with env_vars"]
    rows = [
        f"| {case} | {len(values)} | {median[case]:.2f} | {min(values):.2f}–{max(values):.2f} |"
        for case, values in found.items()
    ]
    return "\n".join(
        [
            "## Serve replica start: the runtime_env's cost",
            "",
            "CPU-seconds a Serve replica's worker process has used when its constructor runs (Python, `import ray`,",
            "Ray's worker and Serve's replica set-up), for a trivial deployment with no `runtime_env` and with one",
            "`env_vars` entry, alternating on one embedded Ray (`loadtests/bench_replica_start.py` has the method).",
            "",
            "| replica | replicas | median CPU-s | range |",
            "|---|---|---|---|",
            *rows,
            "",
            f"A runtime_env costs {with_env - plain:.2f} CPU-seconds more per replica ({with_env / plain:.2f}×): Ray starts",
            "such a worker through `setup_worker.py`, which imports Ray before it `exec`s the worker. Container replicas",
            "no longer have one unless their `RuntimeEnvironment` asks for pip packages or a working directory: their",
            "`Environment` goes to the container process, which the supervisor starts with it anyway.",
            "",
            run_line(saved, RESULTS),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=6, help="replicas of each kind")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    started, clock = dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), time.perf_counter()
    machine = machine_facts()
    found = measure(args.replicas)
    saved = {
        "started": started,
        "seconds": time.perf_counter() - clock,
        "command": command_line(__file__),
        "machine": machine,
        "cpu_s": found,
    }
    write_results(RESULTS, saved)
    print(docs_section(saved))
    if args.write_docs:
        write_section(DOCS, "bench_replica_start", docs_section(saved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
