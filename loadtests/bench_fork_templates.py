"""Container processes forked from their stack's template against fresh ones: start time, start-up
CPU and the memory of fifteen held together.

    .venv/bin/python -m loadtests.bench_fork_templates [--rounds 2] [--write-docs]

The fifteen containers of examples/fifteen.yaml are started one after another through the replica
supervisor's own `ContainerProcess` (sandbox, inherited data port, exactly as on a replica; no Ray),
in three ways, interleaved round by round so that all see the same machine:

- `fresh`: `fork_template` off, every container process a new interpreter that imports its
  framework (how every container started before templates);
- `forked, cold`: no template running yet; the first container of each stack waits for its template
  to start (the template's own CPU is counted apart);
- `forked, warm`: the templates already run, as when a replica is replaced or added.

For each it reads every container process's start time (`start()` to ready) and CPU-seconds (from
`/proc`, at ready), then, with all fifteen running, the PSS of the fifteen container processes and of
the templates, checks every sample answer over the data port, and stops them all. Templates this
bench started are stopped (SIGTERM, by PID) before each fresh and each cold run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from loadtests.bench_container_start import containers
from loadtests.harness.models import hetero_models
from loadtests.harness.proctree import smaps, stop_templates, templates_of
from loadtests.harness.results import (
    ROOT,
    command_line,
    machine_facts,
    run_line,
    write_results,
    write_section,
)

RESULTS = ROOT / "loadtests" / "results" / "bench_fork_templates.json"
DOCS = ROOT / "docs" / "benchmarks" / "bench_fork_templates.md"
MODES = ("fresh", "forked, cold", "forked, warm")
KEY = b"k" * 32
MIB = 1 << 20


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _answer(process, request: Any) -> int:
    from serving.trust import hops

    body = json.dumps(request).encode()
    headers = {"content-type": "application/json", "accept": "application/json"}
    headers.update(hops.sign(KEY, "POST", "/invocations", body, headers))
    call = urllib.request.Request(process.url + "/invocations", body, headers, method="POST")
    with urllib.request.urlopen(call, timeout=60) as answer:
        return answer.status


def run_mode(mode: str, chosen: list[dict[str, Any]]) -> dict[str, Any]:
    """Start the fifteen one after another the `mode` way; measure; stop them."""
    from serving.model_server import forked
    from serving.model_server.container_config import ContainerConfig
    from serving.model_server.supervisor import ContainerProcess

    if mode != "forked, warm":
        stop_templates(ROOT)
    started, rows = [], {}
    wall = time.perf_counter()
    try:
        for container in chosen:
            config = ContainerConfig(
                endpoint="bench",
                hostname=container["hostname"],
                image=container["image"],
                model_data=container["model_data"],
                environment=container["environment"],
                hop_key=KEY,
                fork_template=mode != "fresh",
            )
            process = ContainerProcess(config, "127.0.0.1")
            began = time.perf_counter()
            process.start(timeout=300)
            started.append(process)
            rows[container["hostname"]] = {
                "image": container["image"],
                "ready_s": time.perf_counter() - began,
                "cpu_s": _cpu_s(process.pid),
                "forked": isinstance(process.process, forked.ForkedProcess),
            }
        wall_s = time.perf_counter() - wall
        for container, process in zip(chosen, started, strict=True):
            assert _answer(process, container["request"]) == 200, container["hostname"]
        time.sleep(2)  # what start-up left settles before memory is read
        templates = templates_of(ROOT)
        pss = {p.config.hostname: (smaps(p.pid) or {"pss": 0})["pss"] / MIB for p in started}
        template_pss = sum((smaps(pid) or {"pss": 0})["pss"] for pid in templates) / MIB
        template_cpu = sum(_cpu_s(pid) for pid in templates)
    finally:
        for process in started:
            process.stop()
    for hostname, row in rows.items():
        row["pss_mib"] = pss[hostname]
    return {
        "containers": rows,
        "wall_s": wall_s,
        "templates": len(templates),
        "template_pss_mib": template_pss,
        "template_cpu_s": template_cpu,
    }


def _median(runs: list[dict[str, Any]], pick) -> float:
    return statistics.median(pick(run) for run in runs)


def docs_section(saved: dict[str, Any]) -> str:
    runs = saved["runs"]
    stacks = sorted({row["image"] for row in runs["fresh"][0]["containers"].values()})

    def stack_ready(mode: str, stack: str) -> float:
        return _median(
            runs[mode],
            lambda run: statistics.median(
                row["ready_s"] for row in run["containers"].values() if row["image"] == stack
            ),
        )

    def total(mode: str, key: str) -> float:
        return _median(runs[mode], lambda run: sum(r[key] for r in run["containers"].values()))

    memory = {
        mode: (
            total(mode, "pss_mib"),
            _median(runs[mode], lambda run: run["template_pss_mib"]),
        )
        for mode in MODES
    }
    rows = [
        f"| {stack} | "
        + " | ".join(f"{stack_ready(mode, stack):.2f}" for mode in MODES)
        + f" | {stack_ready('forked, warm', stack) / stack_ready('fresh', stack):.2f} |"
        for stack in stacks
    ]
    fresh_pss = memory["fresh"][0]
    return "\n".join(
        [
            "## Fifteen container processes: fresh against forked from their stack's template",
            "",
            "The fifteen containers of `examples/fifteen.yaml`, started one after another through the replica supervisor's",
            "`ContainerProcess` (no Ray), fresh or forked from their stack's template, cold (the templates start with the",
            f"first container of their stack) or warm (they already run). Medians of {saved['rounds']} interleaved rounds;",
            "`loadtests/bench_fork_templates.py` has the method. Every container answered its sample request every time.",
            "",
            "**Start, container by container** (median seconds from `start()` to ready, by stack):",
            "",
            "| stack | fresh | forked, cold | forked, warm | warm / fresh |",
            "|---|---|---|---|---|",
            *rows,
            "",
            "**All fifteen:**",
            "",
            "| | fresh | forked, cold | forked, warm |",
            "|---|---|---|---|",
            "| seconds to start all fifteen, one after another | "
            + " | ".join(f"{_median(runs[m], lambda run: run['wall_s']):.1f}" for m in MODES)
            + " |",
            "| CPU-seconds of the container processes | "
            + " | ".join(f"{total(m, 'cpu_s'):.1f}" for m in MODES)
            + " |",
            "| CPU-seconds of the templates (their imports) | — | "
            + f"{_median(runs['forked, cold'], lambda run: run['template_cpu_s']):.1f} | (already paid) |",
            "| PSS of the fifteen container processes, MiB | "
            + " | ".join(f"{memory[m][0]:,.0f}" for m in MODES)
            + " |",
            "| PSS of the templates, MiB | — | "
            + f"{memory['forked, cold'][1]:,.0f} | {memory['forked, warm'][1]:,.0f} |",
            "| **PSS, all, MiB** (ratio to fresh) | "
            + " | ".join(
                f"**{sum(memory[m]):,.0f}** ({sum(memory[m]) / fresh_pss:.2f})" for m in MODES
            )
            + " |",
            "",
            run_line(saved, RESULTS),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    started, clock = dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), time.perf_counter()
    machine = machine_facts()
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-fork-templates-") as scratch:
        models = Path(scratch) / "models"
        hetero_models(models)
        chosen = containers(models)
        try:
            for round_ in range(args.rounds):
                order = MODES if round_ % 2 == 0 else ("forked, cold", "forked, warm", "fresh")
                for mode in order:
                    result = run_mode(mode, chosen)
                    runs[mode].append(result)
                    print(mode, f"{result['wall_s']:.1f} s", flush=True)
        finally:
            stop_templates(ROOT)
    saved = {
        "started": started,
        "seconds": time.perf_counter() - clock,
        "command": command_line(__file__),
        "rounds": args.rounds,
        "machine": machine,
        "runs": runs,
    }
    write_results(RESULTS, saved)
    print(docs_section(saved))
    if args.write_docs:
        write_section(DOCS, "bench_fork_templates", docs_section(saved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
