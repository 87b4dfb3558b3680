"""The registry's replica table: a container host's death takes exactly its replicas out (a
registration names the host that supervises it), and what it holds survives a registry restart
through the key-value store (a dict stands in for Ray's GCS here)."""

from __future__ import annotations

from serving.ray_wing.replica_table import ReplicaTable

ROOT = b"r" * 32


class _Store:
    def __init__(self) -> None:
        self.values: dict[str, object] = {}

    def put(self, prefix: bytes, key: str, value: object) -> None:
        self.values[key] = value

    def delete(self, prefix: bytes, key: str) -> None:
        self.values.pop(key, None)

    def load(self, prefix: bytes) -> dict:
        return dict(self.values)


def _table(store: _Store) -> ReplicaTable:
    return ReplicaTable(store, ROOT)  # type: ignore[arg-type]


def test_a_dead_host_takes_out_its_own_replicas_only() -> None:
    table = _table(_Store())
    key = ("e", "c", "v1")
    table.heard("http://10.0.0.1:1", key, "host:a")
    table.heard("http://10.0.0.1:2", key, "host:a")
    table.heard("http://10.0.0.2:1", key, "host:b")
    table.heard("http://10.0.0.1:3", key)  # a Serve replica: no host holds it
    assert table.forget_held("host:a")
    assert sorted(table.by_url) == ["http://10.0.0.1:3", "http://10.0.0.2:1"]
    assert not table.forget_held("host:a")
    assert not table.heard("http://10.0.0.2:1", key, "host:b")  # a heartbeat changes nothing


def test_holders_survive_a_registry_restart() -> None:
    store = _Store()
    key = ("e", "c", "v1")
    _table(store).heard("http://10.0.0.1:1", key, "host:a")
    store.values["http://10.0.0.1:9"] = list(key)  # stored before registrations named a host
    restarted = _table(store)
    assert restarted.by_url == {"http://10.0.0.1:1": key, "http://10.0.0.1:9": key}
    assert restarted.forget_held("host:a")
    assert list(restarted.by_url) == ["http://10.0.0.1:9"]
