"""The gateways that long-poll the registry, and which version of it each has applied: what
`applied_everywhere` answers before an update counts as routed everywhere."""

from __future__ import annotations

import threading
import time

# A gateway that has not asked for a snapshot for this long is gone: it no longer holds up
# `applied_everywhere` (its long poll asks at least every REGISTRY_WAIT_S, 10 s).
READER_SILENT_S = 25.0
READER_FORGOTTEN_S = 3600.0  # and after this long it is dropped from the table
SWEEP_S = 60.0


class GatewayReaders:
    """gateway -> (version applied, registry epoch, when it last asked); thread-safe (asked from
    Ray's threads and the snapshot feed's)."""

    def __init__(self) -> None:
        self._table: dict[str, tuple[int, str | None, float]] = {}
        self._swept = time.monotonic()
        self._lock = threading.Lock()

    def asked(self, reader: str, since: int, epoch: str | None) -> None:
        """A snapshot call: `reader` has applied version `since` of the registry process `epoch`.
        Forgotten readers are swept out at most every SWEEP_S: every gateway asks after every change,
        so a sweep per call would cost the registry gateways² per change."""
        now = time.monotonic()
        with self._lock:
            self._table[reader] = (since, epoch, now)
            if now - self._swept < SWEEP_S:
                return
            self._swept = now
            for gone in [
                r for r, (_, _, when) in self._table.items() if now - when > READER_FORGOTTEN_S
            ]:
                del self._table[gone]

    def left(self, reader: str) -> None:
        with self._lock:
            self._table.pop(reader, None)

    def applied(self, version: int, epoch: str) -> bool:
        """Whether every gateway heard from lately has applied `version` (or a later one) of
        `epoch`."""
        now = time.monotonic()
        with self._lock:
            return all(
                applied >= version and seen_epoch == epoch
                for applied, seen_epoch, when in self._table.values()
                if now - when < READER_SILENT_S
            )
