"""Authenticated gateway -> container hops: an HMAC over the request under the container's key.

The gateway signs every request it sends to a container replica's data port; the container
process refuses (403) anything unsigned, signed with another container's key, altered, or older
than `MAX_SKEW_S`. The signature covers the method, the path, a timestamp, the SHA-256 of the body
and every header the container acts on, so a captured hop cannot be re-aimed at another model or
given another body. The key (`keys.hop_key`) is the container's own: a container process that
knows it can call only itself. No web framework here: the request arrives as plain values.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping

from serving import protocol
from serving.protocol import HOP_DATE_HEADER as DATE_HEADER
from serving.protocol import HOP_SIGNATURE_HEADER as SIGNATURE_HEADER

__all__ = ["DATE_HEADER", "MAX_SKEW_S", "SIGNATURE_HEADER", "HopAuthError", "sign", "verify"]

MAX_SKEW_S = 60  # the gateway and its replicas share clocks (one machine) or NTP (a cluster)
# Headers a container acts on: each is covered, present or not (an absent one as empty).
SIGNED_HEADERS = (
    "content-type",
    "accept",
    protocol.TARGET_MODEL.lower(),
    protocol.CUSTOM_ATTRIBUTES.lower(),
    protocol.INFERENCE_ID.lower(),
    protocol.HOP_STREAM_HEADER,  # a captured hop cannot be turned into a stream or back
    protocol.TRACEPARENT,  # a container trusts (and logs) only the trace context the gateway sent
)


class HopAuthError(Exception):
    """A hop that is not from the gateway (or not for this container); the message says which check
    failed."""


def _message(method: str, path: str, stamp: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    lowered = {key.lower(): value for key, value in headers.items()}
    lines = [method.upper(), path, stamp, hashlib.sha256(body).hexdigest()]
    lines += [lowered.get(name, "") for name in SIGNED_HEADERS]
    return "\n".join(lines).encode("utf-8", "surrogateescape")


def sign(
    key: bytes,
    method: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    clock: Callable[[], float] = time.time,
) -> dict[str, str]:
    """The two headers to add to a hop (`headers`: what it sends, names in any case)."""
    stamp = str(int(clock()))
    signature = hmac.new(
        key, _message(method, path, stamp, body, headers), hashlib.sha256
    ).hexdigest()
    return {DATE_HEADER: stamp, SIGNATURE_HEADER: signature}


def verify(
    key: bytes,
    method: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    clock: Callable[[], float] = time.time,
) -> None:
    """Raise HopAuthError unless the request carries a fresh signature by `key` (`headers`:
    case-insensitive)."""
    stamp, signature = headers.get(DATE_HEADER), headers.get(SIGNATURE_HEADER)
    if not stamp or not signature:
        raise HopAuthError("unsigned request: only the endpoint's gateway may call a container")
    if not stamp.isdigit() or abs(clock() - int(stamp)) > MAX_SKEW_S:
        raise HopAuthError("hop signature expired or from the future")
    expected = hmac.new(
        key, _message(method, path, stamp, body, headers), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise HopAuthError("hop signature does not match")
