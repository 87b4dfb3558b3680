"""The `serving` command: validate specs, and bring endpoints up on an embedded or existing Ray."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

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


def _get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_for_endpoints(base_url: str, names: list[str], timeout: float) -> dict[str, dict]:
    """Poll GET /endpoints/{name} until each is InService or Failed (or the timeout passes)."""
    deadline = time.monotonic() + timeout
    latest: dict[str, dict] = {}
    while time.monotonic() < deadline:
        for name in names:
            try:
                latest[name] = _get_json(f"{base_url}/endpoints/{name}")
            except (urllib.error.URLError, OSError, ValueError):
                continue
        if len(latest) == len(names) and all(d["EndpointStatus"] in ("InService", "Failed") for d in latest.values()):
            break
        time.sleep(0.5)
    return latest


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

    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    address = args.address or os.environ.get("RAY_ADDRESS")
    if not address and "container_host" not in overrides:
        overrides["container_host"] = "127.0.0.1"
    settings = ServerSettings(**overrides)

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    print(f"Starting {'Ray cluster at ' + address if address else 'an embedded local Ray'} ...", flush=True)
    if address:
        app.connect_cluster(address)
    else:
        app.start_local_ray(num_cpus=args.num_cpus)
    try:
        base_url = app.start_gateway(settings)
        for spec in specs:
            app.deploy_endpoint(spec, settings)
        print(f"\nEndpoint server: {base_url}", flush=True)
        for spec in specs:
            print(f"\n{spec.EndpointName} ({spec.mode.value}) - example calls:")
            for line in example_calls(base_url, spec):
                print(f"  {line}")
        print("\nWaiting for containers to load ...", flush=True)
        states = wait_for_endpoints(base_url, [s.EndpointName for s in specs], args.wait_timeout)
        failed = False
        for spec in specs:
            description = states.get(spec.EndpointName, {"EndpointStatus": "Creating", "FailureReason": "no status yet"})
            status = description["EndpointStatus"]
            reason = f": {description['FailureReason']}" if description.get("FailureReason") else ""
            print(f"  {spec.EndpointName}: {status}{reason}", flush=True)
            failed |= status != "InService"
        if args.exit_after_ready:
            return 1 if failed else 0
        print("\nServing. Press Ctrl-C to stop.", flush=True)
        stop.wait()
        print("Shutting down ...", flush=True)
        return 0
    finally:
        if address:
            for spec in specs:
                app.delete_endpoint(spec.EndpointName)
        app.shutdown()


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
    up.set_defaults(func=cmd_up)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

