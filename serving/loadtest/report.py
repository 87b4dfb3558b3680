"""From a run's raw samples to `report.json`, the terminal summary and (via `plots`) `report.html`.

Pure functions of a `RunResult`: unit tests build results by hand. Latency percentiles are over
successful (2xx) answers only, so fast rejections (429s under overload) cannot make a run look
faster; failures are counted by status and by error code instead. Per-second series are bucketed
by each request's intended send time, the time its latency is measured from.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from serving.loadtest.recorder import RunResult, Sample
from serving.loadtest.report_types import (
    MetricsCheck,
    Parameters,
    Percentiles,
    Ratios,
    ReplicaSeries,
    Report,
    Second,
    Summary,
    TargetSummary,
    Totals,
)

# open-loop p99 launch lag above this: the generator, not the server, set the pace
LAG_WARNING_MS = 10.0


def percentiles(values: Iterable[float]) -> Percentiles:
    """Nearest-rank p50/p90/p99, max and mean (milliseconds, 3 decimals); None for an empty
    sample."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None}

    def rank(q: float) -> float:
        return round(ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)], 3)

    return {
        "p50": rank(50),
        "p90": rank(90),
        "p99": rank(99),
        "max": round(ordered[-1], 3),
        "mean": round(sum(ordered) / len(ordered), 3),
    }


def _iso(epoch: float) -> str | None:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds") if epoch else None


def _failure_key(status: int) -> str:
    return str(status) if status else "no answer"


def totals(result: RunResult) -> Totals:
    """Counts: every request sent, how it ended, and what the generator could not send."""
    failed = [s for s in result.samples if s.error is not None]
    return {
        "requests": len(result.samples),
        "ok": len(result.samples) - len(failed),
        "failures": len(failed),
        "answered": result.answered,
        "dropped": len(result.dropped),
        "unfinished": result.unfinished,
        "failures_by_status": dict(Counter(_failure_key(s.status) for s in failed).most_common()),
        "failures_by_code": dict(
            Counter(s.error for s in failed if s.error is not None).most_common()
        ),
    }


def _ok_latencies(samples: Iterable[Sample]) -> list[float]:
    return [s.latency_ms for s in samples if s.error is None]


def per_target(result: RunResult) -> dict[str, TargetSummary]:
    """Requests, failures and latency per container (the endpoint label for untargeted requests)."""
    groups: dict[str, list[Sample]] = defaultdict(list)
    for sample in result.samples:
        groups[sample.label].append(sample)
    dropped = Counter(label for _, label in result.dropped)
    return {
        label: {
            "requests": len(group),
            "failures": sum(1 for s in group if s.error is not None),
            "dropped": dropped.get(label, 0),
            "latency_ms": percentiles(_ok_latencies(group)),
        }
        for label, group in sorted(groups.items())
    }


def per_model(result: RunResult, top: int = 50) -> dict[str, int]:
    """Requests per TargetModel, most requested first (MultiModel traffic only)."""
    counts = Counter(s.model for s in result.samples if s.model is not None)
    return dict(counts.most_common(top))


def timeseries(result: RunResult, duration: float) -> list[Second]:
    """One row per second of the run: planned level, requests, errors (by code), drops, latency
    percentiles."""
    last = max([s.sent for s in result.samples] + [t for t, _ in result.dropped] + [0.0])
    seconds = max(int(math.ceil(duration)), int(last) + 1)
    buckets: list[list[Sample]] = [[] for _ in range(seconds)]
    for sample in result.samples:
        buckets[min(int(sample.sent), seconds - 1)].append(sample)
    drops = Counter(min(int(t), seconds - 1) for t, _ in result.dropped)
    rows: list[Second] = []
    for second, bucket in enumerate(buckets):
        errors = Counter(s.error for s in bucket if s.error is not None)
        latency = percentiles(_ok_latencies(bucket))
        rows.append(
            {
                "t": second,
                "level": result.levels[second] if second < len(result.levels) else None,
                "requests": len(bucket),
                "ok": len(bucket) - sum(errors.values()),
                "errors": sum(errors.values()),
                "errors_by_code": dict(errors),
                "dropped": drops.get(second, 0),
                "p50": latency["p50"],
                "p90": latency["p90"],
                "p99": latency["p99"],
            }
        )
    return rows


