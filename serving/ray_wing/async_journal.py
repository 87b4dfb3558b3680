"""InvokeEndpointAsync jobs admitted and unfinished, in Ray's GCS key-value store: they outlive any
gateway.

Each gateway writes a heartbeat under its own id every HEARTBEAT_S. A job whose gateway has been
silent for OWNER_SILENT_S is an orphan: the first gateway to claim it (a put that succeeds only if
the claim is new) runs it, so it is run by one gateway only (`gateway.async_invocations` checks
first that its answer was not written).
"""

from __future__ import annotations

import json
import time

from ray.experimental import internal_kv

from serving.gateway.async_jobs import JobEntry, TakenEntry
from serving.ray_wing.names import NAMESPACE

HEARTBEAT_S = 2.0
# a gateway this long without a heartbeat is gone (Serve restarts one within seconds)
OWNER_SILENT_S = 10.0

_JOB, _OWNER, _CLAIM = b"async-job/", b"async-owner/", b"async-claim/"


class GcsJournal:
    """`gateway.async_invocations.Journal` over Ray's GCS key-value store, for the gateway
    `owner`."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def beat(self) -> None:
        internal_kv._internal_kv_put(
            _OWNER + self.owner.encode(), str(time.time()).encode(), namespace=NAMESPACE
        )

    def record(self, key: str, entry: JobEntry) -> None:
        value = json.dumps({**entry, "key": key, "owner": self.owner}).encode()
        internal_kv._internal_kv_put(_JOB + key.encode(), value, namespace=NAMESPACE)

    def remove(self, key: str) -> None:
        internal_kv._internal_kv_del(_JOB + key.encode(), namespace=NAMESPACE)
        internal_kv._internal_kv_del(
            _CLAIM + key.encode() + b"/", del_by_prefix=True, namespace=NAMESPACE
        )

    def take_orphans(self) -> list[TakenEntry]:
        now, silent, taken = time.time(), {}, []
        for stored in internal_kv._internal_kv_list(_JOB, namespace=NAMESPACE):
            value = internal_kv._internal_kv_get(stored, namespace=NAMESPACE)
            if value is None:
                continue  # finished meanwhile
            entry: TakenEntry = json.loads(value)
            owner = entry["owner"]
            if owner == self.owner:
                continue
            if owner not in silent:
                beat = internal_kv._internal_kv_get(_OWNER + owner.encode(), namespace=NAMESPACE)
                silent[owner] = beat is None or now - float(beat) > OWNER_SILENT_S
            if not silent[owner]:
                continue
            claim = _CLAIM + entry["key"].encode() + b"/" + owner.encode()
            if internal_kv._internal_kv_put(
                claim, self.owner.encode(), overwrite=False, namespace=NAMESPACE
            ):
                continue  # the claim existed: another gateway took it
            self.record(entry["key"], entry)  # now under this gateway's name
            taken.append(entry)
        return taken
