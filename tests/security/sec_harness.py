"""Helpers of the security tests: a real gateway on 127.0.0.1, raw-socket clients, SigV4 signing.

The gateway is what `serving.ray_wing.gateway.Gateway` runs, without Ray: a Router's routes in
Starlette behind the invocation hot path (`serving_app`), served by a BackgroundServer whose limits
come from the same ServerSettings. Containers are tiny ASGI apps on their own loopback ports. Run as
a script, this module starts such a gateway in a process of its own (so that its memory can be
measured alone), prints its URL and serves until its stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from starlette.applications import Starlette
from starlette.types import ASGIApp

from serving.access.decision import EndpointAccess
from serving.access.identities import load_identities
from serving.gateway.router import EndpointRoute, Router
from serving.gateway.transport import ContainerTransport
from serving.http.responses import serving_app
from serving.http.server import BackgroundServer, HttpLimits
from serving.settings import ServerSettings

API_KEY = "sec-tests-bearer-key-0001"
DENIED_KEY = "sec-tests-key-of-nothing-0001"  # a known caller whose policy allows no endpoint here
KEY_ID, SECRET = "AKIASECTESTS00001", "sec-tests-secret-access-key-0001"
REGION = "us-east-1"
TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"
ALLOW_ALL = {
    "Version": "2012-10-17",
    "Statement": [
        {"Sid": "All", "Effect": "Allow", "Action": "sagemaker:InvokeEndpoint", "Resource": "*"}
    ],
}


def write_identities(folder: Path) -> Path:
    """An identities file with a SigV4 caller and a bearer caller allowed everything, and a bearer
    caller allowed nothing here."""
    (folder / "allow-all.json").write_text(json.dumps(ALLOW_ALL))
    elsewhere = {
        **ALLOW_ALL,
        "Statement": [
            {**ALLOW_ALL["Statement"][0], "Resource": "arn:aws:sagemaker:*:*:endpoint/elsewhere"}
        ],
    }
    (folder / "allow-elsewhere.json").write_text(json.dumps(elsewhere))
    (folder / "identities.yaml").write_text(
        yaml.safe_dump(
            {
                "Identities": [
                    {
                        "Principal": "signer",
                        "AccessKeyId": KEY_ID,
                        "SecretAccessKey": SECRET,
                        "PolicyDocuments": ["allow-all.json"],
                    },
                    {
                        "Principal": "bearer",
                        "ApiKey": API_KEY,
                        "PolicyDocuments": ["allow-all.json"],
                    },
                    {
                        "Principal": "denied",
                        "ApiKey": DENIED_KEY,
                        "PolicyDocuments": ["allow-elsewhere.json"],
                    },
                ]
            }
        )
    )
    return folder / "identities.yaml"


async def echo_container(scope: dict, receive: Any, send: Any) -> None:
    """A container data port that answers every POST with its body."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def sleepy_container(seconds: float):
    """A container data port that answers only after `seconds` (longer than an invocation
    timeout)."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await echo_container(scope, receive, send)
            return
        await asyncio.sleep(seconds)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def routes(identities: Path, settings: ServerSettings) -> list[EndpointRoute]:
    """`secure` (AccessControl), `open` (anonymous) and `mm` (anonymous, MultiModel), one container
    each."""
    access = EndpointAccess(
        load_identities(identities), region=settings.region, account_id=settings.account_id
    )
    return [
        EndpointRoute("secure", "Direct", ("echo",), access=access),
        EndpointRoute("open", "Direct", ("echo",)),
        EndpointRoute("mm", "Direct", ("mm",), multi_model=frozenset({"mm"})),
    ]


class Stack:
    """Gateways and containers on loopback ports, stopped at the end."""

    def __init__(self) -> None:
        self.servers: list[BackgroundServer] = []

    def serve(self, app: Any, limits: HttpLimits = HttpLimits()) -> str:
        server = BackgroundServer(app, "127.0.0.1", 0, limits)
        self.servers.append(server)
        assert server.wait_started(), "server did not start"
        return server.url

    def gateway(
        self, identities: Path, table: dict[tuple[str, str], list[str]], **settings: Any
    ) -> str:
        """A gateway as serving.ray_wing.gateway builds it, with `settings` (ServerSettings fields)
        for its router and server."""
        server_settings = ServerSettings(**settings)
        app, _ = gateway_app(identities, table, server_settings)
        return self.serve(app, HttpLimits.from_settings(server_settings))

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()
        self.servers.clear()


def gateway_app(
    identities: Path, table: dict[tuple[str, str], list[str]], settings: ServerSettings
) -> tuple[ASGIApp, Router]:
    transport = ContainerTransport(default_limit=128)
    router = Router(settings, transport)
    router.endpoints = {route.name: route for route in routes(identities, settings)}
    transport.update(table)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await transport.start()
        try:
            yield
        finally:
            await transport.close()

    return serving_app(router.routes(), lifespan=lifespan, hot=router.hot_route()), router


# --- raw HTTP over loopback -----------------------------------------------------------------------


def connect(url: str, timeout: float = 10.0) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=timeout)


def request_head(url: str, path: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """Request line and headers of a POST, Host first, as a client would send them."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {urlsplit(url).netloc}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def code(self) -> str | None:
        """The `__type` of an error in the documented shape (and its x-amzn-ErrorType header
        agrees)."""
        document = json.loads(self.body)
        assert self.headers.get("x-amzn-errortype") == document["__type"], (self.headers, document)
        return document["__type"]

    @property
    def message(self) -> str:
        return json.loads(self.body)["message"]


