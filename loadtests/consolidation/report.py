"""bench_consolidation's report: one row per scenario, per-stack replica footprints, and its section
of docs/benchmarks/bench_consolidation.md (what consolidation saves)."""

from __future__ import annotations

import statistics
from typing import Any

SCENARIOS = ("consolidated", "separate-endpoints", "separate-servers")
# Everything that is not a container replica: what each separate endpoint server pays again.
SYSTEM_ROLES = ("driver", "ray-system", "serve-controller", "registry", "gateway", "idle-worker")


def _per_stack(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Mean footprint of one replica per stack: its Serve replica process plus its container
    process."""
    groups = result["memory"]["groups"]
    stacks = {}
    for role, entries in groups.items():
        if role.startswith("replica:"):
            stack = role.split(":", 1)[1]
            both = entries + groups.get(f"container:{stack}", [])
            stacks[stack] = {
                "replicas": len(entries),
                **{
                    f"{key}_mb": sum(e[key] for e in both) / len(entries) / 2**20
                    for key in ("pss", "uss", "rss")
                },
            }
    return stacks


def _group_mb(result: dict[str, Any], role: str) -> float:
    return sum(e["pss"] for e in result["memory"]["groups"].get(role, [])) / 2**20


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """One row per scenario (separate-servers summed over its fifteen runs) plus per-stack
    footprints."""
    rows = {}
    for scenario, result in results.items():
        if scenario == "separate-servers":
            runs = result
            rows[scenario] = {
                "load": max(max(r["load_start"], r["load_end"]) for r in runs),
                "endpoints": len(runs),
                "startup_s": sum(r["startup_s"] for r in runs),
                "startup_max_s": max(r["startup_s"] for r in runs),
                "server_start_s": sum(r["server_start_s"] for r in runs),
                "pss_mb": sum(r["memory"]["total_pss"] for r in runs) / 2**20,
                "idle_cpu_cores": sum(r["idle_cpu_cores"] for r in runs),
                "reserved_cpus": sum(r["reserved_cpus"] for r in runs),
                "answered": sum(r["answered"] for r in runs),
                "containers": len(runs),
                "system_mb": sum(_group_mb(r, g) for r in runs for g in SYSTEM_ROLES),
            }
        else:
            rows[scenario] = {
                "load": max(result["load_start"], result["load_end"]),
                "endpoints": result["endpoints"],
                "startup_s": result["startup_s"],
                "startup_max_s": result["startup_s"],
                "server_start_s": result["server_start_s"],
                "pss_mb": result["memory"]["total_pss"] / 2**20,
                "idle_cpu_cores": result["idle_cpu_cores"],
                "reserved_cpus": result["reserved_cpus"],
                "answered": result["answered"],
                "containers": result["containers"],
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
        stacks["alone"] = {
            stack: {
                key: statistics.mean(n[key] for n in entries)
                for key in ("pss_mb", "uss_mb", "rss_mb")
            }
            | {"replicas": len(entries)}
            for stack, entries in merged.items()
        }
        stacks["alone_system_mb"] = statistics.mean(
            sum(_group_mb(r, g) for g in SYSTEM_ROLES) for r in results["separate-servers"]
        )
    return {"rows": rows, "stacks": stacks}


def markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    rows, stacks = summary["rows"], summary["stacks"]
    lines = [
        "| scenario | endpoints | containers answering | start-up (deploy → InService) | memory (PSS, all Ray processes) "
        "| of which not replicas | idle CPU (cores) | reserved CPUs | load avg (max seen) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    labels = {
        "consolidated": "one endpoint, {n} containers",
        "separate-endpoints": "{n} endpoints, one Ray",
        "separate-servers": "{n} endpoints, {n} Rays (summed)",
    }
    for scenario in SCENARIOS:
        if scenario not in rows:
            continue
        row = rows[scenario]
        startup = f"{row['startup_s']:.1f} s" + (
            f" (sum; longest {row['startup_max_s']:.1f} s)"
            if scenario == "separate-servers"
            else ""
        )
        lines.append(
            f"| {labels[scenario].format(n=row['containers'])} | {row['endpoints']} | {row['answered']}/15 | {startup} | "
            f"{row['pss_mb']:,.0f} MiB | {row['system_mb']:,.0f} MiB | {row['idle_cpu_cores']:.3f} | "
            f"{row['reserved_cpus']:.1f} | {row['load']:.1f} |"
        )
    for key, title in (
        (
            "consolidated",
            "Per-stack replica footprint in the consolidated endpoint (mean per replica)",
        ),
        ("alone", "Per-stack replica footprint alone on its own Ray (mean over that stack's runs)"),
    ):
        if key not in stacks:
            continue
        lines += [
            "",
            f"{title}:",
            "",
            "| stack | replicas | PSS | USS | RSS |",
            "|---|---|---|---|---|",
        ]
        for stack in ("sklearn", "pytorch", "tensorflow", "onnx", "python"):
            if stack in stacks[key]:
                s = stacks[key][stack]
                lines.append(
                    f"| {stack} | {s['replicas']} | {s['pss_mb']:.0f} MiB | {s['uss_mb']:.0f} MiB | {s['rss_mb']:.0f} MiB |"
                )
    if "alone_system_mb" in stacks:
        lines += [
            "",
            f"Everything but the replica in one single-container server (driver, Ray, Serve, gateway, registry): {stacks['alone_system_mb']:.0f} MiB PSS.",
        ]
    lines += [
        "",
        f"Run: `{meta['command']}` at {meta['started']} ({meta['duration_s']:.0f} s); load average before "
        f"{meta['machine_before']['load_average']}, after {meta['machine_after']['load_average']}; "
        f"{meta['machine_before']['cpus']} CPUs, {meta['machine_before']['memory_gib']} GiB.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
    ]
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
`python -m loadtests.bench_consolidation --write-docs` (its docstring has the method); every scenario checks
that all fifteen containers answer their sample request correctly before it is measured.
"""


def savings(summary: dict[str, Any]) -> list[str]:
    """What consolidation saves, as ratios of the same run's scenarios."""
    rows = summary["rows"]
    one = rows.get("consolidated")
    lines = []
    for other, label in (
        ("separate-servers", "fifteen endpoints on their own Ray each"),
        ("separate-endpoints", "fifteen endpoints sharing one Ray"),
    ):
        if one is None or other not in rows:
            continue
        row = rows[other]
        memory = 1 - one["pss_mb"] / row["pss_mb"]
        idle = 1 - one["idle_cpu_cores"] / row["idle_cpu_cores"] if row["idle_cpu_cores"] else 0.0
        lines.append(
            f"- Against {label}: {_less(memory)} memory ({one['pss_mb']:,.0f} vs {row['pss_mb']:,.0f} MiB), "
            f"{_less(idle)} idle CPU ({one['idle_cpu_cores']:.3f} vs {row['idle_cpu_cores']:.3f} cores)."
        )
    if one and "separate-servers" in rows:
        row = rows["separate-servers"]
        lines.append(
            f"- Start-up: the fifteen containers of one endpoint were all InService {one['startup_s']:.0f} s after "
            f"the deploy call, sharing this machine's 2 cores; one single-container endpoint alone took "
            f"{row['startup_s'] / row['endpoints']:.0f} s on average (longest {row['startup_max_s']:.0f} s), "
            f"so fifteen machines would be up in about that, and this machine takes {row['startup_s']:.0f} s "
            "to start them one after another."
        )
    if "alone_system_mb" in summary["stacks"] and one:
        lines.append(
            f"- Where the saving comes from: each endpoint of its own pays {summary['stacks']['alone_system_mb']:.0f} MiB "
            "for Ray, Serve, the gateway and the registry before its model, and keeps Ray's background work "
            f"running; the consolidated endpoint pays that once ({one['system_mb']:,.0f} MiB). The replicas "
            "themselves cost about the same either way (per-stack tables), and so do the CPUs they reserve. "
            "Fifteen endpoints on one shared Ray already get most of it: the saving is in sharing the "
            "runtime, which on SageMaker means sharing an instance."
        )
    return lines


def _less(fraction: float) -> str:
    return f"{fraction:.0%} less" if fraction >= 0 else f"{-fraction:.0%} more"


def docs_section(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    return (
        "\n".join(
            [
                INTRO,
                "### Results",
                "",
                markdown(summary, meta),
                "### What consolidation saves",
                "",
                *savings(summary),
            ]
        )
        + "\n"
    )
