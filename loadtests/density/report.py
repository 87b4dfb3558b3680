"""bench_density's report: the floor, MLServer and ours side by side with ratios against the floor,
ours per container (supervisor vs container process; shared vs private pages), and memory by
package."""

from __future__ import annotations

from typing import Any

SCENARIOS = ("floor", "mlserver", "ours")
LABELS = {
    "floor": "floor: one Python process, in-process calls",
    "mlserver": "MLServer 1.7.1, one server, 15 models",
    "ours": "ours: one endpoint, 15 containers",
}
STACKS = ("sklearn", "pytorch", "tensorflow", "onnx", "python")
MIB = 2**20


def row(scenario: str, result: dict[str, Any]) -> dict[str, Any]:
    """The comparable numbers of one scenario's result."""
    load = " → ".join(f"{x:.2f}" for x in result.get("load", [])) or "–"
    if scenario == "ours":
        return {
            "load": load,
            "pss_mb": result["memory"]["total_pss"] / MIB,
            "idle_cpu_cores": result["idle_cpu_cores"],
            "startup_s": result["total_startup_s"],
            "answered": result["answered"],
            "processes": sum(len(g) for g in result["memory"]["groups"].values()),
        }
    return {
        "load": load,
        "pss_mb": result["total_pss"] / MIB,
        "idle_cpu_cores": result["idle_cpu_cores"],
        "startup_s": result["startup_s"],
        "answered": result["answered"],
        "processes": len(result["processes"]),
    }


# Below this the floor's idle is a few 10 ms CPU ticks over the window, and a ratio to it means nothing.
MEASURABLE_IDLE_CORES = 0.005


def _ratio(value: float, floor: float, least: float = 0.0) -> str:
    return f"{value / floor:.1f}×" if floor > least else "–"


