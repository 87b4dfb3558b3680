"""The `serving` command: validate specs, bring endpoints up on an embedded or existing Ray, and load-test them."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from serving.config.spec import EndpointSpec, SpecError, load_spec
from serving.settings import ServerSettings, is_loopback


def _load_all(paths: list[str], identities: str | None = None) -> list[EndpointSpec]:
    specs, failed = [], False
    for path in paths:
        try:
            specs.append(load_spec(path, identities_file=identities))
        except SpecError as error:
            failed = True
            print(f"{path}: INVALID", file=sys.stderr)
            for line in str(error).splitlines():
                print(f"  {line}", file=sys.stderr)
    names = [spec.EndpointName for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        failed = True
        print(f"EndpointName used by more than one spec: {', '.join(duplicates)}", file=sys.stderr)
    if failed:
        raise SystemExit(2)
    return specs


def _access_summary(spec: EndpointSpec) -> str:
    if spec.AccessControl is None:
        return ""
    identities = spec.AccessControl.identities.identities
    return f"; AccessControl: {len(identities)} identities ({', '.join(i.principal for i in identities)})"


def cmd_validate(args: argparse.Namespace) -> int:
    for path, spec in zip(args.specs, _load_all(args.specs, args.identities)):
        hostnames = ", ".join(c.ContainerHostname for c in spec.Containers)
        print(f"{path}: OK  endpoint {spec.EndpointName} ({spec.mode.value}, {len(spec.Containers)} containers: {hostnames}"
              f"{_access_summary(spec)})")
    return 0


def check_anonymous(specs: list[EndpointSpec], host: str, allow_anonymous: bool) -> str | None:
    """The warning to print about endpoints without AccessControl; raises SystemExit(2) if they may not be served."""
    anonymous = [spec.EndpointName for spec in specs if spec.AccessControl is None]
    if not anonymous:
        return None
    names = ", ".join(anonymous)
    if not is_loopback(host) and not allow_anonymous:
        print(
            f"refusing to serve {names} without authentication on {host}, which is not a loopback address: "
            "add AccessControl to the spec (or --identities FILE; see docs/security.md), "
            "or pass --allow-anonymous to serve it to anyone who can reach the port",
            file=sys.stderr,
        )
        raise SystemExit(2)
    who = "anyone who can reach this machine" if is_loopback(host) else f"ANYONE who can reach {host}"
    bar = "!" * 78
    return (f"{bar}\n!! WARNING: no authentication for {names}: {who} can invoke every container.\n"
            f"!! Add AccessControl (docs/security.md) before exposing the server.\n{bar}")


def wait_for_endpoints(describe, names: list[str], timeout: float) -> dict[str, dict]:
    """Poll descriptions until each endpoint is InService or Failed (or the timeout passes)."""
    deadline = time.monotonic() + timeout
    latest: dict[str, dict] = {}
    while True:
        latest = {name: d for name, d in describe().items() if name in names}
        settled = len(latest) == len(names) and all(d["EndpointStatus"] in ("InService", "Failed") for d in latest.values())
        if settled or time.monotonic() >= deadline:
            return latest
        time.sleep(0.5)


def example_calls(base_url: str, spec: EndpointSpec, region: str = "us-east-1") -> list[str]:
    """Copy-pasteable calls for an endpoint, shown at start-up (with placeholders, never secrets)."""
    url = f"{base_url}/endpoints/{spec.EndpointName}/invocations"
    lines = []
    secured = spec.AccessControl is not None
    bearer = " -H 'Authorization: Bearer <ApiKey>'" if secured else ""
    targets = [None] if spec.mode.value == "Serial" or len(spec.Containers) == 1 else [c.ContainerHostname for c in spec.Containers]
    for target in targets[:3]:
        header = f" -H 'X-Amzn-SageMaker-Target-Container-Hostname: {target}'" if target else ""
        lines.append(f"curl -s {url} -H 'Content-Type: application/json'{header}{bearer} -d '[[5.1, 3.5, 1.4, 0.2]]'")
    target_arg = f", TargetContainerHostname='{targets[0]}'" if targets[0] else ""
    key, secret = ("<AccessKeyId>", "<SecretAccessKey>") if secured else ("x", "x")
    if secured:
        lines.append(f"(<ApiKey>, <AccessKeyId>, <SecretAccessKey>: a caller's credentials from {spec.AccessControl.IdentitiesFile})")
    lines.append(
        "python -c \"import boto3; rt = boto3.client('sagemaker-runtime', endpoint_url='" + base_url + "', "
        f"region_name='{region}', aws_access_key_id='{key}', aws_secret_access_key='{secret}'); "
        f"print(rt.invoke_endpoint(EndpointName='{spec.EndpointName}', ContentType='application/json', "
        f"Body='[[5.1, 3.5, 1.4, 0.2]]'{target_arg})['Body'].read())\""
    )
    return lines


def cmd_up(args: argparse.Namespace) -> int:
    specs = _load_all(args.specs, args.identities)
    address = args.address or os.environ.get("RAY_ADDRESS")
    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    if args.allow_anonymous:
        overrides["allow_anonymous"] = True
    if address and "SERVING_CONTAINER_HOST" not in os.environ:
        overrides["container_host"] = "node"  # replicas on other nodes must be reachable
    elif not address:
        if os.environ.get("SERVING_CONTAINER_HOST", "127.0.0.1") != "127.0.0.1":
            print("note: SERVING_CONTAINER_HOST is ignored by the embedded server: data ports bind 127.0.0.1",
                  file=sys.stderr)
        overrides["container_host"] = "127.0.0.1"  # one machine: nothing else needs to reach a data port
    settings = ServerSettings(**overrides)
    warning = check_anonymous(specs, settings.host, settings.allow_anonymous)
    from serving import (
        ray_wing,  # imports Ray: only once the specs and settings are known to be good
    )

    print(f"Starting {'on the Ray cluster at ' + address if address else 'an embedded local Ray'} ...", flush=True)
    if address:
        try:
            ray_wing.connect_cluster(address, allow_unauthenticated=args.allow_unauthenticated_ray)
        except ray_wing.UnauthenticatedClusterError as error:
            print(f"refusing to deploy: {error}", file=sys.stderr)
            return 2
    else:
        ray_wing.start_local_ray(num_cpus=args.num_cpus)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own
        signal.signal(signum, lambda *_: stop.set())
    token_file = None
    try:
        base_url = ray_wing.start_gateway(settings)
        token_file = _write_control_token(ray_wing.http_control_token(), base_url)
        for spec in specs:
            ray_wing.deploy_endpoint(spec, settings)
        print(f"\nEndpoint server: {base_url}", flush=True)
        for spec in specs:
            print(f"\n{spec.EndpointName} ({spec.mode.value}) - example calls (use your model's input):")
            for line in example_calls(base_url, spec, settings.region):
                print(f"  {line}")
        if warning:
            print(f"\n{warning}", file=sys.stderr, flush=True)
        print("\nWaiting for containers to load ...", flush=True)
        states = wait_for_endpoints(ray_wing.describe_endpoints, [s.EndpointName for s in specs], args.wait_timeout)
        failed = False
        for spec in specs:
            description = states.get(spec.EndpointName, {"EndpointStatus": "Creating"})
            status = description["EndpointStatus"]
            reason = f": {description['FailureReason']}" if description.get("FailureReason") else ""
            print(f"  {spec.EndpointName}: {status}{reason}", flush=True)
            failed |= status != "InService"
        if args.exit_after_ready or (address and args.detach):
            return 1 if failed else 0
        print("\nServing. Press Ctrl-C to stop. Change endpoints live with `serving apply SPEC` / "
              "`serving delete NAME`.", flush=True)
        stop.wait()
        print("Shutting down ...", flush=True)
        return 0
    finally:
        if token_file is not None and not (address and args.detach):
            token_file.unlink(missing_ok=True)
        if not address:
            ray_wing.shutdown()
        elif not args.detach:
            for spec in specs:  # leave the rest of the cluster's Serve applications alone
                ray_wing.delete_endpoint(spec.EndpointName)
            ray_wing.disconnect()
        else:
            ray_wing.disconnect()


def _write_control_token(token: str, base_url: str) -> Path:
    """Leave the control token where `serving apply` finds it: readable by this user only."""
    from serving.gateway.control_routes import control_token_file

    path = control_token_file(int(base_url.rsplit(":", 1)[1]))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(token)
    os.chmod(path, 0o600)  # also when the file was there before
    return path


def _control_client(args: argparse.Namespace):
    """An HTTP client for the control routes of the server at --url, with its control token."""
    import httpx

    from serving.gateway.control_routes import control_token_file

    url = (args.url or f"http://127.0.0.1:{os.environ.get('SERVING_PORT', '8080')}").rstrip("/")
    token = os.environ.get("SERVING_CONTROL_TOKEN")
    if not token:
        path = control_token_file(int(url.rsplit(":", 1)[1].split("/")[0]))
        try:
            token = path.read_text().strip()
        except OSError:
            print(f"no control token: {path} is missing (is `serving up` running on {url}?); or set "
                  "SERVING_CONTROL_TOKEN", file=sys.stderr)
            raise SystemExit(2) from None
    return httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {token}"})


def _wait_for_updates(describe, generations: dict[str, int], timeout: float) -> dict[str, dict]:
    """Poll descriptions until each endpoint's update of at least `generations[name]` has finished (or the
    timeout passes): the gateway may still show the previous update for a moment."""
    deadline = time.monotonic() + timeout

    def done(description: dict | None, generation: int) -> bool:
        update = (description or {}).get("LastUpdate") or {}
        return (update.get("Generation") or 0) >= generation and update.get("Status") not in (None, "InProgress")

    while True:
        latest = {name: d for name, d in describe().items() if name in generations}
        settled = all(done(latest.get(name), generation) for name, generation in generations.items())
        if settled or time.monotonic() >= deadline:
            return latest
        time.sleep(0.5)


def _report(names: list[str], states: dict[str, dict]) -> int:
    failed = False
    for name in names:
        description = states.get(name, {"EndpointStatus": "unknown", "LastUpdate": {}})
        update = description.get("LastUpdate") or {}
        outcome = {"Succeeded": "updated", "Failed": "update FAILED and was rolled back" if
                   description["EndpointStatus"] != "Failed" else "FAILED", "InProgress": "still updating"}
        text = outcome.get(update.get("Status"), "unknown")
        reason = f": {update['FailureReason']}" if update.get("FailureReason") else ""
        print(f"  {name}: {description['EndpointStatus']} ({text}{reason})", flush=True)
        failed |= update.get("Status") != "Succeeded"
    return 1 if failed else 0


def cmd_apply(args: argparse.Namespace) -> int:
    specs = _load_all(args.specs, args.identities)
    names = [spec.EndpointName for spec in specs]
    address = args.address or os.environ.get("RAY_ADDRESS")
    if address:  # straight to the cluster's control plane (this process holds the cluster's token)
        from serving import ray_wing

        overrides = {} if "SERVING_CONTAINER_HOST" in os.environ else {"container_host": "node"}
        settings = ServerSettings(**overrides)
        ray_wing.connect_cluster(address, allow_unauthenticated=args.allow_unauthenticated_ray)
        try:
            generations = {spec.EndpointName: ray_wing.deploy_endpoint(spec, settings) for spec in specs}
            print(f"Applied {', '.join(names)}; waiting for the new versions ...", flush=True)
            return _report(names, _wait_for_updates(ray_wing.describe_endpoints, generations, args.wait_timeout))
        finally:
            ray_wing.disconnect()
    with _control_client(args) as client:
        generations = {}
        for spec in specs:
            response = client.put(f"/endpoints/{spec.EndpointName}", json=spec.model_dump(mode="json", exclude_none=True))
            if response.status_code != 200:
                print(f"{spec.EndpointName}: {response.status_code} {response.text}", file=sys.stderr)
                return 2 if response.status_code < 500 else 1
            generations[spec.EndpointName] = response.json()["Generation"]
        print(f"Applied {', '.join(names)}; waiting for the new versions ...", flush=True)

        def describe() -> dict[str, dict]:
            found = {}
            for name in names:
                response = client.get(f"/endpoints/{name}")
                if response.status_code == 200:
                    found[name] = response.json()
            return found

        return _report(names, _wait_for_updates(describe, generations, args.wait_timeout))


def cmd_delete(args: argparse.Namespace) -> int:
    address = args.address or os.environ.get("RAY_ADDRESS")
    missing = []
    if address:
        from serving import ray_wing

        ray_wing.connect_cluster(address, allow_unauthenticated=args.allow_unauthenticated_ray)
        try:
            missing = [name for name in args.names if not ray_wing.delete_endpoint(name)]
        finally:
            ray_wing.disconnect()
    else:
        with _control_client(args) as client:
            for name in args.names:
                response = client.delete(f"/endpoints/{name}")
                if response.status_code == 400:
                    missing.append(name)
                elif response.status_code != 200:
                    print(f"{name}: {response.status_code} {response.text}", file=sys.stderr)
                    return 1
    for name in args.names:
        print(f"  {name}: {'not found' if name in missing else 'deleted'}")
    return 1 if missing else 0


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


def _add_loadtest(commands) -> None:
    loadtest = commands.add_parser(
        "loadtest", help="drive an endpoint with Locust and write a JSON + HTML report (needs the loadtest extra)",
        description="Load-test an endpoint (docs/loadtest.md). Scenarios: direct (containers by --weights), serial "
                    "(no target), shift (--from A --to B over the run), step (--steps levels), zipf (MultiModel).")
    loadtest.add_argument("scenario", metavar="SCENARIO", choices=("direct", "serial", "shift", "step", "zipf"),
                          help="direct | serial | shift | step | zipf")
    loadtest.add_argument("--endpoint", required=True, metavar="URL", help="http://HOST:PORT/endpoints/NAME")
    load = loadtest.add_argument_group("load (closed loop by default: --users 10)")
    mode = load.add_mutually_exclusive_group()
    mode.add_argument("--users", type=_positive(int), metavar="N", help="closed loop: N users, each sending as soon as answered")
    mode.add_argument("--rate", type=_positive(float), metavar="R", help="open loop: R requests/s on schedule, answered or not")
    load.add_argument("--duration", type=_positive(float), metavar="S",
                      help="seconds of load (default 30; step: the steps' total)")
    load.add_argument("--max-requests", type=_positive(int), metavar="N", help="stop after sending N requests")
    load.add_argument("--max-in-flight", type=_positive(int), default=1000, metavar="N",
                      help="open loop: requests in flight at most; one due beyond that is dropped (default 1000)")
    load.add_argument("--arrivals", choices=("constant", "poisson"), default="constant",
                      help="open loop: evenly spaced (default) or Poisson arrivals")
    load.add_argument("--timeout", type=_positive(float), default=60.0, metavar="S", help="seconds per request (default 60)")
    load.add_argument("--seed", type=int, default=0, metavar="N", help="seed of every random choice (default 0)")
    shape = loadtest.add_argument_group("scenarios")
    shape.add_argument("--weights", metavar="A=3,B=1", help="direct/step: traffic per container (default: equal)")
    shape.add_argument("--from", dest="shift_from", metavar="A", help="shift: the container traffic leaves")
    shape.add_argument("--to", dest="shift_to", metavar="B", help="shift: the container traffic moves to")
    shape.add_argument("--steps", metavar="L1,L2,...", help="step: load levels, e.g. 10,50,10")
    shape.add_argument("--step-seconds", type=_positive(float), default=60.0, metavar="S", help="step: seconds per level (default 60)")
    shape.add_argument("--step-unit", choices=("rate", "users"), default="rate",
                       help="step: levels are requests/s (open loop, default) or users (closed loop)")
    shape.add_argument("--ramp", action="store_true", help="step: move linearly between levels instead of jumping")
    shape.add_argument("--models", type=_positive(int), default=10, metavar="N", help="zipf: number of models (default 10)")
    shape.add_argument("--zipf-s", type=float, default=1.1, metavar="S", help="zipf: exponent (default 1.1)")
    shape.add_argument("--model-pattern", default="customer-{i}.tar.gz", metavar="PATTERN", help="zipf: TargetModel names, {i} = index")
    shape.add_argument("--model-start", type=int, default=0, metavar="I", help="zipf: first index (default 0)")
    shape.add_argument("--container", metavar="NAME", help="zipf: the MultiModel container (default: the endpoint's only/MultiModel one)")
    request = loadtest.add_argument_group("requests")
    request.add_argument("--payload", action="append", metavar="[CONTAINER=]FILE",
                         help="request body from FILE (repeat CONTAINER=FILE for per-container bodies)")
    request.add_argument("--payload-json", metavar="JSON", help="request body as JSON (default '[[5.1, 3.5, 1.4, 0.2]]')")
    request.add_argument("--content-type", metavar="TYPE", help="Content-Type (default: from the payload, as the SDK chooses)")
    request.add_argument("--accept", metavar="TYPE", help="Accept (default */*)")
    request.add_argument("--api-key", metavar="KEY", help="bearer API key (default: SERVING_API_KEY, else SigV4 from AWS credentials)")
    request.add_argument("--region", help="SigV4 signing region (default AWS_DEFAULT_REGION, else us-east-1)")
    output = loadtest.add_argument_group("report")
    output.add_argument("--out", metavar="DIR", help="report folder (default loadtest-results/SCENARIO-TIMESTAMP)")
    output.add_argument("--no-html", action="store_true", help="write report.json only (no matplotlib)")
    output.add_argument("--poll-interval", type=_positive(float), default=2.0, metavar="S",
                        help="seconds between CurrentReplicas polls (default 2)")
    output.add_argument("--baseline", metavar="URL", help="then run the same load against URL (e.g. a floor server's "
                                                          "/invocations) and report ours/baseline ratios")
    output.add_argument("--metrics-check", action="store_true",
                        help="compare the server's serving_invocations_total before/after with the requests sent")
    output.add_argument("--web", action="store_true", help="serve Locust's web UI while running (watch only)")
    output.add_argument("--web-port", type=_positive(int), default=8089, metavar="PORT", help="web UI port (default 8089)")
    loadtest.set_defaults(func=cmd_loadtest, _parser=loadtest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="serving", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    validate = commands.add_parser("validate", help="check endpoint specs and print the verdict")
    validate.add_argument("specs", nargs="+", metavar="SPEC")
    validate.add_argument("--identities", metavar="FILE", help="identities file to use instead of each spec's AccessControl")
    validate.set_defaults(func=cmd_validate)

    up = commands.add_parser("up", help="serve endpoints until interrupted")
    up.add_argument("specs", nargs="+", metavar="SPEC")
    up.add_argument("--host", help="address to bind (default 127.0.0.1, or SERVING_HOST)")
    up.add_argument("--port", type=int, help="port to bind (default 8080, or SERVING_PORT)")
    up.add_argument("--address", help="deploy onto this existing Ray cluster (default: RAY_ADDRESS, else embedded)")
    up.add_argument("--identities", metavar="FILE",
                    help="identities file (callers, keys, policies) for every endpoint, replacing the specs' AccessControl")
    up.add_argument("--allow-anonymous", action="store_true",
                    help="serve endpoints without AccessControl to anyone even on a non-loopback --host")
    up.add_argument("--allow-unauthenticated-ray", action="store_true",
                    help="with --address: deploy even onto a Ray cluster that accepts connections without a token "
                         "(anyone who reaches it can run code there)")
    up.add_argument("--num-cpus", type=int, help="CPUs the embedded Ray may use (default: all)")
    up.add_argument("--wait-timeout", type=float, default=180.0, help="seconds to wait for containers to load")
    up.add_argument("--exit-after-ready", action="store_true", help="stop once every endpoint is InService or Failed")
    up.add_argument("--detach", action="store_true",
                    help="with --address: deploy, wait for readiness and return, leaving the endpoints running")
    up.set_defaults(func=cmd_up)

    apply = commands.add_parser(
        "apply", help="create or update endpoints of a running server, blue/green, rolled back on failure",
        description="Create endpoints, or update running ones without dropping requests: each changed container "
                    "starts its new version beside the old one, traffic moves once all are ready, the old one "
                    "drains; if the new version does not become ready, the endpoint stays on the old one "
                    "(docs/reliability.md). Exit status 0 when every update succeeded, 1 if one failed, 2 for "
                    "an invalid spec.")
    apply.add_argument("specs", nargs="+", metavar="SPEC")
    apply.add_argument("--url", help="the embedded server (default http://127.0.0.1:8080, or SERVING_PORT); its control "
                                     "token is read from ~/.serving/control-token-PORT or SERVING_CONTROL_TOKEN")
    apply.add_argument("--address", help="a Ray cluster running `serving up --address` (default RAY_ADDRESS)")
    apply.add_argument("--identities", metavar="FILE", help="identities file for every endpoint (as for `serving up`)")
    apply.add_argument("--allow-unauthenticated-ray", action="store_true", help=argparse.SUPPRESS)
    apply.add_argument("--wait-timeout", type=float, default=900.0, help="seconds to wait for the new versions")
    apply.set_defaults(func=cmd_apply)

    delete = commands.add_parser("delete", help="remove endpoints from a running server, leaving the others")
    delete.add_argument("names", nargs="+", metavar="NAME")
    delete.add_argument("--url", help="the embedded server (default http://127.0.0.1:8080, or SERVING_PORT)")
    delete.add_argument("--address", help="a Ray cluster running `serving up --address` (default RAY_ADDRESS)")
    delete.add_argument("--allow-unauthenticated-ray", action="store_true", help=argparse.SUPPRESS)
    delete.set_defaults(func=cmd_delete)

    _add_loadtest(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