def replicas(result: RunResult) -> ReplicaSeries:
    """CurrentReplicas per container over time: {container: [[seconds, replicas], ...]} and poll
    errors."""
    series: dict[str, list[list[float]]] = defaultdict(list)
    for at, counts in result.replicas:
        for container, count in counts.items():
            series[container].append([at, count])
    return {"containers": dict(series), "errors": list(result.replica_errors)}


def summarize(result: RunResult, duration: float) -> Summary:
    """Everything the report says about one run."""
    counts = totals(result)
    elapsed = max(result.ended_at - result.started_at, 1e-9) if result.started_at else 0.0
    window = min(elapsed, duration)  # throughput over the load, not the drain of its last answers
    lag = percentiles(result.lag_ms) if result.lag_ms else None
    warning = None
    if lag and lag["p99"] is not None and lag["p99"] > LAG_WARNING_MS:
        warning = (
            f"the load generator launched requests late (p99 {lag['p99']:.1f} ms behind schedule): "
            "latencies include that lag; lower --rate or run the generator on a bigger machine"
        )
    elif result.cpu_warning:
        warning = "the load generator's CPU went above 90%: latencies may include client-side delay"
    return {
        "start": _iso(result.started_at),
        "end": _iso(result.ended_at),
        "elapsed_s": round(elapsed, 3),
        "interrupted": result.interrupted,
        "totals": counts,
        "latency_ms": percentiles(_ok_latencies(result.samples)),
        "throughput_rps": {
            "requests": round(counts["requests"] / window, 3) if window else 0.0,
            "ok": round(counts["ok"] / window, 3) if window else 0.0,
            "window_s": round(window, 3),
        },
        "per_target": per_target(result),
        "per_model": per_model(result),
        "timeseries": timeseries(result, duration),
        "replicas": replicas(result),
        "generator": {"lag_ms": lag, "cpu_warning": result.cpu_warning, "warning": warning},
    }


