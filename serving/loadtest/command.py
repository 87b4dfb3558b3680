"""`serving loadtest`, start to finish: check the arguments and the endpoint, run the load (and the
baseline), read the server's counters, write the report and print its summary.

Exit codes: 0 when the run completed with at least one successful request, 1 when the endpoint
could not be reached (or nothing succeeded), 2 for bad arguments (argparse's own error format).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from serving.client.credentials import Anonymous, resolve
from serving.loadtest import probe, report
from serving.loadtest.options import (
    OptionError,
    Plan,
    Prepared,
    build_plan,
    parse_baseline_url,
    parse_endpoint_url,
)
from serving.loadtest.report_types import MetricsCheck


def run(args: argparse.Namespace) -> int:
    """Run `serving loadtest` with parsed arguments; returns the exit code."""
    try:
        base_url, endpoint = parse_endpoint_url(args.endpoint)
        baseline = parse_baseline_url(args.baseline) if args.baseline else None
        try:
            auth = resolve(api_key=args.api_key, region_name=args.region)
        except ValueError as error:
            raise OptionError("--api-key", str(error)) from None
    except OptionError as error:
        return _usage_error(args, error)
    try:
        description = probe.describe(base_url, endpoint, auth, timeout=min(10.0, args.timeout))
    except probe.ProbeError as error:
        print(f"serving loadtest: the endpoint is not reachable: {error}", file=sys.stderr)
        return 1
    try:
        plan = build_plan(args, base_url, endpoint, description, auth)
    except OptionError as error:
        return _usage_error(args, error)
    out_dir = Path(args.out or f"loadtest-results/{args.scenario}-{time.strftime('%Y%m%d-%H%M%S')}")

    before = _read_invocations(plan) if args.metrics_check else None
    from serving.loadtest import (
        locust_driver,  # Locust, and gevent's monkey-patching, from here on
    )

    print(
        f"serving loadtest {args.scenario}: {plan.base_url}/endpoints/{endpoint} for {plan.duration:g} s, "
        f"{_load_words(plan)}; targets: {', '.join(sorted({t.label for t in plan.requests}))}",
        flush=True,
    )
    if args.web:
        print(
            f"Locust web UI: http://127.0.0.1:{args.web_port} (watch only: the harness drives the load)",
            flush=True,
        )
    result = locust_driver.run_load(
        plan,
        "main",
        plan.base_url,
        plan.requests,
        plan.base_url,
        web_port=args.web_port if args.web else None,
        on_progress=_progress,
    )
    check = _metrics_check(plan, before, result.answered) if before is not None else None

    baseline_result = None
    if baseline is not None:
        origin, path = baseline
        print(f"baseline: the same load against {origin}{path}", flush=True)
        # never send credentials to another server
        baseline_plan = dataclasses.replace(plan, auth=Anonymous())
        requests = {t: Prepared(path, p.headers, p.body) for t, p in plan.requests.items()}
        baseline_result = locust_driver.run_load(
            baseline_plan, "baseline", origin, requests, origin, poll=False, on_progress=_progress
        )

    document = report.build_report(
        args.scenario,
        plan.parameters(),
        result,
        plan.duration,
        baseline=baseline_result,
        baseline_url=args.baseline,
        metrics_check=check,
    )
    paths = report.write_report(document, out_dir, html=not args.no_html)
    print()
    print(report.summary_table(document))
    print("report: " + ", ".join(str(p) for p in paths), flush=True)
    if args.web:
        print("Ctrl-C to close the web UI.", flush=True)
        locust_driver.serve_web_ui_until_interrupted()
    if document["totals"]["ok"] == 0:
        print("serving loadtest: no request succeeded", file=sys.stderr)
        return 1
    return 0


def _usage_error(args: argparse.Namespace, error: OptionError) -> int:
    """Report a bad argument as argparse does (usage line, then `PROG: error: argument FLAG: ...`),
    exit 2."""
    usage = getattr(args, "_usage", "")
    if usage:
        print(usage.rstrip(), file=sys.stderr)
    print(
        f"{getattr(args, '_prog', 'serving loadtest')}: error: argument {error.flag}: {error}",
        file=sys.stderr,
    )
    return 2


def _load_words(plan: Plan) -> str:
    unit = "requests/s (open loop)" if plan.open_loop else "users (closed loop)"
    levels = getattr(plan.scenario, "levels", None)
    if levels:
        return f"steps {','.join(f'{v:g}' for v in levels)} {unit}, {getattr(plan.scenario, 'step_seconds', 0):g} s each"
    return f"{plan.level:g} {unit}"


def _progress(load: Any) -> None:
    samples = load.result.samples
    errors = sum(1 for s in samples if s.error is not None)
    print(
        f"  {load.elapsed():6.1f} s  {len(samples)} done ({errors} failed), {len(load.result.dropped)} dropped, "
        f"{load.in_flight} in flight",
        flush=True,
    )


def _read_invocations(plan: Plan) -> tuple[float | None, str | None]:
    try:
        # A Serial request counts once per container of the chain: compare with the first one's
        # count.
        first = plan.containers[0] if plan.scenario.name == "serial" and plan.containers else None
        return probe.read_invocations(
            plan.base_url, plan.endpoint, plan.auth, container=first
        ), None
    except probe.ProbeError as error:
        return None, str(error)


def _metrics_check(
    plan: Plan, before: tuple[float | None, str | None], answered: int
) -> MetricsCheck:
    """Read the counter after the run, a few times if it lags (metrics can be exported
    asynchronously)."""
    after: tuple[float | None, str | None] = (None, None)
    for attempt in range(4):
        after = _read_invocations(plan)
        if before[0] is None or after[0] is None or after[0] - before[0] >= answered:
            break
        time.sleep(1.0)
    error = before[1] or after[1]
    if error is None and (before[0] is None or after[0] is None):
        error = "GET /metrics does not expose serving_invocations_total"
    return report.metrics_check(before[0], after[0], answered, error)


__all__ = ["run"]
