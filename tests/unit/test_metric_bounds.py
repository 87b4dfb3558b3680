"""What a container process (tenant code) reports cannot grow its supervisor without bound: the
supervisor may serve other containers (`ray_wing.container_host`)."""

from __future__ import annotations

import http.server
import threading

import pytest

from serving.model_server import supervisor
from serving.model_server.events import DRAIN_MOST, EventLog
from serving.ray_wing.replica_metrics import OTHER_MODELS, ModelLabels


def test_model_labels_stop_at_their_bound_and_keep_the_names_seen():
    labels = ModelLabels(most=3)
    assert [labels.label(name) for name in ("a", "b", "c")] == ["a", "b", "c"]
    assert labels.label("d") == OTHER_MODELS
    assert labels.label("made-up-1") == OTHER_MODELS
    assert labels.label("b") == "b"  # a model labelled before keeps its series


def test_one_drain_carries_at_most_its_share_and_the_rest_waits():
    log = EventLog()
    for _ in range(DRAIN_MOST + 7):
        log.model_latency(0.001)
    assert len(log.drain()) == DRAIN_MOST
    assert len(log.drain()) == 7
    assert log.drain() == []


class _Huge(http.server.BaseHTTPRequestHandler):
    """A container process whose stats answer is twice the bound (tenant code can answer anything:
    it could as well never end)."""

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        try:
            for _ in range(32):
                self.wfile.write(b"[" * 65536)
        except OSError:
            pass

    def log_message(self, *args):
        pass


def test_a_stats_answer_past_its_bound_is_refused_not_read(monkeypatch):
    monkeypatch.setattr(supervisor, "MAX_STATS_BYTES", 1024 * 1024)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Huge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    process = supervisor.ContainerProcess.__new__(supervisor.ContainerProcess)
    process.url = f"http://127.0.0.1:{server.server_address[1]}"
    process.config = type("Config", (), {"hop_key": b"k" * 32})()
    try:
        with pytest.raises(RuntimeError, match="stats answer over"):
            process.stats()
    finally:
        server.shutdown()
        server.server_close()
