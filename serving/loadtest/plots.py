"""`report.html`: one self-contained page, the summary table and four plots as inline PNGs.

Drawn from the report dict alone (not the raw samples), so a page can be re-rendered from any
saved report.json: `python -m serving.loadtest.plots report.json > report.html`.
"""

from __future__ import annotations

import base64
import html
import io
import json
import sys
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from serving.loadtest.report import summary_table  # noqa: E402


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def latency_plot(report: Mapping[str, Any]) -> str:
    figure, axes = plt.subplots(figsize=(9, 3.2))
    rows = report["timeseries"]
    for key in ("p50", "p90", "p99"):
        points = [(r["t"], r[key]) for r in rows if r[key] is not None]
        if points:
            axes.plot(*zip(*points), label=key, marker=".", linewidth=1)
    axes.set(
        title="Latency of successful requests (from intended send time)",
        xlabel="seconds",
        ylabel="ms",
    )
    axes.set_ylim(bottom=0)
    axes.legend(loc="upper left")
    axes.grid(alpha=0.3)
    return _png(figure)


def _per_second(axes: Any, seconds: list[float], values: list[float], **style: Any) -> None:
    """Per-second counts as steps, the last second drawn to its end."""
    if seconds:
        axes.step(
            list(seconds) + [seconds[-1] + 1], list(values) + [values[-1]], where="post", **style
        )


def throughput_plot(report: Mapping[str, Any]) -> str:
    figure, axes = plt.subplots(figsize=(9, 3.2))
    rows = report["timeseries"]
    seconds = [r["t"] for r in rows]
    unit = "req/s" if report["parameters"]["load_mode"] == "open" else "users"
    levels = [(r["t"], r["level"]) for r in rows if r["level"] is not None]
    if levels:  # first and wide, so the measured lines stay visible on top of it
        twin = axes.twinx() if unit == "users" else axes
        _per_second(
            twin,
            *map(list, zip(*levels)),
            label=f"planned ({unit})",
            color="lightgrey",
            linewidth=4,
        )
        if twin is not axes:
            twin.set_ylabel("users")
            twin.set_ylim(bottom=0)
            twin.legend(loc="upper right")
    _per_second(axes, seconds, [r["requests"] for r in rows], label="sent", linewidth=1)
    _per_second(axes, seconds, [r["ok"] for r in rows], label="ok", linewidth=1)
    if any(r["dropped"] for r in rows):
        _per_second(axes, seconds, [r["dropped"] for r in rows], label="dropped", linewidth=1)
    axes.set(
        title="Throughput (requests per second, by intended send time)",
        xlabel="seconds",
        ylabel="requests/s",
    )
    axes.set_ylim(bottom=0)
    axes.legend(loc="upper left")
    axes.grid(alpha=0.3)
    return _png(figure)


def errors_plot(report: Mapping[str, Any]) -> str:
    figure, axes = plt.subplots(figsize=(9, 3.2))
    rows = report["timeseries"]
    codes = list(report["totals"]["failures_by_code"])
    bottom = [0] * len(rows)
    for code in codes:
        counts = [r["errors_by_code"].get(code, 0) for r in rows]
        axes.bar(
            [r["t"] for r in rows],
            counts,
            bottom=bottom,
            label=f"{code} ({sum(counts)})",
            width=1.0,
            align="edge",
        )
        bottom = [b + c for b, c in zip(bottom, counts)]
    if not codes:
        axes.text(0.5, 0.5, "no errors", ha="center", va="center", transform=axes.transAxes)
    else:
        axes.legend(loc="upper left")
    axes.set(title="Errors per second, by error code", xlabel="seconds", ylabel="errors/s")
    axes.grid(alpha=0.3)
    return _png(figure)


def replicas_plot(report: Mapping[str, Any]) -> str:
    figure, axes = plt.subplots(figsize=(9, 3.2))
    containers = report["replicas"]["containers"]
    for name, series in containers.items():
        axes.step(
            [p[0] for p in series], [p[1] for p in series], where="post", label=name, marker="."
        )
    if containers:
        axes.legend(loc="upper left")
    else:
        axes.text(
            0.5, 0.5, "no replica samples", ha="center", va="center", transform=axes.transAxes
        )
    axes.set(
        title="CurrentReplicas per container (GET /endpoints/{name})",
        xlabel="seconds",
        ylabel="replicas",
    )
    axes.set_ylim(bottom=0)
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    return _png(figure)


def render_html(report: Mapping[str, Any]) -> str:
    """The page: summary text, parameters, and the four plots, with no external resources."""
    plots = [
        latency_plot(report),
        throughput_plot(report),
        errors_plot(report),
        replicas_plot(report),
    ]
    images = "\n".join(f'<img alt="plot" src="data:image/png;base64,{png}">' for png in plots)
    title = f"serving loadtest: {report['scenario']} ({report.get('start') or ''})"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:62em}} pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}
img{{display:block;margin:1em 0;max-width:100%}}</style></head>
<body><h1>{html.escape(title)}</h1>
<h2>Summary</h2><pre>{html.escape(summary_table(report))}</pre>
<h2>Plots</h2>
{images}
<h2>Parameters</h2><pre>{html.escape(json.dumps(report["parameters"], indent=2))}</pre>
</body></html>
"""


if __name__ == "__main__":  # pragma: no cover
    with open(sys.argv[1]) as file:
        sys.stdout.write(render_html(json.load(file)))
