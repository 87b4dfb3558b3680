"""From `serving loadtest` arguments and the endpoint's description to a `Plan`: what to send, how
much, how long.

Every mistake is an `OptionError` naming the flag at fault, which the CLI turns into an argparse
error (exit 2). Requests are built with the SDK's own helpers (`encode_payload`, `invocation_path`,
`invocation_headers`), so the harness sends what `serving.client` sends; only the signature is added
per request, as the SDK does per attempt.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from serving.client import _core
from serving.client.credentials import Authenticator
from serving.loadtest import scenarios
from serving.loadtest.arguments import (
    OptionError,
    parse_baseline_url,
    parse_endpoint_url,
    parse_levels,
    parse_payloads,
    parse_weights,
)
from serving.loadtest.report_types import Parameters
from serving.loadtest.scenarios import Scenario, Target


@dataclass(frozen=True)
class Prepared:
    """One target's request, encoded once: path, the SDK's headers (unsigned) and body."""

    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Plan:
    """Everything a run needs, resolved and checked before any load is sent."""

    base_url: str
    endpoint: str
    scenario: Scenario
    open_loop: bool
    level: float  # requests/s (open loop) or users (closed loop), unless the scenario shapes it
    duration: float
    requests: dict[Target, Prepared]
    auth: Authenticator
    containers: list[str] = field(default_factory=list)
    max_requests: int | None = None
    max_in_flight: int = 1000
    poisson: bool = False
    seed: int = 0
    timeout: float = 60.0
    poll_interval: float = 2.0

    def level_at(self, elapsed: float) -> float:
        """The load level (requests/s or users) at `elapsed` seconds into the run."""
        shaped = self.scenario.level(elapsed)
        return self.level if shaped is None else shaped

    @property
    def peak_level(self) -> float:
        levels = getattr(self.scenario, "levels", None)
        return float(max(levels)) if levels else self.level

    def parameters(self) -> Parameters:
        """The plan as the report records it."""
        scenario = {
            k: v
            for k, v in vars(self.scenario).items()
            if not k.startswith("_") and k not in ("inner", "probabilities")
        }
        if isinstance(scenario.get("models"), list) and len(scenario["models"]) > 20:
            scenario["models"] = scenario["models"][:20] + [
                f"... ({len(scenario['models'])} in all)"
            ]
        return {
            "endpoint_url": f"{self.base_url}/endpoints/{self.endpoint}",
            "endpoint": self.endpoint,
            # fixed arrival rate, or fixed concurrency
            "load_mode": "open" if self.open_loop else "closed",
            "rate" if self.open_loop else "users": None
            if self.scenario.level(0.0) is not None
            else self.level,
            "duration_s": self.duration,
            "max_requests": self.max_requests,
            "max_in_flight": self.max_in_flight if self.open_loop else None,
            "arrivals": ("poisson" if self.poisson else "constant") if self.open_loop else None,
            "seed": self.seed,
            "timeout_s": self.timeout,
            "containers": self.containers,
            "targets": sorted({t.label for t in self.requests}),
            "scenario": scenario,
            "auth": type(self.auth).__name__,
        }


# --- the plan ------------------------------------------------------------------------------


def containers_of(description: Mapping[str, Any]) -> list[str]:
    return [
        c.get("ContainerHostname")
        for c in description.get("Containers") or []
        if c.get("ContainerHostname")
    ]


def execution_mode(description: Mapping[str, Any]) -> str:
    return (description.get("InferenceExecutionConfig") or {}).get("Mode") or "Direct"


def build_scenario(
    args: argparse.Namespace, description: Mapping[str, Any], duration: float
) -> Scenario:
    """The scenario `args.scenario` names, checked against the endpoint's containers."""
    containers, mode = containers_of(description), execution_mode(description)

    def known(flag: str, name: str) -> str:
        if containers and name not in containers:
            raise OptionError(
                flag,
                f"no container {name!r} in this endpoint (containers: {', '.join(containers)})",
            )
        return name

    def mix() -> Scenario:
        if args.weights:
            return scenarios.Direct(
                {known("--weights", n): w for n, w in parse_weights(args.weights).items()}
            )
        if mode == "Serial" or not containers:
            return scenarios.Serial()
        return scenarios.Direct({c: 1.0 for c in containers})

    name = args.scenario
    if name == "direct":
        if mode == "Serial":
            raise OptionError(
                "scenario", "this endpoint is Serial (a pipeline): use the serial scenario"
            )
        if not containers and not args.weights:
            raise OptionError(
                "--weights", "the endpoint lists no containers: name them with --weights a=1,b=1"
            )
        return mix()
    if name == "serial":
        if mode != "Serial" and len(containers) > 1:
            raise OptionError(
                "scenario",
                f"this endpoint is {mode} with {len(containers)} containers: "
                "each invocation needs a target (use the direct scenario)",
            )
        return scenarios.Serial()
    if name == "shift":
        if not args.shift_from or not args.shift_to:
            raise OptionError(
                "--from" if not args.shift_from else "--to",
                "the shift scenario needs --from A --to B",
            )
        if args.shift_from == args.shift_to:
            raise OptionError("--to", "--from and --to must name different containers")
        return scenarios.Shift(
            known("--from", args.shift_from), known("--to", args.shift_to), duration
        )
    if name == "step":
        if not args.steps:
            raise OptionError("--steps", "the step scenario needs --steps, e.g. --steps 10,50,10")
        return scenarios.Step(parse_levels(args.steps), args.step_seconds, mix(), ramp=args.ramp)
    if name == "zipf":
        container = _multimodel_container(args, description, known)
        try:
            models = scenarios.model_names(args.models, args.model_pattern, args.model_start)
        except ValueError as error:
            raise OptionError("--model-pattern", str(error)) from None
        try:
            return scenarios.Zipf(models, args.zipf_s, container)
        except ValueError as error:
            raise OptionError("--zipf-s", str(error)) from None
    # argparse's choices catch this first
    raise OptionError("scenario", f"unknown scenario {name!r}")


