"""`serving loadtest`: its command line; the load test itself is `serving.loadtest`."""

from __future__ import annotations

import argparse


def cmd_loadtest(args: argparse.Namespace) -> int:
    from serving import (
        loadtest,  # runs Locust in a child interpreter: its gevent patching must come first there
    )

    return loadtest.main(args)


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its "invalid int value" message
    return parse


def add_parser(commands) -> None:
    """`serving loadtest` and its options (docs/loadtest.md)."""
    loadtest = commands.add_parser(
        "loadtest",
        help="drive an endpoint with Locust and write a JSON + HTML report (needs the loadtest extra)",
        description="Load-test an endpoint (docs/loadtest.md). Scenarios: direct (containers by --weights), serial "
        "(no target), shift (--from A --to B over the run), step (--steps levels), zipf (MultiModel).",
    )
    loadtest.add_argument(
        "scenario",
        metavar="SCENARIO",
        choices=("direct", "serial", "shift", "step", "zipf"),
        help="direct | serial | shift | step | zipf",
    )
    loadtest.add_argument(
        "--endpoint", required=True, metavar="URL", help="http://HOST:PORT/endpoints/NAME"
    )
    load = loadtest.add_argument_group("load (closed loop by default: --users 10)")
    mode = load.add_mutually_exclusive_group()
    mode.add_argument(
        "--users",
        type=_positive(int),
        metavar="N",
        help="closed loop: N users, each sending as soon as answered",
    )
    mode.add_argument(
        "--rate",
        type=_positive(float),
        metavar="R",
        help="open loop: R requests/s on schedule, answered or not",
    )
    load.add_argument(
        "--duration",
        type=_positive(float),
        metavar="S",
        help="seconds of load (default 30; step: the steps' total)",
    )
    load.add_argument(
        "--max-requests", type=_positive(int), metavar="N", help="stop after sending N requests"
    )
    load.add_argument(
        "--max-in-flight",
        type=_positive(int),
        default=1000,
        metavar="N",
        help="open loop: requests in flight at most; one due beyond that is dropped (default 1000)",
    )
    load.add_argument(
        "--arrivals",
        choices=("constant", "poisson"),
        default="constant",
        help="open loop: evenly spaced (default) or Poisson arrivals",
    )
    load.add_argument(
        "--timeout",
        type=_positive(float),
        default=60.0,
        metavar="S",
        help="seconds per request (default 60)",
    )
    load.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of every random choice (default 0)"
    )
    shape = loadtest.add_argument_group("scenarios")
    shape.add_argument(
        "--weights", metavar="A=3,B=1", help="direct/step: traffic per container (default: equal)"
    )
    shape.add_argument(
        "--from", dest="shift_from", metavar="A", help="shift: the container traffic leaves"
    )
    shape.add_argument(
        "--to", dest="shift_to", metavar="B", help="shift: the container traffic moves to"
    )
    shape.add_argument("--steps", metavar="L1,L2,...", help="step: load levels, e.g. 10,50,10")
    shape.add_argument(
        "--step-seconds",
        type=_positive(float),
        default=60.0,
        metavar="S",
        help="step: seconds per level (default 60)",
    )
    shape.add_argument(
        "--step-unit",
        choices=("rate", "users"),
        default="rate",
        help="step: levels are requests/s (open loop, default) or users (closed loop)",
    )
    shape.add_argument(
        "--ramp", action="store_true", help="step: move linearly between levels instead of jumping"
    )
    shape.add_argument(
        "--models",
        type=_positive(int),
        default=10,
        metavar="N",
        help="zipf: number of models (default 10)",
    )
    shape.add_argument(
        "--zipf-s", type=float, default=1.1, metavar="S", help="zipf: exponent (default 1.1)"
    )
    shape.add_argument(
        "--model-pattern",
        default="customer-{i}.tar.gz",
        metavar="PATTERN",
        help="zipf: TargetModel names, {i} = index",
    )
    shape.add_argument(
        "--model-start", type=int, default=0, metavar="I", help="zipf: first index (default 0)"
    )
    shape.add_argument(
        "--container",
        metavar="NAME",
        help="zipf: the MultiModel container (default: the endpoint's only/MultiModel one)",
    )
    request = loadtest.add_argument_group("requests")
    request.add_argument(
        "--payload",
        action="append",
        metavar="[CONTAINER=]FILE",
        help="request body from FILE (repeat CONTAINER=FILE for per-container bodies)",
    )
    request.add_argument(
        "--payload-json",
        metavar="JSON",
        help="request body as JSON (default '[[5.1, 3.5, 1.4, 0.2]]')",
    )
    request.add_argument(
        "--content-type",
        metavar="TYPE",
        help="Content-Type (default: from the payload, as the SDK chooses)",
    )
    request.add_argument("--accept", metavar="TYPE", help="Accept (default */*)")
    request.add_argument(
        "--api-key",
        metavar="KEY",
        help="bearer API key (default: SERVING_API_KEY, else SigV4 from AWS credentials)",
    )
    request.add_argument(
        "--region", help="SigV4 signing region (default AWS_DEFAULT_REGION, else us-east-1)"
    )
    output = loadtest.add_argument_group("report")
    output.add_argument(
        "--out", metavar="DIR", help="report folder (default loadtest-results/SCENARIO-TIMESTAMP)"
    )
    output.add_argument(
        "--no-html", action="store_true", help="write report.json only (no matplotlib)"
    )
    output.add_argument(
        "--poll-interval",
        type=_positive(float),
        default=2.0,
        metavar="S",
        help="seconds between CurrentReplicas polls (default 2)",
    )
    output.add_argument(
        "--baseline",
        metavar="URL",
        help="then run the same load against URL (e.g. a floor server's /invocations) and report ours/baseline ratios",
    )
    output.add_argument(
        "--metrics-check",
        action="store_true",
        help="compare the server's serving_invocations_total before/after with the requests sent",
    )
    output.add_argument(
        "--web", action="store_true", help="serve Locust's web UI while running (watch only)"
    )
    output.add_argument(
        "--web-port",
        type=_positive(int),
        default=8089,
        metavar="PORT",
        help="web UI port (default 8089)",
    )
    loadtest.set_defaults(func=cmd_loadtest, _parser=loadtest)