def results_table(results: dict[str, Any]) -> list[str]:
    rows = {s: row(s, results[s]) for s in SCENARIOS if s in results}
    floor = rows.get("floor")
    lines = [
        "| | processes | models answering | start-up (start → all answered) | PSS | idle CPU (cores) "
        "| PSS ÷ floor | idle ÷ floor | start-up ÷ floor | load avg before → after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario, r in rows.items():
        ratios = (
            [
                _ratio(r["pss_mb"], floor["pss_mb"]),
                _ratio(r["idle_cpu_cores"], floor["idle_cpu_cores"], MEASURABLE_IDLE_CORES),
                _ratio(r["startup_s"], floor["startup_s"]),
            ]
            if floor
            else ["–"] * 3
        )
        lines.append(
            f"| {LABELS[scenario]} | {r['processes']} | {r['answered']}/15 | {r['startup_s']:.1f} s "
            f"| {r['pss_mb']:,.0f} MiB | {r['idle_cpu_cores']:.3f} | "
            + " | ".join(ratios)
            + f" | {r['load']} |"
        )
    if "ours" in rows and "mlserver" in rows:
        ours, peer = rows["ours"], rows["mlserver"]
        lines += [
            "",
            f"Ours against MLServer: {_ratio(ours['pss_mb'], peer['pss_mb'])} the memory, "
            f"{_ratio(ours['startup_s'], peer['startup_s'])} the start-up, idle "
            f"{ours['idle_cpu_cores']:.3f} against {peer['idle_cpu_cores']:.3f} cores (the floor's "
            f"{floor['idle_cpu_cores'] if floor else 0:.3f}: CPU time is counted in 10 ms ticks, "
            "0.0003 cores over the window, so no idle ratio to the floor is given under "
            f"{MEASURABLE_IDLE_CORES} cores).",
        ]
    if "ours" in results:
        ours = results["ours"]
        lines += [
            "",
            f"Ours' start-up is from its driver's start: Python and imports, the embedded Ray and the "
            f"endpoint server ({ours['server_start_s']:.1f} s from `ray.init` to serving), then the "
            f"deploy call to all fifteen InService ({ours['startup_s']:.1f} s), then the fifteen "
            "sample requests.",
        ]
    return lines


def _mean(rows: list[dict[str, Any]], part: str, key: str) -> float:
    return sum(r[part][key] for r in rows) / len(rows) / MIB


def per_container(ours: dict[str, Any], floor_mb: float | None = None) -> list[str]:
    """Mean per container of each stack: the Ray worker (replica + supervisor) and the container
    process, PSS and its private (USS) and shared pages; then where ours' total goes."""
    rows = ours["extra"]["containers"]
    lines = [
        "| stack | containers | supervisor PSS | its private | its shared | container process PSS "
        "| its private | its shared | both, PSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for stack in STACKS:
        mine = [r for r in rows if r["stack"] == stack]
        if not mine:
            continue
        worker = [_mean(mine, "worker", k) for k in ("pss", "uss", "shared")]
        container = [_mean(mine, "container", k) for k in ("pss", "uss", "shared")]
        cells = " | ".join(f"{v:.0f} MiB" for v in worker + container)
        lines.append(f"| {stack} | {len(mine)} | {cells} | {worker[0] + container[0]:.0f} MiB |")
    workers = sum(r["worker"]["pss"] for r in rows) / MIB
    containers = sum(r["container"]["pss"] for r in rows) / MIB
    found = ours["extra"].get("templates", [])
    templates = sum(info["pss"] for info in found) / MIB
    total = ours["memory"]["total_pss"] / MIB
    system = total - workers - containers - templates
    lines += [
        "",
        f"Where ours' {total:,.0f} MiB go: the {len(rows)} containers' supervisors (Ray workers: "
        "a Serve replica each, or their shares of a container host) "
        f"{workers:,.0f} MiB ({workers / total:.0%}), the {len(rows)} container processes "
        f"{containers:,.0f} MiB ({containers / total:.0%}), "
        + (
            f"the {len(found)} stack templates they were forked from {templates:,.0f} MiB "
            f"({templates / total:.0%}), "
            if found
            else ""
        )
        + "everything else (the driver, Ray's own "
        "processes, the registry with the control plane, the gateway, the Serve controller where a "
        "container Serve runs started it, idle "
        f"workers) {system:,.0f} MiB "
        f"({system / total:.0%}).",
    ]
    if floor_mb:
        lines[-1] += (
            f" Against the floor's {floor_mb:,.0f} MiB: the container processes alone hold "
            f"{containers / floor_mb:.1f}× it (each imports its framework again and keeps its own "
            f"heap), and the supervisors and everything else add {workers + system:,.0f} MiB that the "
            "floor does not have at all."
        )
    return lines


def _packages(groups: dict[str, dict[str, int]] | None, count: int = 5) -> str:
    if not groups:
        return "(not readable)"
    ranked = sorted(groups.items(), key=lambda item: -item[1]["pss"])[:count]
    return ", ".join(
        f"{name} {v['pss'] / MIB:.0f} ({v['private'] / MIB:.0f} private)" for name, v in ranked
    )


def _total(groups: dict[str, dict[str, int]] | None) -> str:
    return f"{sum(v['pss'] for v in groups.values()) / MIB:,.0f} MiB" if groups else "–"


def by_package(results: dict[str, Any]) -> list[str]:
    """Each process's PSS by what mapped it: the five largest, in MiB (private pages in brackets)."""
    lines = ["| process | PSS | largest parts, MiB PSS (private) |", "|---|---|---|"]
    for scenario, label in (
        ("floor", "floor (the one process)"),
        ("mlserver", "MLServer's largest process"),
    ):
        if scenario in results:
            groups = results[scenario]["largest_packages"]
            lines.append(f"| {label} | {_total(groups)} | {_packages(groups)} |")
    packages = results.get("ours", {}).get("extra", {}).get("packages", {})
    for stack in STACKS:
        for part, label in (("worker", "supervisor"), ("container", "container process")):
            if stack in packages:
                groups = packages[stack][part]
                if part == "worker" and packages[stack].get("hosted"):
                    label = "supervisor (the whole container host)"
                lines.append(f"| ours, {stack}: {label} | {_total(groups)} | {_packages(groups)} |")
    return lines


def imports(costs: dict[str, dict[str, int]], packages: dict[str, Any]) -> list[str]:
    """A fresh `python -c "import ..."` per framework: what each container process of the stack
    pays again before its model; next to it, that stack's container process (`packages`: ours)."""
    from loadtests.density.imports import IMPORTS
    from loadtests.density.smaps import HEAP

    lines = [
        "| imported in a fresh Python | PSS | private | heap and anonymous "
        "| ours' container process of that stack: PSS | its heap and anonymous |",
        "|---|---|---|---|---|---|",
    ]
    for name, cost in costs.items():
        stack = IMPORTS.get(name, (None, ""))[0]
        ours = packages.get(stack, {}).get("container") if stack else None
        mine = (
            [
                f"{packages[stack].get('hostname', stack)}: {_total(ours)}",
                f"{ours.get(HEAP, {}).get('pss', 0) / MIB:.0f} MiB",
            ]
            if ours
            else ["–", "–"]
        )
        lines.append(
            f"| {name} | {cost['pss'] / MIB:.0f} MiB | {cost['private'] / MIB:.0f} MiB "
            f"| {cost['heap'] / MIB:.0f} MiB | " + " | ".join(mine) + " |"
        )
    return lines


def sharers(results: dict[str, Any]) -> str:
    """How many processes outside each measured tree mapped torch's, TensorFlow's or ONNX
    Runtime's library: the file pages' PSS is split with them too."""
    counts = {
        s: (results[s].get("extra", results[s]) if s == "ours" else results[s]).get(
            "outside_sharers"
        )
        for s in SCENARIOS
        if s in results
    }
    return (
        "Processes outside the measured tree that mapped torch's, TensorFlow's or ONNX Runtime's "
        "main library while it was measured (their file pages' PSS is split with those too; "
        "MLServer's environment has files of its own): "
        + ", ".join(f"{s} {n}" for s, n in counts.items())
        + "."
    )


INTRO = """\
## Density: the fifteen models in one process, in MLServer, and on one endpoint of ours

What holding the fifteen models of `examples/fifteen.yaml` (three per stack: scikit-learn, PyTorch,
TensorFlow, ONNX, Python) costs three ways, measured in one run of `python -m loadtests.bench_density`
(its docstring has the method): the floor, one plain Python process that loads every model with its
framework and answers each sample request in-process (no server, no isolation); MLServer 1.7.1 with the
fifteen as models of one server (one model repository, default settings but `debug: false`, so one
inference worker): its own scikit-learn runtime for the three scikit-learn models and, for the four stacks
it has no runtime for, a small custom runtime as a user would write one (`loadtests/density/mlserver_runtime.py`,
loading each artifact as the floor does); and ours, the consolidated endpoint of fifteen containers of
[bench_consolidation](bench_consolidation.md). Start-up is from starting the first process to every model
having answered its sample request correctly; memory is PSS (shared pages split between the processes
sharing them) over that process and every process it started; idle CPU is what they use over 30 s with no
requests. PyTorch, TensorFlow and ONNX Runtime run one intra-op thread in all three, OpenMP not spinning.
"""


def _run_line(meta: dict[str, Any], results: dict[str, Any]) -> list[str]:
    peer = results.get("mlserver", {}).get("versions", {})
    return [
        f"Run: `{meta['command']}` at {meta['started']} ({meta['duration_s']:.0f} s); load average "
        f"before {meta['machine_before']['load_average']}, after "
        f"{meta['machine_after']['load_average']}; {meta['machine_before']['cpus']} CPUs, "
        f"{meta['machine_before']['memory_gib']} GiB.",
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
        + (
            "; MLServer's environment: " + ", ".join(f"{k} {v}" for k, v in peer.items())
            if peer
            else ""
        )
        + ".",
    ]


def docs_section(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [INTRO, "### Results", "", *results_table(results), ""]
    if "ours" in results and "extra" in results["ours"]:
        lines += [
            "### Ours, per container",
            "",
            "Mean per container of each stack. A container is two processes: its supervisor, a Ray"
            " worker (`serving/model_server/supervisor.py` runs in it): a Serve replica of its own, or"
            " its node's container host, which supervises every hosted container and is counted here"
            " as an equal share per container; and the container process it started"
            " (`serving/model_server/main.py`, sandboxed). Private is USS"
            " (Private_Clean + Private_Dirty), shared is Shared_Clean + Shared_Dirty (resident pages"
            " other processes also map), from `/proc/PID/smaps_rollup`.",
            "",
            *per_container(
                results["ours"],
                row("floor", results["floor"])["pss_mb"] if "floor" in results else None,
            ),
            "",
        ]
    lines += [
        "### Where the memory lies, by package",
        "",
        "PSS per mapping of `/proc/PID/smaps`, grouped by what mapped it: a package under site-packages"
        " (its shared libraries and their `.libs`), the interpreter and its standard library, system"
        " libraries, or heap and anonymous memory (Python objects, the frameworks' allocations). One"
        " container of each stack.",
        "",
        *by_package(results),
        "",
    ]
    if "imports" in results:
        lines += [
            "### What importing a framework costs",
            "",
            'A fresh `python -c "import ..."` per framework, nothing loaded: what each container'
            " process of a stack pays again before its model (`skops.io` and `tensorflow` imported as"
            " our stacks import them: without PyTorch, and without Keras for a SavedModel; the floor"
            " and MLServer import both whole). Next to it, the container process of that stack"
            " measured above (its model loaded, its server running).",
            "",
            *imports(
                results["imports"], results.get("ours", {}).get("extra", {}).get("packages", {})
            ),
            "",
        ]
    lines += [
        sharers(results),
        "",
        *_run_line(meta, results),
    ]
    return "\n".join(lines) + "\n"
