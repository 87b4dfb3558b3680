"""Server settings: read once at start-up from flags and `SERVING_*` environment variables."""

from __future__ import annotations

import functools
import ipaddress
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from serving.http import limit_defaults as default


@functools.lru_cache(maxsize=1024)
def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server reachable from this machine only."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # any other host name may resolve to anything
        return False


# ServerSettings as JSON, the form Serve hands a replica its arguments in; ServerSettings validates
# it back.
SettingsJson = dict[str, Any]


class ServerSettings(BaseSettings):
    """How the endpoint server listens and what it enforces on every invocation."""

    model_config = SettingsConfigDict(env_prefix="SERVING_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="Address the endpoint HTTP server binds.")
    port: int = Field(8080, ge=0, le=65535, description="Port of the endpoint HTTP server.")
    gateways_per_node: int = Field(
        1,
        ge=1,
        description="Gateway processes on every Ray node (`--gateways-per-node`); those of one node share the port "
        "(SO_REUSEPORT), so that routing can use more than one core of a node. At most the node's CPUs.",
    )
    max_payload_mb: float = Field(
        6.0, gt=0, description="Largest request body accepted, in MB (SageMaker: 6)."
    )
    grpc_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port of the Open Inference Protocol's gRPC service on every gateway, at --host "
        "(docs/open-inference-protocol.md); None: no gRPC listener. The gateways of a node share it as they share "
        "--port.",
    )
    grpc_tls_cert: str | None = Field(
        None,
        description="PEM certificate chain the gRPC listener presents (with grpc_tls_key); None: plaintext.",
    )
    grpc_tls_key: str | None = Field(None, description="PEM private key of grpc_tls_cert.")
    grpc_max_concurrent_rpcs: int = Field(
        64,
        ge=1,
        description="gRPC calls one gateway runs at once; more are refused with RESOURCE_EXHAUSTED. A call's "
        "message (at most max_payload_mb) is read whole before its model names whose credentials to check, so "
        "this bounds what unauthenticated callers can make a gateway hold (64 x 6 MB).",
    )
    invocation_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Longest time one invocation may take end to end (a response stream: until its first part).",
    )
    stream_timeout_s: float = Field(
        300.0,
        gt=0,
        description="Longest time the last container's response stream (InvokeEndpointWithResponseStream) may "
        "last, from its request to its last part; past it the caller gets a ModelStreamError "
        "(ModelInvocationTimeExceeded) and the stream ends.",
    )
    container_host: str = Field(
        "127.0.0.1",
        description="Address container replicas bind their data port to; 'node' for the Ray node's IP. Honoured "
        "only on a cluster (--address): the embedded server always binds 127.0.0.1.",
    )
    sandbox: Literal["auto", "required", "off"] = Field(
        "auto",
        description="Confinement of container processes (docs/security.md): 'auto' gives each its own network "
        "namespace (or refuses to start it: shared_container_network) and applies every other layer the kernel "
        "offers (Landlock, seccomp), warning when one is missing, 'required' refuses to start a container "
        "without them all, 'off' runs tenant code unconfined in the node's network (still without Ray "
        "credentials).",
    )
    container_egress_ports: tuple[int, ...] = Field(
        (),
        description="TCP ports that a container which opts in (EnableNetworkIsolation: false) may connect to, on any "
        "address, from the node's network instead of a network namespace of its own (docs/security.md); empty: no "
        "container may opt in. Never the server's own ports.",
    )
    shared_container_network: bool = Field(
        False,
        description="Where the kernel cannot give a container process a network namespace of its own (the server is "
        "not root and the host allows no unprivileged user namespaces), run it in the node's network, walled off "
        "by Landlock's TCP rules and seccomp only (docs/security.md), instead of refusing to start it.",
    )
    fork_templates: bool = Field(
        True,
        description="Fork a container process from a per-machine template of its stack, which imported the "
        "framework once, where it may be (docs/security.md, 'Forked from its stack's template'); false: every "
        "container process starts as a fresh interpreter.",
    )
    node_hosts: bool = Field(
        True,
        description="Supervise the replicas of a container with no GPU and no RuntimeEnvironment from one container "
        "host per node, its target tracking run by the registry (docs/architecture.md, 'Container hosts'), instead "
        "of a Ray worker (Serve replica) each; false: every container replica is a Serve replica of its own.",
    )
    allow_model_requirements: bool = Field(
        False,
        description="Install what a local model's code/requirements.txt lists and this Python lacks, as SageMaker "
        "does at container start. Ray installs it outside the container's sandbox, where install scripts and "
        ".pth files run with Ray's credentials, so it is off: such a model is refused at deploy time, naming "
        "the lines (RuntimeEnvironment.Pip, which the spec's author writes, is always installed).",
    )
    hop_unix_socket: bool = Field(
        True,
        description="Send the gateway's hops to a container replica on its own machine through the Unix socket "
        "beside the replica's data port (a folder only this user may enter) instead of TCP; streamed answers and "
        "replicas on other nodes use TCP either way.",
    )
    locality_routing: bool = Field(
        True,
        description="Prefer a container's replica on the gateway's own node while it is not much busier than the "
        "least busy elsewhere (docs/reliability.md, 'Multi-node'); false: every hop goes to the least busy replica "
        "wherever it runs.",
    )
    registry_feed: bool = Field(
        True,
        description="Gateways long-poll the registry's snapshots over its signed HTTP feed, which costs the registry a "
        "fraction of a Ray call per gateway (docs/architecture.md, 'The registry's snapshot feed'); false: every "
        "gateway long-polls through Ray, as before the feed.",
    )
    registry_poll_s: float = Field(
        0.1,
        gt=0,
        description="Least time between two refreshes of the router's tables; each refresh is a long poll that "
        "the registry answers as soon as its state changes.",
    )
    region: str = Field(
        "us-east-1",
        pattern=r"^[a-z0-9-]{1,32}$",
        description="Region in endpoint ARNs and the one SigV4 credential scopes must name (clients' region_name).",
    )
    account_id: str = Field(
        "000000000000", pattern=r"^\d{12}$", description="Account id in endpoint ARNs."
    )
    allow_anonymous: bool = Field(
        False,
        description="Serve endpoints without AccessControl to anyone even when `host` is not a loopback address.",
    )
    # What a caller can cost before it is authenticated (see docs/api.md, "Limits"). The HTTP server
    # enforces the first six (serving.http.limits; their defaults live in
    # serving.http.limit_defaults), the router the last.
    max_connections: int = Field(
        default.MAX_CONNECTIONS,
        ge=1,
        description="Open client connections at most; further ones are closed as soon as they are accepted "
        "(Envoy's overflow behaviour). 1024 is nginx's usual worker_connections and the usual soft "
        "open-file limit.",
    )
    max_header_bytes: int = Field(
        default.MAX_HEADER_BYTES,
        ge=1024,
        description="Request line plus headers, in bytes; more is refused with 431. 16 KiB is h11's and "
        "Node.js's default (nginx allows 8 KiB per line).",
    )
    max_header_count: int = Field(
        default.MAX_HEADER_COUNT,
        ge=16,
        description="Headers in one request; more is refused with 431 (Apache's LimitRequestFields and Envoy's "
        "max_headers_count default to 100).",
    )
    header_timeout_s: float = Field(
        default.HEADER_TIMEOUT_S,
        gt=0,
        description="Time to send a request's line and headers, from its first byte (from the connection for the "
        "first request; idle keep-alive time is not counted); then 408 and the connection is closed. "
        "HAProxy's usual `timeout http-request`.",
    )
    body_idle_timeout_s: float = Field(
        default.BODY_IDLE_TIMEOUT_S,
        gt=0,
        description="Longest pause while a request body is being received; then 408 and the connection is "
        "closed. Apache mod_reqtimeout's body=20 (nginx's client_body_timeout is 60).",
    )
    body_timeout_s: float = Field(
        default.BODY_TIMEOUT_S,
        gt=0,
        description="Time to receive a whole request body, from the end of its headers, however steadily it "
        "trickles (slow POST); then 408. 60 s passes the 6 MB payload limit at 100 kB/s.",
    )
    preauth_body_budget_mb: float = Field(
        64.0,
        gt=0,
        description="Request bodies the gateway holds at once before their Signature V4 is verified, in MB "
        "(bearer keys are checked before any body is read); a body that does not fit is refused "
        "with 429 ThrottlingException. At least max_payload_mb.",
    )

    async_max_queued: int = Field(
        1000,
        ge=0,
        description="InvokeEndpointAsync requests one endpoint holds waiting, beyond those running; more are "
        "refused with 429 ThrottlingException. A waiting request costs its headers (its input is read when it runs).",
    )
    async_max_input_mb: float = Field(
        1000.0,
        gt=0,
        description="Largest InvokeEndpointAsync input object read, in MB (SageMaker: 1 GB); a larger one fails "
        "the request. Each running request holds its input in the gateway's memory.",
    )

    # The control-plane API (docs/sagemaker-api.md).
    state_file: str | None = Field(
        None,
        description="SQLite file of the control-plane API's models, endpoint configs, endpoints and scaling "
        "policies; None keeps them in memory. `serving up` / `serving server`: ~/.serving/state-<port>.db.",
    )
    api_identities: str | None = Field(
        None,
        description="Identities file whose keys and policies sign and authorize control-plane API calls (IAM "
        "actions such as sagemaker:CreateEndpoint); also the AccessControl of the endpoints the API creates. "
        "Without it the API refuses every call, unless allow_anonymous_api.",
    )
    allow_anonymous_api: bool = Field(
        False,
        description="Accept control-plane API calls without credentials (`--allow-anonymous-api`): from any "
        "process of this machine, so only on a loopback server without api_identities (local development).",
    )
    model_roots: str = Field(
        "",
        description="Folders (separated by the OS path separator) that CreateModel's local ModelDataUrl paths must "
        "lie in; relative paths resolve against the first. None by default: the operator names each "
        "(`--model-root`), and one that holds this package, its Python, the state or identities is refused "
        "(`sagemaker_api.model_roots`).",
    )
    instance_types_file: str | None = Field(
        None,
        description="YAML/JSON table of InstanceType -> {Cpus, MemoryMb, Gpus}; None: the default table.",
    )

    @model_validator(mode="after")
    def _one_body_fits_the_budget(self) -> ServerSettings:
        if self.preauth_body_budget_mb < self.max_payload_mb:
            raise ValueError(
                f"preauth_body_budget_mb ({self.preauth_body_budget_mb:g}) must be at least max_payload_mb "
                f"({self.max_payload_mb:g}): a signed request of the largest payload could never be verified"
            )
        return self

    @model_validator(mode="after")
    def _egress_is_not_the_server(self) -> ServerSettings:
        own = {self.port, self.grpc_port} & set(self.container_egress_ports)
        if own - {0, None} or not all(0 < port < 65536 for port in self.container_egress_ports):
            raise ValueError(
                f"container_egress_ports ({', '.join(map(str, self.container_egress_ports))}) must be ports 1-65535 "
                "other than the server's own (--port, --grpc-port): containers never reach the gateways"
            )
        return self

    @model_validator(mode="after")
    def _grpc_tls_whole(self) -> ServerSettings:
        if (self.grpc_tls_cert is None) != (self.grpc_tls_key is None):
            raise ValueError(
                "grpc_tls_cert and grpc_tls_key go together: a certificate needs its private key"
            )
        if self.grpc_tls_cert is not None and self.grpc_port is None:
            raise ValueError(
                "grpc_tls_cert is given but grpc_port is not: there is no gRPC listener to secure"
            )
        return self

    @property
    def max_payload_bytes(self) -> int:
        return int(self.max_payload_mb * 1_000_000)

    @property
    def async_max_input_bytes(self) -> int:
        return int(self.async_max_input_mb * 1_000_000)

    @property
    def preauth_body_budget_bytes(self) -> int:
        return int(self.preauth_body_budget_mb * 1_000_000)

    @model_validator(mode="after")
    def _anonymous_api_on_loopback_only(self) -> ServerSettings:
        if self.allow_anonymous_api and self.api_identities is not None:
            raise ValueError(
                "allow_anonymous_api and api_identities exclude each other: API calls are signed or not"
            )
        if self.allow_anonymous_api and not is_loopback(self.host):
            raise ValueError(
                f"allow_anonymous_api needs a loopback host, not {self.host}: anyone who reached the port could "
                "deploy code; give api_identities instead"
            )
        return self

    @property
    def api_anonymous_allowed(self) -> bool:
        """Whether control-plane API calls may come without credentials: only when the operator said
        so."""
        return self.allow_anonymous_api

    @property
    def anonymous_allowed(self) -> bool:
        """Whether endpoints without AccessControl may be invoked without credentials."""
        return self.allow_anonymous or is_loopback(self.host)
