"""The InvokeEndpointAsync journal on Ray's real GCS key-value store: a silent gateway's job is taken
over by one live gateway, under its own name, and forgotten once finished.

The journals here use a namespace of their own, so that the session's running gateway (which takes
over orphans of the real namespace) cannot race the test for them.
"""

from __future__ import annotations

import json

import pytest

from serving.gateway.async_jobs import JobEntry
from serving.ray_wing import async_journal
from serving.ray_wing.async_journal import GcsJournal

pytestmark = pytest.mark.integration


def _entry(inference_id: str) -> JobEntry:
    return {
        "endpoint": "it-journal",
        "chain": ["only"],
        "target_model": None,
        "variant": "AllTraffic",
        "inference_id": inference_id,
        "source": None,
        "body": "aGk=",
        "headers": {"content-type": "application/json"},
        "output": ["bucket", f"answers/{inference_id}.out"],
        "failure": ["bucket", f"failures/{inference_id}-error.out"],
        "s3_endpoint_url": None,
        "admitted_at": 1.0,
        "ttl": 60,
        "timeout": 5.0,
    }


def test_a_silent_gateways_job_is_taken_over_once_under_the_new_owners_name(
    ray_server, monkeypatch
):
    from ray.experimental import internal_kv

    namespace = "serving-test-async-journal"
    monkeypatch.setattr(async_journal, "NAMESPACE", namespace)
    gone, live, other = GcsJournal("gone"), GcsJournal("live"), GcsJournal("other")
    gone.record("job-1", _entry("one"))  # `gone` never beats: silent from the start
    live.beat()
    other.beat()

    taken = live.take_orphans()
    assert [(entry["key"], entry["owner"], entry["inference_id"]) for entry in taken] == [
        ("job-1", "gone", "one")
    ]
    stored = json.loads(internal_kv._internal_kv_get(b"async-job/job-1", namespace=namespace))
    assert stored["owner"] == "live" and stored["key"] == "job-1"
    assert {k: v for k, v in stored.items() if k not in ("key", "owner")} == _entry("one")
    # its new owner is alive: no other gateway takes it, nor does the new owner take it twice
    assert other.take_orphans() == [] and live.take_orphans() == []

    live.remove("job-1")
    assert internal_kv._internal_kv_get(b"async-job/job-1", namespace=namespace) is None
    assert internal_kv._internal_kv_list(b"async-claim/job-1/", namespace=namespace) == []