def _multimodel_container(
    args: argparse.Namespace, description: Mapping[str, Any], known
) -> str | None:
    if args.container:
        return known("--container", args.container)
    entries = description.get("Containers") or []
    if len(entries) <= 1:
        return None  # the only container: no target needed
    multi = [c["ContainerHostname"] for c in entries if c.get("Mode") == "MultiModel"]
    if len(multi) != 1:
        raise OptionError(
            "--container", "name the MultiModel container to send to with --container"
        )
    return multi[0]


def prepare_requests(
    endpoint: str,
    scenario: Scenario,
    payloads: tuple[tuple[bytes, str], dict[str, tuple[bytes, str]]],
    accept: str | None,
) -> dict[Target, Prepared]:
    """Each target's request, built as the SDK builds it (path, headers, encoded body)."""
    default, per_container = payloads
    path = _core.invocation_path(endpoint)
    prepared = {}
    for target in scenario.targets():
        body, content_type = per_container.get(target.container or "", default)
        headers = _core.invocation_headers(
            content_type, accept, target.container, target.model, None, None, None
        )
        prepared[target] = Prepared(path, headers, body)
    return prepared


def build_plan(
    args: argparse.Namespace,
    base_url: str,
    endpoint: str,
    description: Mapping[str, Any],
    auth: Authenticator,
) -> Plan:
    """Resolve the load mode and the scenario for this endpoint; every error names its flag."""
    if args.scenario == "step":
        for flag, value in (("--users", args.users), ("--rate", args.rate)):
            if value is not None:
                raise OptionError(
                    flag, "with the step scenario, --steps sets the load (see --step-unit)"
                )
        open_loop = args.step_unit == "rate"
        level = 0.0
    else:
        open_loop = args.rate is not None
        level = args.rate if open_loop else (args.users if args.users is not None else 10)
    duration = args.duration
    if duration is None:
        duration = (
            len(parse_levels(args.steps)) * args.step_seconds
            if args.scenario == "step" and args.steps
            else 30.0
        )
    scenario = build_scenario(args, description, duration)
    payloads = parse_payloads(args.payload, args.payload_json, args.content_type)
    unknown = sorted(set(payloads[1]) - set(containers_of(description)))
    if unknown and containers_of(description):
        raise OptionError("--payload", f"no container {unknown[0]!r} in this endpoint")
    return Plan(
        base_url=base_url,
        endpoint=endpoint,
        scenario=scenario,
        open_loop=open_loop,
        level=float(level),
        duration=float(duration),
        requests=prepare_requests(endpoint, scenario, payloads, args.accept),
        auth=auth,
        containers=containers_of(description),
        max_requests=args.max_requests,
        max_in_flight=args.max_in_flight,
        poisson=args.arrivals == "poisson",
        seed=args.seed,
        timeout=args.timeout,
        poll_interval=args.poll_interval,
    )


# the parsers are also importable from here, where they were first
__all__ = [
    "OptionError",
    "Plan",
    "Prepared",
    "build_plan",
    "build_scenario",
    "parse_baseline_url",
    "parse_endpoint_url",
    "parse_levels",
    "parse_payloads",
    "parse_weights",
    "prepare_requests",
]
