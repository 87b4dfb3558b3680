"""What a hop to a container brings back: its answer whole, or its bytes as they arrive, and the
errors for a connection lost on the way (the sending itself: `transport`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp

from serving.errors import ModelError

if TYPE_CHECKING:
    from serving.gateway.replica_choice import Replica

__all__ = ["HopResponse", "HopStream", "StreamBroken", "lost_connection"]


@dataclass(frozen=True)
class HopResponse:
    """What a container answered (any status)."""

    status: int
    body: bytes
    content_type: str | None
    custom_attributes: str | None
    model_resolved: bool = False  # a MultiModel container answered about a model it resolved
    # an error answer the container marks as the platform's refusal, not its model's
    platform: bool = False
    log_stream: str | None = None  # where the container's logs are (on its error answers)
    # a streamed answer's body, as it arrives (`body` is then empty)
    chunks: HopStream | None = None


class StreamBroken(Exception):
    """The connection to a container broke while its answer was streaming."""


class HopStream:
    """A streamed answer's bytes as they arrive. Its replica counts as busy and its connection stays
    open until `close()` (idempotent; also when the bytes run out or the connection breaks)."""

    def __init__(self, response: aiohttp.ClientResponse, replica: Replica) -> None:
        self._response = response
        self._replica: Replica | None = replica

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._response.content.iter_any():
                yield data
        except aiohttp.ClientError as error:
            raise StreamBroken(str(error) or type(error).__name__) from None
        finally:
            self.close()

    def close(self) -> None:
        if self._replica is not None:
            self._replica.in_flight -= 1
            self._replica = None
            # not back to the pool: a stream left unfinished must end at the container too
            self._response.close()


def lost_connection(container: str, error: Exception) -> ModelError:
    """The error for a connection to `container` lost before its answer was whole."""
    return ModelError(
        f"connection to container {container} was lost during the invocation ({type(error).__name__})",
        container=container,
        original_status=502,
        original_message=str(error) or type(error).__name__,
    )
