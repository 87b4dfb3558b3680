"""`serving apply` and `serving delete`: change the endpoints of a running server, over its control
routes (the embedded server, with the control token `serving up` left) or straight through a Ray
cluster."""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time

from serving.cli.specs import load_all
from serving.settings import ServerSettings, is_loopback


def _control_client(args: argparse.Namespace):
    """An HTTP client for the control routes of the server at --url, with its control token."""
    import httpx

    from serving.gateway.control_routes import control_token_file
    from serving.private_files import PrivateFileError, open_private

    url = (args.url or f"http://127.0.0.1:{os.environ.get('SERVING_PORT', '8080')}").rstrip("/")
    token = os.environ.get("SERVING_CONTROL_TOKEN")
    if not token:
        host = httpx.URL(url).host
        # the file holds this machine's server's token: never another host's to read
        if not is_loopback(host):
            print(
                f"refusing to send this machine's control token to {host}: `serving up` left it for the server on "
                "this machine; to call another server, set SERVING_CONTROL_TOKEN to that server's token",
                file=sys.stderr,
            )
            raise SystemExit(2)
        path = control_token_file(int(url.rsplit(":", 1)[1].split("/")[0]))
        # as `serving up` wrote it: this user's own file, through no link (else another file is
        # sent)
        try:
            with os.fdopen(open_private(path, os.O_RDONLY)) as file:
                token = file.read().strip()
        except PrivateFileError as error:
            why = (
                f"{path} is missing (is `serving up` running on {url}?)"
                if error.errno == errno.ENOENT
                else error
            )
            print(f"no control token: {why}; or set SERVING_CONTROL_TOKEN", file=sys.stderr)
            raise SystemExit(2) from None
    return httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {token}"})


def wait_for_updates(describe, generations: dict[str, int], timeout: float) -> dict[str, dict]:
    """Poll descriptions until each endpoint's update of at least `generations[name]` has finished
    (or the timeout passes): the gateway may still show the previous update for a moment."""
    deadline = time.monotonic() + timeout

    def done(description: dict | None, generation: int) -> bool:
        update = (description or {}).get("LastUpdate") or {}
        return (update.get("Generation") or 0) >= generation and update.get("Status") not in (
            None,
            "InProgress",
        )

    while True:
        latest = {name: d for name, d in describe().items() if name in generations}
        settled = all(
            done(latest.get(name), generation) for name, generation in generations.items()
        )
        if settled or time.monotonic() >= deadline:
            return latest
        time.sleep(0.5)


def _report(names: list[str], states: dict[str, dict]) -> int:
    failed = False
    for name in names:
        description = states.get(name, {"EndpointStatus": "unknown", "LastUpdate": {}})
        update = description.get("LastUpdate") or {}
        outcome = {
            "Succeeded": "updated",
            "Failed": "update FAILED and was rolled back"
            if description["EndpointStatus"] != "Failed"
            else "FAILED",
            "InProgress": "still updating",
        }
        text = outcome.get(str(update.get("Status")), "unknown")
        reason = f": {update['FailureReason']}" if update.get("FailureReason") else ""
        print(f"  {name}: {description['EndpointStatus']} ({text}{reason})", flush=True)
        failed |= update.get("Status") != "Succeeded"
    return 1 if failed else 0


def cmd_apply(args: argparse.Namespace) -> int:
    specs = load_all(args.specs, args.identities)
    names = [spec.EndpointName for spec in specs]
    address = args.address or os.environ.get("RAY_ADDRESS")
    if address:  # straight to the cluster's control plane (this process holds the cluster's token)
        from serving import ray_wing

        # as a server started with `serving up` would resolve it, unless the environment says
        # otherwise
        settings = (
            ServerSettings()
            if "SERVING_CONTAINER_HOST" in os.environ
            else ServerSettings(container_host="node")
        )
        ray_wing.connect_cluster(address, allow_unauthenticated=args.allow_unauthenticated_ray)
        try:
            generations = {
                spec.EndpointName: ray_wing.deploy_endpoint(spec, settings) for spec in specs
            }
            print(f"Applied {', '.join(names)}; waiting for the new versions ...", flush=True)
            return _report(
                names, wait_for_updates(ray_wing.describe_endpoints, generations, args.wait_timeout)
            )
        finally:
            ray_wing.disconnect()
    with _control_client(args) as client:
        generations = {}
        for spec in specs:
            response = client.put(
                f"/endpoints/{spec.EndpointName}",
                json=spec.model_dump(mode="json", exclude_none=True),
            )
            if response.status_code != 200:
                print(
                    f"{spec.EndpointName}: {response.status_code} {response.text}", file=sys.stderr
                )
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

        return _report(names, wait_for_updates(describe, generations, args.wait_timeout))


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


def add_parsers(commands) -> None:
    """`serving apply` and `serving delete`."""
    apply = commands.add_parser(
        "apply",
        help="create or update endpoints of a running server, blue/green, rolled back on failure",
        description="Create endpoints, or update running ones without dropping requests: each changed container "
        "starts its new version beside the old one, traffic moves once all are ready, the old one "
        "drains; if the new version does not become ready, the endpoint stays on the old one "
        "(docs/reliability.md). Exit status 0 when every update succeeded, 1 if one failed, 2 for "
        "an invalid spec.",
    )
    apply.add_argument("specs", nargs="+", metavar="SPEC")
    apply.add_argument(
        "--url",
        help="the embedded server (default http://127.0.0.1:8080, or SERVING_PORT); its control "
        "token is read from ~/.serving/control-token-PORT or SERVING_CONTROL_TOKEN",
    )
    apply.add_argument(
        "--address", help="a Ray cluster running `serving up --address` (default RAY_ADDRESS)"
    )
    apply.add_argument(
        "--identities",
        metavar="FILE",
        help="identities file for every endpoint (as for `serving up`)",
    )
    apply.add_argument("--allow-unauthenticated-ray", action="store_true", help=argparse.SUPPRESS)
    apply.add_argument(
        "--wait-timeout", type=float, default=900.0, help="seconds to wait for the new versions"
    )
    apply.set_defaults(func=cmd_apply)

    delete = commands.add_parser(
        "delete", help="remove endpoints from a running server, leaving the others"
    )
    delete.add_argument("names", nargs="+", metavar="NAME")
    delete.add_argument(
        "--url", help="the embedded server (default http://127.0.0.1:8080, or SERVING_PORT)"
    )
    delete.add_argument(
        "--address", help="a Ray cluster running `serving up --address` (default RAY_ADDRESS)"
    )
    delete.add_argument("--allow-unauthenticated-ray", action="store_true", help=argparse.SUPPRESS)
    delete.set_defaults(func=cmd_delete)
