"""The registry's snapshot feed server (`control.snapshot_feed`): where it binds, and its lifetime.

The registry opens it when `serving up` says where (`Registry.open_feed`: where data ports bind, so the
head node's address on a cluster and loopback for the embedded server), and a restarted registry opens
it again from the key-value store, on a new port that its snapshots name. Not opened, closed
(`--no-registry-feed`) or failed to bind: the gateways long-poll through Ray, as before the feed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import ray

from serving.control.records import Snapshot
from serving.control.snapshot_feed import FeedServer
from serving.ray_wing.kv_store import KvStore
from serving.trust import keys

logger = logging.getLogger("serving.ray_wing.registry_feed")

_KV_FEED = b"feed/"


class RegistryFeed:
    """The feed's server inside the registry's process, once open."""

    def __init__(
        self,
        root: bytes,
        current: Callable[[], tuple[object, Snapshot]],
        asked: Callable[[str, int, str | None], None],
        store: KvStore,
    ) -> None:
        self._store = store
        self._key, self._current, self._asked = keys.feed_key(root), current, asked
        self._server: FeedServer | None = None
        self.url: str | None = None  # what the snapshots name: where gateways reach it

    def reopen(self) -> None:
        """A restarted registry: serve where the last one did."""
        host = self._store.load(_KV_FEED).get("host")
        if host is not None:
            self._serve(host)

    def open(self, host: str | None) -> str | None:
        """Serve the feed on `host` ("node": this Ray node's address) at a free port, or no longer
        (None), and remember it for a restarted registry; its URL, or None (the gateways use Ray)."""
        if host is None:
            self.close()
            self._store.delete(_KV_FEED, "host")
            return None
        url = self._serve(host)
        if url is not None:
            self._store.put(_KV_FEED, "host", host)
        return url

    def _serve(self, host: str) -> str | None:
        if self._server is not None:
            return self.url
        node = ray.util.get_node_ip_address()
        address = node if host == "node" else host
        try:
            server = FeedServer(self._key, self._current, self._asked, address)
        except OSError as error:
            logger.warning(
                "the snapshot feed cannot bind %s (%s): gateways use Ray", address, error
            )
            return None
        self._server = server
        # bound to every interface: the node's own address is the one other nodes reach
        advertised = node if address in ("0.0.0.0", "::", "") else address
        self.url = (
            f"http://[{advertised}]:{server.port}"
            if ":" in advertised
            else f"http://{advertised}:{server.port}"
        )
        return self.url

    def changed(self) -> None:
        if self._server is not None:
            self._server.changed()

    def close(self) -> None:
        """Stop serving (waiting requests end; their gateways ask Ray next)."""
        if self._server is not None:
            self._server.stop()
            self._server = self.url = None
