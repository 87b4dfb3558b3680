"""The registry's state in Ray's GCS key-value store, as JSON: it outlives the registry actor and
the gateway."""

from __future__ import annotations

import json
from typing import Any

from serving.ray_wing.names import NAMESPACE

__all__ = ["KvStore"]


class KvStore:
    """The registry's state in Ray's GCS key-value store: it outlives the registry actor and the
    gateway."""

    def put(self, prefix: bytes, key: str, value: Any) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(
            prefix + key.encode(), json.dumps(value).encode(), overwrite=True, namespace=NAMESPACE
        )

    def delete(self, prefix: bytes, key: str) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_del(prefix + key.encode(), namespace=NAMESPACE)

    # each key's JSON document, whatever its owner stored
    def load(self, prefix: bytes) -> dict[str, Any]:
        from ray.experimental import internal_kv

        found = {}
        for key in internal_kv._internal_kv_list(prefix, namespace=NAMESPACE):
            value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
            if value is not None:
                found[key[len(prefix) :].decode()] = json.loads(value)
        return found
