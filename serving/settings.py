"""Server settings: read once at start-up from flags and `SERVING_*` environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServerSettings(BaseSettings):
    """How the endpoint server listens and what it enforces on every invocation."""

    model_config = SettingsConfigDict(env_prefix="SERVING_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="Address the endpoint HTTP server binds.")
    port: int = Field(8080, ge=0, le=65535, description="Port of the endpoint HTTP server.")
    max_payload_mb: float = Field(6.0, gt=0, description="Largest request body accepted, in MB (SageMaker: 6).")
    invocation_timeout_s: float = Field(60.0, gt=0, description="Longest time one invocation may take end to end.")
    container_host: str = Field(
        "127.0.0.1",
        description="Address container replicas bind their data port to; 'node' for the Ray node's IP (clusters).",
    )
    registry_poll_s: float = Field(0.25, gt=0, description="How often the router refreshes its replica table.")

    @property
    def max_payload_bytes(self) -> int:
        return int(self.max_payload_mb * 1_000_000)
