"""deploy/grafana's dashboards as Grafana reads them: their panels' queries, their template variables,
and Grafana's interpolation of both, so that tests can run every query against a real Prometheus.

What is emulated is Grafana's, for the Prometheus data source: `$name`, `${name}` and `[[name]]` are
variables; a variable of several values becomes the regex `(a|b)` of its regex-escaped values, one
value its escaped self; `$__rate_interval`, `$__interval` and `$__range` are durations; `$1`-style
names (label_replace's capture groups) are no variables. `label_values(SELECTOR, LABEL)` variables
ask Prometheus's label-values API, as Grafana's Prometheus data source does.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
# Grafana's import reads these to ask for data sources; they are not part of the dashboard model.
EXPORT_ENVELOPE = ("__inputs", "__elements", "__requires")

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*(\w+)\s*\)\s*$", re.DOTALL)
_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")
_SERVING_METRIC = re.compile(r"\bserving_\w+")


@dataclass(frozen=True)
class Query:
    """One target of one panel."""

    dashboard: str  # file name
    panel: str  # title
    ref: str  # refId
    expr: str
    instant: bool

    def __str__(self) -> str:
        return f"{self.dashboard}: {self.panel!r} {self.ref}"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included (rows themselves too)."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(path: Path) -> list[Query]:
    """Every Prometheus query of the dashboard's panels."""
    return [
        Query(
            path.name, panel["title"], target["refId"], target["expr"], target.get("instant", False)
        )
        for panel in panels(load(path))
        for target in panel.get("targets", [])
    ]


def query_variables(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's `query` variables, in their order (a later one may use an earlier one)."""
    return [v for v in dashboard["templating"]["list"] if v["type"] == "query"]


def label_values(query: str | Mapping[str, Any]) -> tuple[str, str]:
    """(selector, label) of a `label_values(selector, label)` variable query."""
    text = query if isinstance(query, str) else query["query"]
    match = _LABEL_VALUES.match(text)
    if match is None:
        raise ValueError(f"not a label_values(selector, label) query: {text!r}")
    return match.group(1).strip(), match.group(2)


def _escape(value: str) -> str:
    # Grafana's prometheusSpecialRegexEscape: the value goes into a regex inside a PromQL string.
    return _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def interpolate(
    text: str, values: Mapping[str, Sequence[str]], durations: Mapping[str, str]
) -> str:
    """`text` with its variables replaced as Grafana does; an unknown variable is a KeyError."""

    def replace(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group is not None)
        if name[0].isdigit():  # label_replace's "$1": no variable
            return match.group(0)
        if name in durations:
            return durations[name]
        if name not in values:
            raise KeyError(f"{name!r} is no variable of the dashboard (in {text!r})")
        chosen = [_escape(value) for value in values[name]]
        return chosen[0] if len(chosen) == 1 else "(" + "|".join(chosen) + ")"

    return _VARIABLE.sub(replace, text)


def undeclared(expr: str, families: set[str]) -> set[str]:
    """The serving_* series an expression reads that are of none of `families` (a histogram's
    `_bucket`, `_sum` and `_count` are of the histogram's family)."""
    return {
        name
        for name in _SERVING_METRIC.findall(expr)
        if name not in families and re.sub(r"_(bucket|sum|count)$", "", name) not in families
    }


# --- against a running Prometheus ---------------------------------------------------------------


def _get(prometheus: str, path: str, params: Mapping[str, Any]) -> Any:
    answer = httpx.get(f"{prometheus}{path}", params=params, timeout=10).json()
    if answer["status"] != "success":
        raise AssertionError(f"{path} {params}: {answer}")
    return answer["data"]


def resolve_variables(
    prometheus: str, dashboard: Mapping[str, Any], endpoint: str, window_s: float
) -> tuple[dict[str, list[str]], list[str]]:
    """Each query variable's values as Grafana would list them, `endpoint` picking `endpoint` and
    every other variable taking all it lists; and what is wrong (`endpoint` not listed, a variable
    listing nothing)."""
    values: dict[str, list[str]] = {}
    problems = []
    now = time.time()
    for variable in query_variables(dashboard):
        selector, label = label_values(variable["query"])
        listed = _get(
            prometheus,
            f"/api/v1/label/{label}/values",
            {"match[]": interpolate(selector, values, {}), "start": now - window_s, "end": now},
        )
        if variable["name"] == "endpoint":
            if endpoint not in listed:
                problems.append(f"$endpoint lists {listed}, not {endpoint}")
            values["endpoint"] = [endpoint]
        else:
            if not listed:
                problems.append(f"${variable['name']} lists nothing for endpoint {endpoint}")
            values[variable["name"]] = sorted(listed)
    return values, problems


def run(
    prometheus: str,
    query: Query,
    values: Mapping[str, Sequence[str]],
    scrape_s: float,
    window_s: float,
) -> list[dict[str, Any]]:
    """The query's series, run the way Grafana runs it: a range query over the last `window_s` with
    one point per scrape (an instant query at now for an instant target), `$__rate_interval` four
    scrapes (Grafana's least)."""
    durations = {
        "__rate_interval": f"{int(4 * scrape_s)}s",
        "__interval": f"{int(scrape_s)}s",
        "__range": f"{int(window_s)}s",
    }
    expr = interpolate(query.expr, values, durations)
    now = time.time()
    if query.instant:
        data = _get(prometheus, "/api/v1/query", {"query": expr, "time": now})
    else:
        data = _get(
            prometheus,
            "/api/v1/query_range",
            {"query": expr, "start": now - window_s, "end": now, "step": scrape_s},
        )
    return data["result"]


def scraped_metric_families(prometheus: str) -> set[str]:
    """Every metric family Prometheus has seen a `# TYPE` or `# HELP` line of, samples or not."""
    return set(_get(prometheus, "/api/v1/metadata", {}))
