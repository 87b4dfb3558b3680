"""`serving up`: validate, then serve endpoints on an embedded Ray (or a cluster) until
interrupted."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from serving.cli.preflight import check_anonymous, check_container_network, check_requirements
from serving.cli.specs import load_all
from serving.config.spec import ContainerSpec, EndpointSpec
from serving.settings import ServerSettings

# an iris row: the example input when a model says nothing of its own
GENERIC_ROW = [[5.1, 3.5, 1.4, 0.2]]


def example_input(container: ContainerSpec) -> list[list[float]]:
    """A request body a container's model accepts, where it is known: a row of zeros as wide as the
    trainer's `model.json` signature says (`serving train` writes one beside every model); else
    GENERIC_ROW."""
    url = container.ModelDataUrl or ""
    if "://" in url:
        return GENERIC_ROW
    try:
        signature = json.loads((Path(url) / "model.json").read_text()).get("signature") or {}
        width = int(signature["inputs"][0]["shape"][-1])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return GENERIC_ROW
    return [[0.0] * width] if 0 < width <= 4096 else GENERIC_ROW


def example_calls(base_url: str, spec: EndpointSpec, region: str = "us-east-1") -> list[str]:
    """Copy-pasteable calls for an endpoint, shown at start-up (with placeholders, never secrets),
    each with an input its container's model takes where one is known (`example_input`)."""
    url = f"{base_url}/endpoints/{spec.EndpointName}/invocations"
    lines = []
    secured = spec.AccessControl is not None
    bearer = " -H 'Authorization: Bearer <ApiKey>'" if secured else ""
    containers = {c.ContainerHostname: c for c in spec.Containers}
    targets = (
        [None] if spec.mode.value == "Serial" or len(spec.Containers) == 1 else list(containers)
    )
    first = spec.Containers[0]  # a Serial chain's input is its first container's
    for target in targets[:3]:
        header = f" -H 'X-Amzn-SageMaker-Target-Container-Hostname: {target}'" if target else ""
        body = json.dumps(example_input(containers[target] if target else first))
        lines.append(
            f"curl -s {url} -H 'Content-Type: application/json'{header}{bearer} -d '{body}'"
        )
    target_arg = f", TargetContainerHostname='{targets[0]}'" if targets[0] else ""
    key, secret = ("<AccessKeyId>", "<SecretAccessKey>") if secured else ("x", "x")
    if secured:
        lines.append(
            f"(<ApiKey>, <AccessKeyId>, <SecretAccessKey>: a caller's credentials from {spec.AccessControl.IdentitiesFile if spec.AccessControl else ''})"
        )
    body = json.dumps(example_input(containers[targets[0]] if targets[0] else first))
    lines.append(
        "python -c \"import boto3; rt = boto3.client('sagemaker-runtime', endpoint_url='"
        + base_url
        + "', "
        f"region_name='{region}', aws_access_key_id='{key}', aws_secret_access_key='{secret}'); "
        f"print(rt.invoke_endpoint(EndpointName='{spec.EndpointName}', ContentType='application/json', "
        f"Body='{body}'{target_arg})['Body'].read())\""
    )
    return lines


