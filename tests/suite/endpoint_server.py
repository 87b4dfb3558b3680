"""One embedded Ray and endpoint server per test session, and in it the endpoints each test module
uses.

The integration and security tiers share one Ray and one gateway, started when a test first asks for
them, with no endpoints. A module that uses endpoints names them in `ENDPOINTS`, a mapping of
endpoint name to the function that builds its spec (its parameters name the session fixtures it is
built from: `suite.endpoints` for the shared ones, the module itself for its own), and asks for the
`server` fixture, which deploys those not running yet, waits for them (bounded) and, after the last
module that names one has run, deletes it: a module deploys no more than it uses, an endpoint is
built once however many modules share it, and an endpoint that fails to start fails the modules that
name it only. Every wait is bounded; everything is torn down at the end of the session.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from serving.client import Client, RetryPolicy
from serving.config.spec import parse_spec
from serving.settings import ServerSettings
from suite.otlp import tracing_environment
from suite.services import AWS_TEST_ENVIRONMENT

_LAST_USER = pytest.StashKey[dict]()

# one module's endpoints (at most ~25 replicas, it-fifteen's TensorFlow and PyTorch ones
READY_TIMEOUT_S = 1500

# The session's Ray has 2 logical CPUs and every other replica reserves 0.05 of them: the
# containers added after it-fifteen reserve less, so that all replicas can be placed.
TINY = {"Cpus": 0.01}

Builder = Callable[..., dict]


def fails_to_start(builder: Builder) -> Builder:
    """Mark an endpoint whose start is meant to fail: it settles Failed, and modules that name it
    still run."""
    builder.fails_to_start = True  # type: ignore[attr-defined]
    return builder


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected what will not run
def pytest_collection_modifyitems(config, items):
    # A module's set-up (training, Ray, its endpoints) is bounded by READY_TIMEOUT_S, not by the
    # per-test timeout of whichever test happens to request it first: that one times its own body
    # only.
    for item in items:
        if item.get_closest_marker("integration") and not item.get_closest_marker("timeout"):
            item.add_marker(
                pytest.mark.timeout(float(item.config.getini("timeout") or 300), func_only=True)
            )
    # Tests that start an embedded Ray of their own (`serving train` runs) go right after the
    # demo's, before the session's Ray starts: two Rays at once on 2 cores start slowly, and beside
    # a module's replicas, too slowly.
    first = [item for item in items if item.get_closest_marker("e2e")]
    own_ray = [
        item
        for item in items
        if item.get_closest_marker("own_ray") and not item.get_closest_marker("e2e")
    ]
    chosen = {id(item) for item in first + own_ray}
    items[:] = first + own_ray + [item for item in items if id(item) not in chosen]
    # endpoint -> the module that uses it last, in the order the tests run: it deletes it
    last_user = {}
    for item in items:
        for name in getattr(item.module, "ENDPOINTS", ()):
            last_user[name] = item.nodeid.split("::")[0]
    config.stash[_LAST_USER] = last_user


@dataclass(frozen=True)
class EndpointServer:
    """The running endpoint server as the tests reach it: `client`, the SDK's Client (what a user
    calls: answers and the errors they raise, one attempt each, unsigned); `http`, plain HTTP for
    what a client would not send (other routes, malformed requests, a status code as it comes); its
    URL, its gRPC port's address and the CA that signed it."""

    url: str
    client: Client
    http: httpx.Client
    grpc_target: str
    grpc_ca: Path


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM files): the session's gRPC port
    serves TLS."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    names = [
        x509.DNSName("localhost"),
        x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1")),
    ]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert, key_file = folder / "grpc-cert.pem", folder / "grpc-key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    return cert, key_file


@pytest.fixture(scope="session")
def ray_server(tmp_path_factory, otlp_receiver):
    """Embedded Ray and the endpoint server, with no endpoints (the modules' `server` fixtures
    deploy them); its gRPC port serves TLS with a certificate of this session's; it traces to the
    session's OTLP receiver (`suite.otlp`)."""
    from serving.ray_wing import EmbeddedServer

    cert, key = self_signed_certificate(tmp_path_factory.mktemp("grpc-tls"))
    settings = ServerSettings(
        port=0,
        max_payload_mb=1.0,
        invocation_timeout_s=3.0,
        grpc_port=0,
        grpc_tls_cert=str(cert),
        grpc_tls_key=str(key),
    )
    # The gateway reads and writes it-async's objects with its own credentials: those of the
    # environment Ray starts with (the local S3 server accepts any).
    with pytest.MonkeyPatch.context() as environment:
        for key, value in {**AWS_TEST_ENVIRONMENT, **tracing_environment(otlp_receiver)}.items():
            environment.setenv(key, value)
        with EmbeddedServer(
            [], settings, num_cpus=2, wait=False, ready_timeout_s=READY_TIMEOUT_S
        ) as embedded:
            embedded.running = set()  # catalogue endpoints deployed now
            embedded.grpc_ca = cert
            yield embedded


def _small(specs: list[dict]) -> list[dict]:
    # ~35 replicas share the session's 2 logical CPUs: reserve a small share each.
    for spec in specs:
        for container in spec["Containers"]:
            container.setdefault("Resources", {"Cpus": 0.04})
    return specs


def _built(request, name: str, builder: Builder) -> dict:
    """`builder`'s spec for endpoint `name`, from the fixtures its parameters name (the module's or
    the session's)."""
    document = builder(
        **{
            parameter: request.getfixturevalue(parameter)
            for parameter in inspect.signature(builder).parameters
        }
    )
    assert document["EndpointName"] == name, (
        f"ENDPOINTS names {name!r}, its builder makes {document['EndpointName']!r}"
    )
    return document


@pytest.fixture(scope="module")
def server(request, ray_server):
    """The endpoint server with the endpoints this module names in ENDPOINTS, InService (or, if its
    builder `fails_to_start`, Failed)."""
    wanted: dict[str, Builder] | None = getattr(request.module, "ENDPOINTS", None)
    if not isinstance(wanted, dict):
        pytest.fail(
            f"{request.module.__name__} uses the endpoint server: name the endpoints it uses in ENDPOINTS "
            "(endpoint name -> the function that builds its spec)"
        )
    new = [name for name in wanted if name not in ray_server.running]
    if new:
        for document in _small([_built(request, name, wanted[name]) for name in new]):
            ray_server.deploy(parse_spec(document))
        ray_server.running.update(new)
        readiness = ray_server.wait_ready(new)
        expected = {name for name in new if getattr(wanted[name], "fails_to_start", False)}
        problems = readiness.pending + [name for name in readiness.failed if name not in expected]
        if problems:
            # a failed start fails this module only: the next ones start without it
            for name in new:
                ray_server.delete(name)
                ray_server.running.discard(name)
            pytest.fail(f"endpoints not ready after {READY_TIMEOUT_S} s: {readiness.explain()}")
    with (
        Client(ray_server.url, sign=False, retry=RetryPolicy.none(), timeout=30) as client,
        httpx.Client(base_url=ray_server.url, timeout=30) as http,
    ):
        yield EndpointServer(
            ray_server.url,
            client,
            http,
            f"127.0.0.1:{ray_server.settings.grpc_port}",
            ray_server.grpc_ca,
        )
    module = request.node.nodeid
    for name in wanted:
        if (
            request.config.stash[_LAST_USER].get(name, module) == module
            and name in ray_server.running
        ):
            ray_server.delete(name)
            ray_server.running.discard(name)
