"""The `serving` command: validate specs, and bring endpoints up on an embedded or existing Ray."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from serving.spec import EndpointSpec, SpecError, load_spec


def _load_all(paths: list[str]) -> list[EndpointSpec]:
    specs, failed = [], False
    for path in paths:
        try:
            specs.append(load_spec(path))
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


def cmd_validate(args: argparse.Namespace) -> int:
    for path, spec in zip(args.specs, _load_all(args.specs)):
        hostnames = ", ".join(c.ContainerHostname for c in spec.Containers)
        print(f"{path}: OK  endpoint {spec.EndpointName} ({spec.mode.value}, {len(spec.Containers)} containers: {hostnames})")
    return 0


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


def example_calls(base_url: str, spec: EndpointSpec) -> list[str]:
    """Copy-pasteable calls for an endpoint, shown at start-up."""
    url = f"{base_url}/endpoints/{spec.EndpointName}/invocations"
    lines = []
    targets = [None] if spec.mode.value == "Serial" or len(spec.Containers) == 1 else [c.ContainerHostname for c in spec.Containers]
    for target in targets[:3]:
        header = f" -H 'X-Amzn-SageMaker-Target-Container-Hostname: {target}'" if target else ""
        lines.append(f"curl -s {url} -H 'Content-Type: application/json'{header} -d '[[5.1, 3.5, 1.4, 0.2]]'")
    target_arg = f", TargetContainerHostname='{targets[0]}'" if targets[0] else ""
    lines.append(
        "python -c \"import boto3; rt = boto3.client('sagemaker-runtime', endpoint_url='" + base_url + "', "
        "region_name='us-east-1', aws_access_key_id='x', aws_secret_access_key='x'); "
        f"print(rt.invoke_endpoint(EndpointName='{spec.EndpointName}', ContentType='application/json', "
        f"Body='[[5.1, 3.5, 1.4, 0.2]]'{target_arg})['Body'].read())\""
    )
    return lines


def cmd_up(args: argparse.Namespace) -> int:
    specs = _load_all(args.specs)
    from serving import app  # imports Ray: only once the specs are known to be good
    from serving.settings import ServerSettings

    address = args.address or os.environ.get("RAY_ADDRESS")
    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    if address and "SERVING_CONTAINER_HOST" not in os.environ:
        overrides["container_host"] = "node"  # replicas on other nodes must be reachable
    settings = ServerSettings(**overrides)

    print(f"Starting {'on the Ray cluster at ' + address if address else 'an embedded local Ray'} ...", flush=True)
    if address:
        app.connect_cluster(address)
    else:
        app.start_local_ray(num_cpus=args.num_cpus)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own
        signal.signal(signum, lambda *_: stop.set())
    try:
        base_url = app.start_gateway(settings)
        for spec in specs:
            app.deploy_endpoint(spec, settings)
        print(f"\nEndpoint server: {base_url}", flush=True)
        for spec in specs:
            print(f"\n{spec.EndpointName} ({spec.mode.value}) - example calls (use your model's input):")
            for line in example_calls(base_url, spec):
                print(f"  {line}")
        print("\nWaiting for containers to load ...", flush=True)
        states = wait_for_endpoints(app.describe_endpoints, [s.EndpointName for s in specs], args.wait_timeout)
        failed = False
        for spec in specs:
            description = states.get(spec.EndpointName, {"EndpointStatus": "Creating"})
            status = description["EndpointStatus"]
            reason = f": {description['FailureReason']}" if description.get("FailureReason") else ""
            print(f"  {spec.EndpointName}: {status}{reason}", flush=True)
            failed |= status != "InService"
        if args.exit_after_ready or (address and args.detach):
            return 1 if failed else 0
        print("\nServing. Press Ctrl-C to stop.", flush=True)
        stop.wait()
        print("Shutting down ...", flush=True)
        return 0
    finally:
        if not address:
            app.shutdown()
        elif not args.detach:
            for spec in specs:  # leave the rest of the cluster's Serve applications alone
                app.delete_endpoint(spec.EndpointName)
            app.disconnect()
        else:
            app.disconnect()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="serving", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    validate = commands.add_parser("validate", help="check endpoint specs and print the verdict")
    validate.add_argument("specs", nargs="+", metavar="SPEC")
    validate.set_defaults(func=cmd_validate)

    up = commands.add_parser("up", help="serve endpoints until interrupted")
    up.add_argument("specs", nargs="+", metavar="SPEC")
    up.add_argument("--host", help="address to bind (default 127.0.0.1, or SERVING_HOST)")
    up.add_argument("--port", type=int, help="port to bind (default 8080, or SERVING_PORT)")
    up.add_argument("--address", help="deploy onto this existing Ray cluster (default: RAY_ADDRESS, else embedded)")
    up.add_argument("--num-cpus", type=int, help="CPUs the embedded Ray may use (default: all)")
    up.add_argument("--wait-timeout", type=float, default=180.0, help="seconds to wait for containers to load")
    up.add_argument("--exit-after-ready", action="store_true", help="stop once every endpoint is InService or Failed")
    up.add_argument("--detach", action="store_true",
                    help="with --address: deploy, wait for readiness and return, leaving the endpoints running")
    up.set_defaults(func=cmd_up)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

