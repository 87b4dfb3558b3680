"""deploy/grafana's dashboards are dashboards Grafana 10.4+ loads: checked against Grafana's own JSON
schemas, as no Grafana installs from the package registries this project uses (Grafana itself is
AGPL and ships in none of them).

The schemas are Grafana's, generated from the schemas Grafana exposes (tests/unit/data/grafana-schema,
vendored unchanged with its licence): the dashboard model, each panel type's options and field
config, and the Prometheus query. Where the generated schema is narrower than what Grafana itself
writes, the check widens it, each case in `WIDENED` with its reason; nothing else is loosened.
Whether each query returns data is tests/integration/test_metrics.py's check, against a real
Prometheus.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from suite import dashboards

SCHEMAS = Path(__file__).parent / "data" / "grafana-schema"
# panel type -> its schema file (a panel of another type needs its schema vendored first)
PANEL_SCHEMAS = {"timeseries": "timeseries", "table": "table", "stat": "stat"}

# (definition, property) -> (the schema Grafana's own dashboards meet, why)
WIDENED: dict[tuple[str, str], tuple[dict[str, Any], str]] = {
    ("Threshold", "value"): (
        {"type": ["number", "null"]},
        "the base step is -Infinity, which Grafana writes as null (the schema's own description "
        "says so: 'Nulls currently appear here when serializing -Infinity to JSON')",
    ),
    ("MatcherConfig", "options"): (
        {},
        "CUE's `_` (any value) generated as an object; Grafana's byName and byRegexp matchers take "
        "a string",
    ),
    ("DynamicConfigValue", "value"): (
        {},
        "CUE's `_` (any value) generated as an object; an override sets a unit (a string), "
        "decimals (a number), mappings (a list)",
    ),
}


def schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text())


def dashboard_schema() -> dict[str, Any]:
    widened = schema("dashboard")
    for (definition, prop), (replacement, _why) in WIDENED.items():
        properties = widened["definitions"][definition]["properties"]
        assert prop in properties, f"{definition}.{prop} left the schema: drop it from WIDENED"
        properties[prop] = {**replacement, "description": properties[prop].get("description", "")}
    return widened


def definition(name: str, of: dict[str, Any]) -> dict[str, Any]:
    """A validator schema for one definition of `of`."""
    return {**of, "$ref": f"#/definitions/{name}"}


def errors(instance: Any, against: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(against)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"
        for e in validator.iter_errors(instance)
    ]


def model(path: Path) -> dict[str, Any]:
    """The dashboard model: the file less its export envelope."""
    document = dashboards.load(path)
    return {k: v for k, v in document.items() if k not in dashboards.EXPORT_ENVELOPE}


IDS = [path.name for path in dashboards.DASHBOARDS]


def test_there_are_dashboards() -> None:
    assert dashboards.DASHBOARDS, "deploy/grafana has no *.json dashboard"


@pytest.mark.parametrize("path", dashboards.DASHBOARDS, ids=IDS)
def test_the_dashboard_meets_grafanas_dashboard_schema(path: Path) -> None:
    assert errors(model(path), dashboard_schema()) == []


@pytest.mark.parametrize("path", dashboards.DASHBOARDS, ids=IDS)
def test_each_panel_meets_its_panel_types_schema(path: Path) -> None:
    problems = []
    prometheus_query = schema("prometheus")
    for panel in dashboards.panels(model(path)):
        if panel["type"] == "row":
            continue
        where = f"{panel['title']!r}"
        if panel["type"] not in PANEL_SCHEMAS:
            problems.append(f"{where}: type {panel['type']} has no vendored schema")
            continue
        plugin = schema(PANEL_SCHEMAS[panel["type"]])
        problems += [
            f"{where} options {e}" for e in errors(panel["options"], definition("Options", plugin))
        ]
        custom = panel["fieldConfig"]["defaults"].get("custom")
        if custom is not None and "FieldConfig" in plugin["definitions"]:
            problems += [
                f"{where} custom {e}" for e in errors(custom, definition("FieldConfig", plugin))
            ]
        assert panel["targets"], f"{where} has no query"
        for target in panel["targets"]:
            problems += [f"{where} {target['refId']} {e}" for e in errors(target, prometheus_query)]
    assert problems == []


@pytest.mark.parametrize("path", dashboards.DASHBOARDS, ids=IDS)
def test_panels_have_unique_ids_and_do_not_overlap(path: Path) -> None:
    placed = list(dashboards.panels(model(path)))
    ids = [p["id"] for p in placed]
    assert len(ids) == len(set(ids)), sorted(ids)

    def cells(panel: dict[str, Any]) -> set[tuple[int, int]]:
        g = panel["gridPos"]
        return set(
            itertools.product(range(g["x"], g["x"] + g["w"]), range(g["y"], g["y"] + g["h"]))
        )

    for a, b in itertools.combinations(placed, 2):
        assert not cells(a) & cells(b), f"{a['title']!r} overlaps {b['title']!r}"


@pytest.mark.parametrize("path", dashboards.DASHBOARDS, ids=IDS)
def test_import_finds_every_data_source_and_panel_type_it_needs(path: Path) -> None:
    document = dashboards.load(path)
    inputs = {i["name"] for i in document["__inputs"] if i["type"] == "datasource"}
    required = {r["id"] for r in document["__requires"] if r["type"] == "panel"}
    for panel in dashboards.panels(document):
        if panel["type"] == "row":
            continue
        assert panel["type"] in required, f"{panel['title']!r}: {panel['type']} not in __requires"
        for source in [panel["datasource"], *(t["datasource"] for t in panel["targets"])]:
            assert source["type"] == "prometheus", panel["title"]
            assert source["uid"].removeprefix("${").removesuffix("}") in inputs, panel["title"]


@pytest.mark.parametrize("path", dashboards.DASHBOARDS, ids=IDS)
def test_every_variable_a_query_names_is_defined(path: Path) -> None:
    document = dashboards.load(path)
    defined = {v["name"]: ["x"] for v in document["templating"]["list"]}
    durations = {name: "1m" for name in ("__rate_interval", "__interval", "__range")}
    for variable in dashboards.query_variables(document):
        selector, _label = dashboards.label_values(variable["query"])
        dashboards.interpolate(selector, defined, durations)  # KeyError names an unknown one
    for query in dashboards.queries(path):
        interpolated = dashboards.interpolate(query.expr, defined, durations)
        # what is left is label_replace's "$1"
        assert not re.search(r"\$(?!\d)", interpolated), query


# --- the checks can fail ---------------------------------------------------------------------------


def test_a_panel_off_the_grid_or_a_misspelt_field_fails_the_schema() -> None:
    broken = model(dashboards.DASHBOARDS[0])
    broken = copy.deepcopy(broken)
    panel = next(p for p in broken["panels"] if p["type"] != "row")
    panel["gridPos"]["w"] = 30
    panel["fieldconfig"] = panel.pop("fieldConfig")
    found = errors(broken, dashboard_schema())
    assert found, "the schema accepted a 30-wide panel and a misspelt fieldConfig"


def test_interpolation_is_grafanas_and_refuses_unknown_variables() -> None:
    values = {"endpoint": ["it.metrics"], "container": ["a", "b"]}
    expr = 'x{endpoint=~"$endpoint", container=~"${container}"}[$__rate_interval] "$1"'
    assert (
        dashboards.interpolate(expr, values, {"__rate_interval": "12s"})
        == 'x{endpoint=~"it\\\\.metrics", container=~"(a|b)"}[12s] "$1"'
    )
    with pytest.raises(KeyError, match="variant"):
        dashboards.interpolate('x{variant=~"$variant"}', values, {})
    families = {"serving_a_seconds", "serving_b_count"}
    expr = "rate(serving_a_seconds_bucket[1m]) / serving_b_count + serving_c_total"
    assert dashboards.undeclared(expr, families) == {"serving_c_total"}
