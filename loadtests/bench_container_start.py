"""Container process start: CPU-seconds and memory of each of the fifteen example's container
processes, against a baseline tree.

    .venv/bin/python -m loadtests.bench_container_start --baseline REV [--rounds 2] [--only
    tensorflow] [--write-docs]

Half of the fifteen-container endpoint's start-up CPU is its container processes (framework imports
and model loads; docs/benchmarks/bench_idle.md), and on 2 cores start-up is CPU-bound. This measures
that half alone, without Ray: each container of examples/fifteen.yaml is started through the replica
supervisor's own `ContainerProcess` (sandbox, stdin configuration, inherited data port, exactly as
on a replica), in a fresh interpreter, and once it reports ready the bench reads the container
process's CPU time (user + system, from `/proc`) and PSS, checks its sample answer over its data
port, and stops it. Each container runs in this tree and in `--baseline` (a git revision, checked
out into a temporary worktree), interleaved round by round so both see the same machine; the table
gives the median over rounds and the ratio. Models are trained from scikit-learn's bundled data into
a temporary folder (examples/train_hetero.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.bench_consolidation import FIFTEEN_SPEC
from loadtests.harness.models import hetero_models
from loadtests.harness.results import (
    ROOT,
    command_line,
    machine_facts,
    run_line,
    write_results,
    write_section,
)

RESULTS = ROOT / "loadtests" / "results" / "bench_container_start.json"
DOCS = ROOT / "docs" / "benchmarks" / "bench_container_start.md"

# Runs in a fresh interpreter started in the measured tree (`python -c` imports from its working
# directory first): start one container process, measure it.
_PROBE = r"""
import json, os, sys, time, urllib.request
from serving.model_server.container_config import ContainerConfig
from serving.model_server.supervisor import ContainerProcess
from serving.trust import hops
container = json.loads(sys.argv[1])
key = b"k" * 32
# As on a replica: the endpoint server's port closed to the process (trees before that had no such setting).
closed = {"closed_ports": (8080,)} if "closed_ports" in ContainerConfig.__dataclass_fields__ else {}
config = ContainerConfig(endpoint="bench", hostname=container["hostname"], image=container["image"],
                         model_data=container["model_data"], environment=container["environment"], hop_key=key,
                         **closed)
process = ContainerProcess(config, "127.0.0.1")
started = time.perf_counter()
process.start(timeout=300)
ready_s = time.perf_counter() - started
pid = process.process.pid
fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
pss_kb = next(int(line.split()[1]) for line in open(f"/proc/{pid}/smaps_rollup") if line.startswith("Pss:"))
body = json.dumps(container["request"]).encode()
headers = {"content-type": "application/json", "accept": "application/json"}
headers.update(hops.sign(key, "POST", "/invocations", body, headers))
request = urllib.request.Request(process.url + "/invocations", data=body, headers=headers, method="POST")
with urllib.request.urlopen(request, timeout=60) as answer:
    status = answer.status
process.stop()
supervisor = sys.modules[ContainerProcess.__module__].__file__
assert supervisor.startswith(os.getcwd()), supervisor  # the tree measured, not the installed one
print(json.dumps({"ready_s": ready_s, "cpu_s": cpu_s, "pss_mib": pss_kb / 1024, "status": status}))
"""


def containers(models: Path) -> list[dict[str, Any]]:
    """examples/fifteen.yaml's containers, with their models in `models` and a 0.1 CPU share
    each."""
    import yaml

    expected = json.loads((models / "expected.json").read_text())
    found = []
    for container in yaml.safe_load(FIFTEEN_SPEC.read_text())["Containers"]:
        name = Path(container["ModelDataUrl"]).name
        found.append(
            {
                "hostname": container["ContainerHostname"],
                "image": container["Image"],
                "model_data": str(models / name),
                "environment": {
                    **container.get("Environment", {}),
                    "SERVING_CPUS": "0.1",
                    "SERVING_GPUS": "0",
                },
                "request": expected[name]["request"],
            }
        )
    return found


def start_one(tree: Path, container: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(container)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tree,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{container['hostname']} in {tree}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def docs_section(saved: dict[str, Any]) -> str:
    rows, totals = [], {"ours": 0.0, "baseline": 0.0}
    for hostname, runs in saved["containers"].items():
        median = {
            tree: {
                key: statistics.median(run[key] for run in runs[tree])
                for key in ("cpu_s", "pss_mib")
            }
            for tree in ("baseline", "ours")
        }
        for tree in totals:
            totals[tree] += median[tree]["cpu_s"]
        rows.append(
            f"| {hostname} | {runs['image']} | {median['baseline']['cpu_s']:.2f} | {median['ours']['cpu_s']:.2f} "
            f"| {median['ours']['cpu_s'] / median['baseline']['cpu_s']:.2f} | {median['baseline']['pss_mib']:,.0f} "
            f"| {median['ours']['pss_mib']:,.0f} |"
        )
    return "\n".join(
        [
            "## Container process start, one by one",
            "",
            "CPU-seconds each container process of `examples/fifteen.yaml` uses from its start to serving (framework imports and",
            "model load), and its memory then, started alone through the replica supervisor's `ContainerProcess` (no Ray),",
            f"in this tree and in the baseline {saved['baseline']} (median of {saved['rounds']} interleaved rounds;",
            "`loadtests/bench_container_start.py` has the method). Every container answered its sample request in both.",
            "",
            "| container | stack | CPU-s, baseline | CPU-s, this tree | ratio | PSS MiB, baseline | PSS MiB, this tree |",
            "|---|---|---|---|---|---|---|",
            *rows,
            f"| **all measured** | | **{totals['baseline']:.1f}** | **{totals['ours']:.1f}** "
            f"| **{totals['ours'] / totals['baseline']:.2f}** | | |",
            "",
            run_line(saved, RESULTS),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--baseline", required=True, help="git revision to compare with (e.g. HEAD~1)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", help="measure only this stack's containers (e.g. tensorflow)")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    started, clock = dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), time.perf_counter()
    machine = machine_facts()
    with tempfile.TemporaryDirectory(prefix="bench-container-start-") as scratch:
        baseline = Path(scratch) / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(baseline), args.baseline],
            check=True,
            capture_output=True,
            timeout=120,
        )
        try:
            models = Path(scratch) / "models"
            hetero_models(models)
            chosen = [c for c in containers(models) if args.only in (None, c["image"])]
            runs: dict[str, dict[str, Any]] = {
                c["hostname"]: {"image": c["image"], "ours": [], "baseline": []} for c in chosen
            }
            for round_ in range(args.rounds):
                for container in chosen:
                    order = [("baseline", baseline), ("ours", ROOT)]
                    for tree, path in order if round_ % 2 == 0 else order[::-1]:
                        result = start_one(path, container)
                        runs[container["hostname"]][tree].append(result)
                        print(container["hostname"], tree, json.dumps(result), flush=True)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)],
                check=False,
                capture_output=True,
                timeout=120,
            )
    saved = {
        "started": started,
        "seconds": time.perf_counter() - clock,
        "command": command_line(__file__),
        "baseline": args.baseline,
        "rounds": args.rounds,
        "machine": machine,
        "containers": runs,
    }
    write_results(RESULTS, saved)
    print(docs_section(saved))
    if args.write_docs:
        write_section(DOCS, "bench_container_start", docs_section(saved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