def read_answer(sock: socket.socket, timeout: float = 10.0) -> Answer:
    """The HTTP response on `sock` (raises socket.timeout if none comes within `timeout`)."""
    sock.settimeout(timeout)
    response = http.client.HTTPResponse(sock)
    response.begin()
    body = response.read()
    return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, body)


def wait_closed(sock: socket.socket, timeout: float) -> float | None:
    """Seconds until the server closes `sock` (EOF or reset), reading and dropping anything it
    sends; None if it is still open after `timeout`."""
    started = time.monotonic()
    sock.settimeout(0.05)
    while time.monotonic() - started < timeout:
        try:
            if not sock.recv(65536):
                return time.monotonic() - started
        except TimeoutError:
            continue
        except OSError:  # reset
            return time.monotonic() - started
    return None


def sigv4_headers(
    url: str,
    path: str,
    body: bytes,
    key_id: str = KEY_ID,
    secret: str = SECRET,
    extra: dict[str, str] | None = None,
) -> list[tuple[str, str]]:
    """The headers boto3 would send for this request, signed with botocore's own SigV4 (Host left
    out)."""
    request = AWSRequest(
        method="POST",
        url=url + path,
        data=body,
        headers={"Content-Type": "application/json", **(extra or {})},
    )
    SigV4Auth(Credentials(key_id, secret), "sagemaker", REGION).add_auth(request)
    return [(name, value) for name, value in request.headers.items()]


def vm_rss(pid: int) -> int:
    """Resident set size of process `pid`, in bytes (VmRSS of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def main() -> None:
    """Child-process gateway: argv[1] is JSON {"identities": path, "settings": {...}}; prints the
    URL."""
    config = json.loads(sys.argv[1])
    settings = ServerSettings(**config["settings"])
    # a port nothing listens on: no request of the memory test reaches a container
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    app, _ = gateway_app(
        Path(config["identities"]), {("secure", "echo"): [dead], ("open", "echo"): [dead]}, settings
    )
    stack = Stack()
    print(stack.serve(app, HttpLimits.from_settings(settings)), flush=True)
    sys.stdin.read()
    stack.stop()


if __name__ == "__main__":
    main()
