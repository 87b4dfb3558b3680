"""Server settings: read once at start-up from flags and `SERVING_*` environment variables."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server reachable from this machine only."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # any other host name may resolve to anything
        return False


class ServerSettings(BaseSettings):
    """How the endpoint server listens and what it enforces on every invocation."""

    model_config = SettingsConfigDict(env_prefix="SERVING_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="Address the endpoint HTTP server binds.")
    port: int = Field(8080, ge=0, le=65535, description="Port of the endpoint HTTP server.")
    max_payload_mb: float = Field(6.0, gt=0, description="Largest request body accepted, in MB (SageMaker: 6).")
    invocation_timeout_s: float = Field(60.0, gt=0, description="Longest time one invocation may take end to end.")
    container_host: str = Field(
        "127.0.0.1",
        description="Address container replicas bind their data port to; 'node' for the Ray node's IP. Honoured "
                    "only on a cluster (--address): the embedded server always binds 127.0.0.1.",
    )
    sandbox: Literal["auto", "required", "off"] = Field(
        "auto",
        description="Confinement of container processes (docs/security.md): 'auto' applies every layer the kernel "
                    "offers (Landlock, seccomp) and warns when one is missing, 'required' refuses to start a "
                    "container without them, 'off' runs tenant code unconfined (still without Ray credentials).",
    )
    registry_poll_s: float = Field(0.25, gt=0, description="How often the router refreshes its replica table.")
    region: str = Field(
        "us-east-1", pattern=r"^[a-z0-9-]{1,32}$",
        description="Region in endpoint ARNs and the one SigV4 credential scopes must name (clients' region_name).",
    )
    account_id: str = Field("000000000000", pattern=r"^\d{12}$", description="Account id in endpoint ARNs.")
    allow_anonymous: bool = Field(
        False,
        description="Serve endpoints without AccessControl to anyone even when `host` is not a loopback address.",
    )

    @property
    def max_payload_bytes(self) -> int:
        return int(self.max_payload_mb * 1_000_000)

    @property
    def anonymous_allowed(self) -> bool:
        """Whether endpoints without AccessControl may be invoked without credentials."""
        return self.allow_anonymous or is_loopback(self.host)