def ratios(ours: Summary, baseline: Summary) -> Ratios:
    """ours / baseline for p50, p99 latency and throughput (None where either side has no value)."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    return {
        "p50": ratio(ours["latency_ms"]["p50"], baseline["latency_ms"]["p50"]),
        "p99": ratio(ours["latency_ms"]["p99"], baseline["latency_ms"]["p99"]),
        "throughput": ratio(ours["throughput_rps"]["ok"], baseline["throughput_rps"]["ok"]),
    }


def build_report(
    scenario: str,
    parameters: Parameters,
    result: RunResult,
    duration: float,
    baseline: RunResult | None = None,
    baseline_url: str | None = None,
    metrics_check: MetricsCheck | None = None,
) -> Report:
    """The whole report: the main run's summary at top level, then the baseline and the metrics
    check."""
    report: Report = {
        "scenario": scenario,
        "parameters": dict(parameters),
        **summarize(result, duration),
    }
    if baseline is not None:
        summary = summarize(baseline, duration)
        report["baseline"] = {
            "url": baseline_url,
            "start": summary["start"],
            "end": summary["end"],
            "elapsed_s": summary["elapsed_s"],
            "totals": summary["totals"],
            "latency_ms": summary["latency_ms"],
            "throughput_rps": summary["throughput_rps"],
            "timeseries": summary["timeseries"],
            "generator": summary["generator"],
        }
        report["ratios"] = ratios(report, summary)
    if metrics_check is not None:
        report["metrics_check"] = metrics_check
    return report


def metrics_check(
    before: float | None, after: float | None, answered: int, error: str | None = None
) -> MetricsCheck:
    """The server's serving_invocations_total for the endpoint around the run, against the harness's
    count."""
    difference = after - before if before is not None and after is not None else None
    return {
        "metric": "serving_invocations_total",
        "before": before,
        "after": after,
        "difference": difference,
        "harness_answered": answered,
        "matches": difference == answered if difference is not None else None,
        "error": error,
    }


# --- terminal --------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def summary_table(report: Mapping[str, Any]) -> str:
    """A plain-text summary of the report for the terminal."""
    params, counts = report["parameters"], report["totals"]
    unit = "req/s" if params.get("load_mode") == "open" else "users"
    levels = (params.get("scenario") or {}).get("levels")
    if levels:
        load = "steps " + ",".join(f"{v:g}" for v in levels) + f" {unit}"
    else:
        load = f"{params.get('rate', params.get('users')):g} {unit}"
    lines = [
        f"serving loadtest {report['scenario']}: {params.get('endpoint_url')}  "
        f"({params.get('load_mode')} loop, {load}, {report['elapsed_s']:.1f} s"
        f"{', interrupted' if report.get('interrupted') else ''})",
        "",
    ]
    header = f"{'target':<24} {'requests':>9} {'failures':>9} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'max ms':>9}"
    lines += [header, "-" * len(header)]
    rows = list(report["per_target"].items()) + [
        (
            "all",
            {
                "requests": counts["requests"],
                "failures": counts["failures"],
                "latency_ms": report["latency_ms"],
            },
        )
    ]
    for label, row in rows:
        lat = row["latency_ms"]
        lines.append(
            f"{label[:24]:<24} {row['requests']:>9} {row['failures']:>9} {_ms(lat['p50']):>9} "
            f"{_ms(lat['p90']):>9} {_ms(lat['p99']):>9} {_ms(lat['max']):>9}"
        )
    rate = report["throughput_rps"]
    lines += [
        "",
        f"throughput {rate['requests']:.1f} req/s (ok {rate['ok']:.1f}/s); "
        f"dropped {counts['dropped']}; unfinished {counts['unfinished']}",
    ]
    if counts["failures_by_code"]:
        lines.append(
            "failures: "
            + ", ".join(f"{code} {n}" for code, n in counts["failures_by_code"].items())
            + "  (by status: "
            + ", ".join(f"{k}: {n}" for k, n in counts["failures_by_status"].items())
            + ")"
        )
    containers = report["replicas"]["containers"]
    if containers:
        lines.append(
            "replicas: "
            + ", ".join(
                f"{name} {series[0][1]}→{series[-1][1]} (max {max(c for _, c in series)})"
                for name, series in containers.items()
            )
        )
    if report["generator"]["warning"]:
        lines.append(f"WARNING: {report['generator']['warning']}")
    if "baseline" in report:
        base, ratio = report["baseline"], report["ratios"]
        lines.append(
            f"baseline {base['url']}: p50 {_ms(base['latency_ms']['p50'])} ms, p99 {_ms(base['latency_ms']['p99'])} ms, "
            f"{base['throughput_rps']['ok']:.1f} ok/s; ours/baseline: p50 {ratio['p50']}x, p99 {ratio['p99']}x, "
            f"throughput {ratio['throughput']}x"
        )
    check = report.get("metrics_check")
    if check:
        if check["difference"] is None:
            lines.append(
                f"metrics check: {check['error'] or 'serving_invocations_total is not exposed'}"
            )
        else:
            verdict = "matches" if check["matches"] else "DIFFERS from"
            lines.append(
                f"metrics check: serving_invocations_total +{check['difference']:g}, {verdict} the "
                f"{check['harness_answered']} answered requests"
            )
    return "\n".join(lines)


def write_report(report: Mapping[str, Any], out_dir: Path, html: bool = True) -> list[Path]:
    """Write report.json (and report.html with the plots); returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "report.json"]
    paths[0].write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    if html:
        from serving.loadtest.plots import (
            render_html,  # matplotlib: only when a page is wanted
        )

        paths.append(out_dir / "report.html")
        paths[1].write_text(render_html(report))
    return paths


__all__ = [
    "build_report",
    "metrics_check",
    "percentiles",
    "ratios",
    "summarize",
    "summary_table",
    "write_report",
]
