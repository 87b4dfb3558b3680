"""Each gateway's own counters (the requests it routed), shared through Ray's GCS key-value store,
so that the control plane's merge for a `GET /metrics` of any gateway counts the requests of every
gateway.

A gateway publishes its registry's exposition within PUBLISH_S of a request moving its series, so a
scrape sees the other gateways' request counters up to PUBLISH_S old (the scraped gateway sends its
own, current); with no request, the exposition is generated again only every REFRESH_S (the registry
polls, which move on their own, catch up then), and the last one is written again every HEARTBEAT_S,
as a sign of life. A gateway silent for STALE_S has stopped: its counters leave the sum, as a
restarted gateway's always have.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from ray.experimental import internal_kv

from serving.ray_wing.names import NAMESPACE

PUBLISH_S = 5.0
HEARTBEAT_S = 10.0
REFRESH_S = 60.0
STALE_S = 30.0
_PREFIX = b"gateway-metrics/"


class GatewayCounters:
    """Where the gateway `gateway` publishes its counters."""

    def __init__(self, gateway: str) -> None:
        self.key = _PREFIX + gateway.encode()
        self._text, self._written = b"", float("-inf")  # what was written last, when (monotonic)
        self._moves, self._generated = -1, float("-inf")  # the series' moves it showed, when

    def publish(self, moves: int, exposition: Callable[[], bytes]) -> None:
        """`moves`: the request series' moves so far (`invocations.series_moves`), read before
        `exposition` is called, which generates the registry's text only when it is due."""
        now = time.monotonic()
        if moves != self._moves or now - self._generated >= REFRESH_S:
            self._moves, self._generated = moves, now
            text = exposition()
            if text != self._text:
                self._write(text, now)
                return
        if now - self._written >= HEARTBEAT_S:
            self._write(self._text, now)

    def _write(self, text: bytes, now: float) -> None:
        value = json.dumps({"at": time.time(), "text": text.decode()}).encode()
        internal_kv._internal_kv_put(self.key, value, namespace=NAMESPACE)
        self._text, self._written = text, now


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
