"""The control-plane API's state: models, endpoint configs, endpoints, scalable targets, scaling
policies, and CloudWatch's alarms with their history.

One SQLite database (stdlib `sqlite3`), one row per resource holding its JSON document, written in a
transaction per change, so a server that stops mid-call keeps either the old document or the new
one. `serving up` / `serving server` keep it in `~/.serving/state-<port>.db` (`--state` moves it);
restarting the server on the same file brings every endpoint back. It says what code runs where, and
holds the containers' Environment (secrets sealed, `sealed`): it is this user's own, readable by no
one else, in a folder no other user can write, and opened through no symbolic link (`state_file`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from serving.cloudwatch.alarms import AlarmDocument, AlarmHistory
from serving.sagemaker_api.state_file import connect_state
from serving.sagemaker_api.stored import (
    EndpointConfigDocument,
    EndpointDocument,
    ModelDocument,
    ScalableTargetDocument,
    ScalingPolicyDocument,
)

__all__ = ["KINDS", "ApiState", "Table"]

D = TypeVar("D")
Row = dict[str, Any]  # one stored document, of whichever kind: its kind's Table types it

KINDS = (
    "model",
    "endpoint-config",
    "endpoint",
    "scalable-target",
    "scaling-policy",
    "alarm",
    "alarm-history",
)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS resources (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    document TEXT NOT NULL,
    PRIMARY KEY (kind, name)
)
"""


class Table(Generic[D]):
    """One kind's documents, typed: the rows of `state` whose kind is `kind`."""

    def __init__(self, state: ApiState, kind: str) -> None:
        self.state, self.kind = state, kind

    def get(self, name: str) -> D | None:
        return cast("D | None", self.state.get(self.kind, name))

    def all(self) -> list[D]:
        return cast("list[D]", self.state.all(self.kind))

    def put(self, name: str, document: D) -> None:
        self.state.put(self.kind, name, cast(Row, document))

    def delete(self, name: str) -> bool:
        return self.state.delete(self.kind, name)


class ApiState:
    """Resources by kind and name, and a typed table per kind; `path` None keeps them in memory
    (gone with the process)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = str(path) if path is not None else ":memory:"
        self._lock = threading.Lock()
        if path is None:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        # PrivateFileError naming a link or another user's file at the state path or beside it
        else:
            self._db = connect_state(path)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_SCHEMA)
        self.models = Table[ModelDocument](self, "model")
        self.endpoint_configs = Table[EndpointConfigDocument](self, "endpoint-config")
        self.endpoints = Table[EndpointDocument](self, "endpoint")
        self.scalable_targets = Table[ScalableTargetDocument](self, "scalable-target")
        self.scaling_policies = Table[ScalingPolicyDocument](self, "scaling-policy")
        # CloudWatch's, typed where they are evaluated
        self.alarms = Table[AlarmDocument](self, "alarm")
        self.alarm_history = Table[AlarmHistory](self, "alarm-history")

    def get(self, kind: str, name: str) -> Row | None:
        with self._lock:
            row = self._db.execute(
                "SELECT document FROM resources WHERE kind=? AND name=?", (kind, name)
            ).fetchone()
        return json.loads(row[0]) if row else None

    def all(self, kind: str) -> list[Row]:
        with self._lock:
            rows = self._db.execute(
                "SELECT document FROM resources WHERE kind=? ORDER BY name", (kind,)
            ).fetchall()
        return [json.loads(row[0]) for row in rows]

    def put(self, kind: str, name: str, document: Row) -> None:
        text = json.dumps(document, sort_keys=True)
        with self._lock:
            self._db.execute(
                "INSERT INTO resources(kind, name, document) VALUES(?, ?, ?) "
                "ON CONFLICT(kind, name) DO UPDATE SET document=excluded.document",
                (kind, name, text),
            )

    def delete(self, kind: str, name: str) -> bool:
        with self._lock:
            cursor = self._db.execute("DELETE FROM resources WHERE kind=? AND name=?", (kind, name))
        return cursor.rowcount > 0

    def close(self) -> None:
        with self._lock:
            self._db.close()


def default_state_file(port: int) -> Path:
    """Where `serving up` / `serving server` on `port` keep the API's state unless `--state` says
    otherwise."""
    base = os.environ.get("SERVING_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".serving")
    return Path(base) / f"state-{port}.db"
