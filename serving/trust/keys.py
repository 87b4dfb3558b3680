"""Capabilities derived from one cluster secret: hop keys, replica registrations, control writes.

Every key the project uses is an HMAC of the cluster's root secret (the Ray wing derives it from
Ray's own authentication token, which every trusted Ray process already holds and no container
process ever sees). So no key is ever handed around, stored in Ray's object store or an actor's
state, or written to disk by this project; a process either can derive a key or cannot.

- `hop_key(endpoint, container)`: the gateway signs each hop to that container's replicas with it;
  the container process verifies it (`trust.hops`). A container process knows only its own.
- `registration_proof(endpoint, container, url, version)`: what a replica shows the registry to put
  its data port under that container version; made by the replica's supervisor, never by the
  container process.
- `control_token()`: what the control plane (CLI, gateway, autoscaler) shows for registry writes.
- `feed_key()`: signs the registry's snapshot feed, both ways (`control.snapshot_feed`).
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = [
    "control_token",
    "derive",
    "feed_key",
    "hop_key",
    "http_control_token",
    "registration_proof",
    "verify",
]

_VERSION = b"serving/v1"


def derive(root: bytes, purpose: str, *parts: str) -> bytes:
    """A 32-byte key for `purpose` and `parts`, unambiguous whatever the parts contain."""
    message = b"\0".join(
        [_VERSION, purpose.encode(), *(part.encode("utf-8", "surrogatepass") for part in parts)]
    )
    return hmac.new(root, message, hashlib.sha256).digest()


def hop_key(root: bytes, endpoint: str, container: str) -> bytes:
    return derive(root, "hop", endpoint, container)


def registration_proof(
    root: bytes, endpoint: str, container: str, url: str, version: str = ""
) -> str:
    return derive(root, "register", endpoint, container, version, url).hex()


def control_token(root: bytes) -> str:
    return derive(root, "control").hex()


def feed_key(root: bytes) -> bytes:
    return derive(root, "registry-feed")


def http_control_token(root: bytes) -> str:
    """What `serving apply` / `serving delete` present to the gateway's control routes."""
    return derive(root, "http-control").hex()


def verify(expected: str, presented: object) -> bool:
    """Constant-time comparison of a token or proof with what was presented (any type)."""
    return isinstance(presented, str) and hmac.compare_digest(expected.encode(), presented.encode())
