"""The load-test harness's benchmark mode: our endpoint against a floor, in one run, as ratios.

    .venv/bin/python -m loadtests.bench_harness [--rate 100] [--duration 30] [--write-docs]

Trains the iris pipeline (skops for us, joblib for the floor: one fitted object), starts the floor
(loadtests/harness/floor_server.py: the model behind a bare Starlette app) and an embedded endpoint
server with one sklearn container, then runs `serving loadtest direct --rate R --baseline FLOOR`,
which drives both with the same open-loop schedule and reports ours / floor. Its section of
docs/benchmarks/bench_harness.md comes from its report (bench_invoke's wrk tables are the
closed-loop view of the same question).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from loadtests.harness.results import ROOT, write_results, write_section

RESULTS = ROOT / "loadtests" / "results" / "bench_harness.json"


def run(work: Path, rate: float, duration: float) -> dict:
    from loadtests.harness.loadtest import run_loadtest
    from loadtests.harness.models import iris_models
    from loadtests.harness.peers import start_floor
    from loadtests.harness.processes import Processes
    from loadtests.harness.servers import embedded_endpoint

    paths = iris_models(work)
    processes = Processes()
    try:
        _, floor = start_floor(processes, paths, work)
        spec = {
            "EndpointName": "bench-harness",
            "Containers": [
                {
                    "ContainerHostname": "iris",
                    "Image": "sklearn",
                    "ModelDataUrl": str(paths["skops_dir"]),
                }
            ],
        }
        with embedded_endpoint(spec) as url:
            return run_loadtest(
                "direct",
                f"{url}/endpoints/bench-harness",
                work / "report",
                "--rate",
                str(rate),
                "--duration",
                str(duration),
                "--payload-json",
                "[[5.1, 3.5, 1.4, 0.2]]",
                "--baseline",
                f"{floor}/invocations",
                "--metrics-check",
                timeout=duration * 3 + 300,
            )
    finally:
        processes.stop_all()


def render(report: dict) -> str:
    ours, floor, ratios = report, report["baseline"], report["ratios"]
    p = report["parameters"]
    check = report.get("metrics_check") or {}
    row = lambda name, r: (
        f"| {name} | {r['latency_ms']['p50']:.2f} ms | {r['latency_ms']['p90']:.2f} ms | "  # noqa: E731
        f"{r['latency_ms']['p99']:.2f} ms | {r['throughput_rps']['ok']:.1f} | "
        f"{r['totals']['failures']} |"
    )
    return "\n".join(
        [
            "## Load-test harness: endpoint vs floor, open loop",
            "",
            f"`.venv/bin/python -m loadtests.bench_harness --write-docs`: `serving loadtest direct --rate {p.get('rate', '?')} "
            f"--duration {p.get('duration', '?')} --baseline FLOOR` in one run (raw report in "
            "`loadtests/results/bench_harness.json`). The same scikit-learn pipeline behind our endpoint (one container) "
            "and behind the floor (a bare Starlette app calling it in-process); the same open-loop schedule for both, "
            "latency measured from each request's due time.",
            "",
            "| server | p50 | p90 | p99 | ok req/s | failed |",
            "|---|---|---|---|---|---|",
            row("ours", ours),
            row("floor", floor),
            f"| **ours / floor** | **{ratios['p50']:.2f}** | | **{ratios['p99']:.2f}** | {ratios['throughput']:.2f} | |",
            "",
            f"The server's own `serving_invocations_total` grew by {check.get('difference')} during the run; the harness "
            f"counted {check.get('harness_answered')} answers (match: {check.get('matches')}).",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--render", metavar="JSON")
    args = parser.parse_args()
    if args.render:
        report = json.loads(Path(args.render).read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="bench-harness-") as work:
            report = run(Path(work), args.rate, args.duration)
        report.pop("timeseries", None)
        if isinstance(report.get("baseline"), dict):
            report["baseline"].pop("timeseries", None)
        write_results(RESULTS, report, indent=1)
    text = render(report)
    print(text)
    if args.write_docs:
        write_section(ROOT / "docs" / "benchmarks" / "bench_harness.md", "bench_harness", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
