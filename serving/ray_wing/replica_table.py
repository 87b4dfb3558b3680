"""The registry's replica table: each replica's data port under its (endpoint, container, version),
written through to the GCS store and kept while its heartbeats come."""

from __future__ import annotations

import time

from serving.ray_wing.kv_store import KvStore
from serving.ray_wing.names import REPLICA_TTL_S
from serving.trust import keys

_KV_REPLICA = b"replica/"


class ReplicaTable:
    """Who registered which data port, and when each was last heard from; the registry's lock is
    held around every change."""

    def __init__(self, store: KvStore, root_secret: bytes) -> None:
        self._store = store
        self._root_secret = root_secret
        self.by_url: dict[str, tuple[str, str, str]] = {}  # url -> (endpoint, container, version)
        # url -> the container host that supervises it (`container_host.HOST_PREFIX` + node), for a
        # hosted replica: they die together
        self.holders: dict[str, str] = {}
        self._seen: dict[str, float] = {}  # url -> last heartbeat (monotonic)
        now = time.monotonic()
        for url, stored in store.load(_KV_REPLICA).items():
            # heartbeats confirm them, or they expire
            self.by_url[url], self._seen[url] = tuple(stored[:3]), now
            if len(stored) > 3 and stored[3]:
                self.holders[url] = stored[3]

    def proven(self, key: tuple[str, str, str], url: str, proof: object) -> bool:
        """Whether `proof` is the one made for exactly this replica (`keys.registration_proof`)."""
        endpoint, container, version = key
        return keys.verify(
            keys.registration_proof(self._root_secret, endpoint, container, url, version), proof
        )

    def owned(self, url: str, proof: object) -> bool:
        """Whether `proof` is the registered replica's own (it may deregister itself)."""
        key = self.by_url.get(url)
        return key is not None and self.proven(key, url, proof)

    def heard(self, url: str, key: tuple[str, str, str], holder: str | None = None) -> bool:
        """A registration or heartbeat (`holder`: its container host, if hosted); whether the table
        changed."""
        self._seen[url] = time.monotonic()
        if self.by_url.get(url) == key and self.holders.get(url) == holder:
            return False
        self.by_url[url] = key
        if holder:
            self.holders[url] = holder
        else:
            self.holders.pop(url, None)
        self._store.put(_KV_REPLICA, url, [*key, holder])
        return True

    def forget(self, url: str) -> bool:
        """Remove a replica; whether it was there."""
        self._seen.pop(url, None)
        self.holders.pop(url, None)
        if self.by_url.pop(url, None) is None:
            return False
        self._store.delete(_KV_REPLICA, url)
        return True

    def forget_held(self, holder: str) -> bool:
        """Remove every replica a container host supervised (it died, and they with it); whether
        there was any."""
        return [
            self.forget(url) for url, held in list(self.holders.items()) if held == holder
        ] != []

    def forget_endpoint(self, name: str) -> bool:
        """Remove every replica of an endpoint; whether there was any."""
        return [self.forget(url) for url, key in list(self.by_url.items()) if key[0] == name] != []

    def expire(self) -> bool:
        """Remove the replicas not heard from for REPLICA_TTL_S; whether there was any."""
        now = time.monotonic()
        return [
            self.forget(url) for url, seen in list(self._seen.items()) if now - seen > REPLICA_TTL_S
        ] != []