def _api_settings(args: argparse.Namespace, port: int) -> dict[str, str | None]:
    """The control-plane API's settings a flag names, else the CLI's defaults where no SERVING_*
    variable is set.

    SystemExit(2) naming a file that cannot be used.
    """
    from serving.access.identities import IdentitiesError, load_identities
    from serving.gateway.control_routes import control_token_file
    from serving.private_files import PrivateFileError, private_folder, unfollowed
    from serving.sagemaker_api.database import default_state_file
    from serving.sagemaker_api.images import load_instance_types
    from serving.sagemaker_api.state_file import check_state_file

    env = os.environ
    chosen: dict[str, str | None] = {}
    if args.state or "SERVING_STATE_FILE" not in env:
        state = args.state or (str(default_state_file(port)) if port else None)
        # a link there is refused, not followed
        chosen["state_file"] = str(unfollowed(state)) if state else None
    if args.api_identities:
        chosen["api_identities"] = str(Path(args.api_identities).resolve())
    if args.instance_types:
        chosen["instance_types_file"] = str(Path(args.instance_types).resolve())
    if args.model_root:  # no default: the operator names every folder callers may serve from
        roots = args.model_root
        chosen["model_roots"] = os.pathsep.join(
            r if r.startswith("s3://") else str(Path(r).resolve()) for r in roots
        )
    identities = chosen.get("api_identities", env.get("SERVING_API_IDENTITIES"))
    state_file = chosen.get("state_file", env.get("SERVING_STATE_FILE"))
    try:
        # where `serving apply` finds the control token
        private_folder(control_token_file(port).parent)
        if state_file:
            check_state_file(state_file)
        if identities:
            load_identities(identities)
        load_instance_types(
            chosen.get("instance_types_file", env.get("SERVING_INSTANCE_TYPES_FILE"))
        )
    except (IdentitiesError, PrivateFileError, OSError, ValueError) as error:
        print(f"refusing to start: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    return chosen


def _settings(args: argparse.Namespace, address: str | None) -> ServerSettings:
    given = {
        "host": args.host,
        "port": args.port,
        "gateways_per_node": getattr(args, "gateways_per_node", None),
        **{
            name: getattr(args, name, None)
            for name in ("grpc_port", "grpc_tls_cert", "grpc_tls_key")
        },
    }
    overrides: dict = {k: v for k, v in given.items() if v is not None}
    overrides.update(
        _api_settings(args, overrides.get("port", int(os.environ.get("SERVING_PORT", 8080))))
    )
    if args.allow_anonymous:
        overrides["allow_anonymous"] = True
    if getattr(args, "allow_anonymous_api", False):
        overrides["allow_anonymous_api"] = True
    if getattr(args, "container_egress_ports", None):
        overrides["container_egress_ports"] = _ports(args.container_egress_ports)
    if getattr(args, "shared_container_network", False):
        overrides["shared_container_network"] = True
    if getattr(args, "no_fork_templates", False):
        overrides["fork_templates"] = False
    if getattr(args, "no_node_hosts", False):
        overrides["node_hosts"] = False
    if getattr(args, "no_locality_routing", False):
        overrides["locality_routing"] = False
    if getattr(args, "no_registry_feed", False):
        overrides["registry_feed"] = False
    if address and "SERVING_CONTAINER_HOST" not in os.environ:
        overrides["container_host"] = "node"  # replicas on other nodes must be reachable
    elif not address and os.environ.get("SERVING_CONTAINER_HOST", "127.0.0.1") != "127.0.0.1":
        print(
            "note: SERVING_CONTAINER_HOST is ignored by the embedded server: data ports bind 127.0.0.1",
            file=sys.stderr,
        )
    try:
        return ServerSettings(**overrides)
    # pydantic's ValidationError: a combination of flags that cannot be served
    except ValueError as error:
        lines = [
            item["msg"].removeprefix("Value error, ")
            if item["msg"].startswith("Value error")
            else f"--{'-'.join(str(part) for part in item['loc']).replace('_', '-')}: {item['msg']}"
            for item in getattr(error, "errors", lambda: [])()
        ]
        print(f"refusing to start: {'; '.join(lines) or error}", file=sys.stderr)
        raise SystemExit(2) from None


def _ports(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(port) for port in text.split(",") if port.strip())
    except ValueError:
        print(
            f"refusing to start: --container-egress-ports {text!r} is not a comma-separated list of ports",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


def cmd_server(args: argparse.Namespace) -> int:
    """`serving server`: no spec; endpoints come from the control-plane API and its saved state."""
    args.specs, args.identities, args.exit_after_ready, args.detach = [], None, False, False
    return cmd_up(args)


def cmd_up(args: argparse.Namespace) -> int:
    from serving.sagemaker_api.model_roots import ModelRootError, check_model_roots

    specs = load_all(args.specs, args.identities) if args.specs else []
    address = args.address or os.environ.get("RAY_ADDRESS")
    settings = _settings(args, address)
    try:
        identities = tuple(
            str(spec.AccessControl.IdentitiesFile) for spec in specs if spec.AccessControl
        )
        check_model_roots(settings, identities)
    except ModelRootError as error:
        print(f"refusing to start: {error}", file=sys.stderr)
        return 2
    warning = check_anonymous(specs, settings.host, settings.allow_anonymous)
    refused = check_requirements(
        specs, settings.allow_model_requirements
    ) or check_container_network(specs, settings)
    if refused:
        print(f"refusing to deploy: {refused}", file=sys.stderr)
        return 2
    # As Ray's workers do (`RAY_preload_python_modules`): Serve without pandas, pyarrow on first use.
    import serving._worker_preload  # noqa: F401
    from serving import (
        ray_wing,  # imports Ray: only once the specs and settings are known to be good
    )

    print(
        f"Starting {'on the Ray cluster at ' + address if address else 'an embedded local Ray'} ...",
        flush=True,
    )
    stop = threading.Event()

    def on_signals() -> None:  # after ray.init, which installs its own
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())

    detach = bool(address and args.detach)
    server = ray_wing.EmbeddedServer(
        specs,
        settings,
        address=address,
        allow_unauthenticated_ray=args.allow_unauthenticated_ray,
        num_cpus=args.num_cpus,
        wait=False,
        ready_timeout_s=args.wait_timeout,
        keep_endpoints=detach,
        after_ray_start=on_signals,
    )
    try:
        with server:
            token_file = _write_control_token(ray_wing.http_control_token(), server.url)
            try:
                return _serve(
                    server, specs, warning, stop, exit_early=args.exit_after_ready or detach
                )
            finally:
                if not detach:
                    token_file.unlink(missing_ok=True)
    # raised by joining the cluster, before anything started
    except ray_wing.UnauthenticatedClusterError as error:
        print(f"refusing to deploy: {error}", file=sys.stderr)
        return 2


def _serve(
    server, specs: list[EndpointSpec], warning: str | None, stop: threading.Event, exit_early: bool
) -> int:
    print(f"\nEndpoint server: {server.url}", flush=True)
    if server.settings.grpc_port is not None:
        tls = "TLS" if server.settings.grpc_tls_cert else "plaintext"
        print(
            f"Open Inference gRPC: {server.settings.host}:{server.settings.grpc_port} ({tls})",
            flush=True,
        )
    state = server.settings.state_file or "memory (gone when the server stops)"
    print(
        f"SageMaker API: boto3.client('sagemaker', endpoint_url='{server.url}') and 'application-autoscaling' "
        f"(docs/sagemaker-api.md); {_api_access(server.settings)}; state in {state}",
        flush=True,
    )
    for spec in specs:
        print(
            f"\n{spec.EndpointName} ({spec.mode.value}) - example calls (use your model's input):"
        )
        for line in example_calls(server.url, spec, server.settings.region):
            print(f"  {line}")
    if warning:
        print(f"\n{warning}", file=sys.stderr, flush=True)
    print("\nWaiting for containers to load ...", flush=True)
    readiness = server.wait_ready()
    failed = False
    for spec in specs:
        status, failure = readiness.status(spec.EndpointName)
        reason = f": {failure}" if failure else ""
        print(f"  {spec.EndpointName}: {status}{reason}", flush=True)
        failed |= status != "InService"
    for reason in readiness.unroutable:  # InService, but the gateway could not route it yet
        print(f"  not routable yet: {reason}", flush=True)
    if exit_early:
        return 1 if failed else 0
    print(
        "\nServing. Press Ctrl-C to stop. Change endpoints live with `serving apply SPEC` / `serving delete NAME`.",
        flush=True,
    )
    stop.wait()
    print("Shutting down ...", flush=True)
    return 0


def _api_access(settings: ServerSettings) -> str:
    """Who may call the control-plane API, in a few words for the start-up lines."""
    if settings.api_identities:
        return f"calls signed by {settings.api_identities}'s identities"
    # container processes are not "this machine": they have their own network
    if settings.allow_anonymous_api:
        return "anonymous calls from this machine (--allow-anonymous-api)"
    return "every call refused (give --api-identities, or --allow-anonymous-api on loopback)"


def _write_control_token(token: str, base_url: str) -> Path:
    """Leave the control token where `serving apply` finds it: readable by this user only."""
    from serving.gateway.control_routes import control_token_file
    from serving.private_files import open_private

    path = control_token_file(int(base_url.rsplit(":", 1)[1]))
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as out:
        out.write(token)
    return path
