"""The flags of `serving up` and `serving server`: what each means, kept apart from what the
commands do with them (`up`)."""

from __future__ import annotations

from serving.cli.up import cmd_server, cmd_up

__all__ = ["add_parser"]


def _api_arguments(parser) -> None:
    parser.add_argument(
        "--state",
        metavar="FILE",
        help="SQLite file of the SageMaker API's models, configs, endpoints and scaling policies "
        "(default ~/.serving/state-PORT.db; SERVING_STATE_DIR moves the folder)",
    )
    parser.add_argument(
        "--api-identities",
        metavar="FILE",
        help="identities file that signs and authorizes SageMaker API calls (and invocations of the endpoints "
        "they create); without it the API refuses every call, unless --allow-anonymous-api",
    )
    parser.add_argument(
        "--allow-anonymous-api",
        action="store_true",
        help="accept SageMaker API calls without credentials, from any process of this machine (a loopback --host "
        "only; local development): whoever calls it chooses code that runs here",
    )
    parser.add_argument(
        "--model-root",
        action="append",
        metavar="DIR",
        help="folder (or s3://bucket/prefix/) CreateModel's ModelDataUrl must lie in (repeatable; none by default, "
        "so the API then serves only s3:// models); an S3 object read with the server's own credentials must lie "
        "under an s3:// root. A folder holding this package, its Python, the state or identities is refused",
    )
    parser.add_argument(
        "--instance-types",
        metavar="FILE",
        help="YAML/JSON table InstanceType -> {Cpus, MemoryMb, Gpus}",
    )


def _grpc_arguments(parser) -> None:
    parser.add_argument(
        "--grpc-port",
        type=int,
        metavar="PORT",
        help="also serve the Open Inference Protocol over gRPC on this port of every gateway (default: off, or "
        "SERVING_GRPC_PORT)",
    )
    parser.add_argument(
        "--grpc-tls-cert", metavar="PEM", help="certificate chain for the gRPC port (TLS)"
    )
    parser.add_argument("--grpc-tls-key", metavar="PEM", help="private key of --grpc-tls-cert")


def add_parser(commands) -> None:
    """`serving up` and `serving server`."""
    server = commands.add_parser(
        "server",
        help="serve the SageMaker control-plane API (no spec): endpoints come from API calls and saved state",
    )
    server.add_argument("--host", help="address to bind (default 127.0.0.1, or SERVING_HOST)")
    server.add_argument("--port", type=int, help="port to bind (default 8080, or SERVING_PORT)")
    _grpc_arguments(server)
    server.add_argument(
        "--address", help="use this existing Ray cluster (default: RAY_ADDRESS, else embedded)"
    )
    server.add_argument("--allow-anonymous", action="store_true", help="as for `serving up`")
    server.add_argument(
        "--allow-unauthenticated-ray", action="store_true", help="as for `serving up`"
    )
    server.add_argument("--num-cpus", type=int, help="CPUs the embedded Ray may use (default: all)")
    server.add_argument("--gateways-per-node", type=int, metavar="N", help="as for `serving up`")
    server.add_argument(
        "--wait-timeout", type=float, default=180.0, help="seconds to wait for restored endpoints"
    )
    _api_arguments(server)
    _container_arguments(server)
    server.set_defaults(func=cmd_server)

    up = commands.add_parser("up", help="serve endpoints until interrupted")
    up.add_argument("specs", nargs="+", metavar="SPEC")
    _api_arguments(up)
    up.add_argument("--host", help="address to bind (default 127.0.0.1, or SERVING_HOST)")
    up.add_argument("--port", type=int, help="port to bind (default 8080, or SERVING_PORT)")
    _grpc_arguments(up)
    up.add_argument(
        "--address",
        help="deploy onto this existing Ray cluster (default: RAY_ADDRESS, else embedded)",
    )
    up.add_argument(
        "--identities",
        metavar="FILE",
        help="identities file (callers, keys, policies) for every endpoint, replacing the specs' AccessControl",
    )
    up.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="serve endpoints without AccessControl to anyone even on a non-loopback --host",
    )
    up.add_argument(
        "--allow-unauthenticated-ray",
        action="store_true",
        help="with --address: deploy even onto a Ray cluster that accepts connections without a token "
        "(anyone who reaches it can run code there)",
    )
    up.add_argument("--num-cpus", type=int, help="CPUs the embedded Ray may use (default: all)")
    up.add_argument(
        "--gateways-per-node",
        type=int,
        metavar="N",
        help="gateway processes on every Ray node, sharing the port (default 1, or SERVING_GATEWAYS_PER_NODE)",
    )
    up.add_argument(
        "--wait-timeout", type=float, default=180.0, help="seconds to wait for containers to load"
    )
    up.add_argument(
        "--exit-after-ready",
        action="store_true",
        help="stop once every endpoint is InService or Failed",
    )
    up.add_argument(
        "--detach",
        action="store_true",
        help="with --address: deploy, wait for readiness and return, leaving the endpoints running",
    )
    _container_arguments(up)
    up.set_defaults(func=cmd_up)


def _container_arguments(parser) -> None:
    parser.add_argument(
        "--container-egress-ports",
        metavar="PORTS",
        help="comma-separated TCP ports that containers with EnableNetworkIsolation: false may connect to "
        "(default: none, and such a container is refused; SERVING_CONTAINER_EGRESS_PORTS)",
    )
    parser.add_argument(
        "--no-fork-templates",
        action="store_true",
        help="start every container process as a fresh interpreter, never forked from its stack's template "
        "(SERVING_FORK_TEMPLATES=false; docs/security.md)",
    )
    parser.add_argument(
        "--no-node-hosts",
        action="store_true",
        help="give every container replica a Ray worker (Serve replica) of its own, not a place in its node's "
        "container host (SERVING_NODE_HOSTS=false; docs/architecture.md)",
    )
    parser.add_argument(
        "--no-locality-routing",
        action="store_true",
        help="send every hop to the least busy replica wherever it runs, not first to one on the gateway's own node "
        "(SERVING_LOCALITY_ROUTING=false; docs/reliability.md)",
    )
    parser.add_argument(
        "--no-registry-feed",
        action="store_true",
        help="gateways long-poll the registry through Ray, not over its HTTP snapshot feed (SERVING_REGISTRY_FEED=false; "
        "docs/architecture.md)",
    )
    parser.add_argument(
        "--shared-container-network",
        action="store_true",
        help="where no network namespace can be made for a container process (not root, and no unprivileged user "
        "namespaces), run it in the node's network under narrower rules instead of refusing (docs/security.md)",
    )
