"""Each gateway's own counters (the requests it routed), shared through Ray's GCS key-value store,
so that the control plane's merge for a `GET /metrics` of any gateway counts the requests of every
gateway.

A gateway publishes its registry's exposition every PUBLISH_S, so a scrape sees the other gateways'
counters up to PUBLISH_S old (the scraped gateway sends its own, current); an unchanged exposition
(an idle gateway's) is written again only every HEARTBEAT_S, as a sign of life. A gateway silent for
STALE_S has stopped: its counters leave the sum, as a restarted gateway's always have.
"""

from __future__ import annotations

import json
import time

from ray.experimental import internal_kv

from serving.ray_wing.names import NAMESPACE

PUBLISH_S = 5.0
HEARTBEAT_S = 10.0
STALE_S = 30.0
_PREFIX = b"gateway-metrics/"


class GatewayCounters:
    """Where the gateway `gateway` publishes its counters."""

    def __init__(self, gateway: str) -> None:
        self.key = _PREFIX + gateway.encode()
        self._last: tuple[bytes, float] = (b"", float("-inf"))  # what was written, when (monotonic)

    def publish(self, exposition: bytes) -> None:
        text, written = self._last
        if exposition == text and time.monotonic() - written < HEARTBEAT_S:
            return
        value = json.dumps({"at": time.time(), "text": exposition.decode()}).encode()
        internal_kv._internal_kv_put(self.key, value, namespace=NAMESPACE)
        self._last = (exposition, time.monotonic())


def published() -> dict[str, str]:
    """Every live gateway's last exposition, by gateway; entries of gateways long gone are
    deleted."""
    now, texts = time.time(), {}
    for key in internal_kv._internal_kv_list(_PREFIX, namespace=NAMESPACE):
        value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
        if value is None:
            continue
        entry = json.loads(value)
        if now - entry["at"] < STALE_S:
            texts[key[len(_PREFIX) :].decode()] = entry["text"]
        elif now - entry["at"] > 20 * STALE_S:
            internal_kv._internal_kv_del(key, namespace=NAMESPACE)
    return texts
