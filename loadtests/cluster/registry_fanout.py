"""The control plane at a hundred nodes: the real registry actor, N simulated gateways long-polling it
(`registry_readers`, several processes), one change a second; the gateways' long polls over the registry's
snapshot feed (`control.snapshot_feed`, the default) or through Ray (`--no-registry-feed`, the design before it).

The change is the control plane's publish of the API's routing (`publish_api`, what an `UpdateEndpoint`'s
step does), over a registry that holds the fifteen containers of `examples/fifteen.yaml` as an endpoint
record (its reconcile loop stopped: nothing is deployed). For each change: when it was made, and when
each reader had it, so `applied_everywhere` is the last reader's arrival. The registry's CPU (its process,
/proc) while changes come and while nothing changes; the GCS server's; the snapshot's size; the key-value
writes the readers made as gateways would.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.cluster.cluster import ROOT
from loadtests.cluster.traffic import cpu_seconds

READER_PROCESSES = 4
IDLE_S = 10.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _fifteen() -> Any:
    """`examples/fifteen.yaml` as a spec, its models' paths standing in (only the record is needed: nothing
    loads them)."""
    import yaml

    from serving.config.spec import parse_spec

    document = yaml.safe_load((ROOT / "examples" / "fifteen.yaml").read_text())
    with tempfile.TemporaryDirectory(prefix="fifteen-") as folder:
        return parse_spec(document, _stand_ins(document, Path(folder)))


def _stand_ins(document: dict[str, Any], base: Path) -> Path:
    """Empty folders (and an empty archive) where the spec's models would be, under `base`."""
    for container in document["Containers"]:
        path = base / container["ModelDataUrl"]
        if path.suffix == ".gz":  # an empty archive
            path.parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(path, "w:gz"):
                pass
        else:
            path.mkdir(parents=True, exist_ok=True)
    return base


class Fanout:
    """A local Ray with the registry: `measure(readers)` runs one size."""

    def __init__(self) -> None:
        # Ray's token authentication, as `serving up` runs it (read when Ray is imported)
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        os.environ.setdefault("RAY_AUTH_TOKEN", os.urandom(32).hex())
        import ray

        from serving.control.plans import endpoint_record
        from serving.ray_wing import registry_handle
        from serving.ray_wing.operations import control_token
        from serving.settings import ServerSettings

        ray.init(  # a fresh local Ray, whatever /tmp/ray/ray_current_cluster names
            address="local",
            num_cpus=2,
            include_dashboard=False,
            namespace="serving",
            logging_level=logging.ERROR,
        )
        self.ray = ray
        self.address = ray.get_runtime_context().gcs_address
        self.registry = registry_handle()
        self.token = control_token()
        ray.get(self.registry.stop_reconciling.remote(self.token), timeout=60)
        spec = _fifteen()
        ray.get(
            self.registry.put_endpoint.remote(self.token, endpoint_record(spec, ServerSettings())),
            timeout=60,
        )
        self.registry_pid: int = ray.get(self.registry.__ray_call__.remote(lambda _: os.getpid()))
        node = ray._private.worker._global_node
        assert node is not None, "ray.init started a node here"
        self.gcs_pid: int = node.all_processes["gcs_server"][0].process.pid
        snapshot = ray.get(self.registry.snapshot.remote(-1), timeout=60)
        self.snapshot_bytes: int = len(pickle.dumps(snapshot))

    def measure(self, readers: int, changes: int, feed: bool) -> dict[str, Any]:
        self.ray.get(self.registry.open_feed.remote(self.token, "127.0.0.1" if feed else None))
        processes = min(READER_PROCESSES, readers)
        warm_s = 10.0 + readers / 50
        seconds = warm_s + changes + IDLE_S + 5
        folder = Path(tempfile.mkdtemp(prefix="registry-fanout-"))
        runs, outs = [], []
        for number in range(processes):
            count = readers // processes + (number < readers % processes)
            out = folder / f"readers-{number}.json"
            outs.append(out)
            runs.append(
                subprocess.Popen(
                    [
                        sys.executable, "-m", "loadtests.cluster.registry_readers",
                        "--address", self.address, "--count", str(count),
                        "--first", str(number * (readers // processes + 1)),
                        "--seconds", str(seconds), "--out", str(out),
                    ],
                    cwd=ROOT,
                )
            )  # fmt: skip
        try:
            time.sleep(warm_s)
            made: dict[int, float] = {}
            registry_cpu, gcs_cpu = cpu_seconds([self.registry_pid]), cpu_seconds([self.gcs_pid])
            started = time.monotonic()
            for number in range(changes):
                at = time.time()
                routing = {"fronts": {}, "served": {}, "change": number}
                version = self.ray.get(self.registry.publish_api.remote(self.token, routing))
                made[version] = at
                time.sleep(max(0.0, started + number + 1 - time.monotonic()))
            changing_s = time.monotonic() - started
            registry_changing = cpu_seconds([self.registry_pid]) - registry_cpu
            gcs_changing = cpu_seconds([self.gcs_pid]) - gcs_cpu
            registry_cpu, gcs_cpu = cpu_seconds([self.registry_pid]), cpu_seconds([self.gcs_pid])
            time.sleep(IDLE_S)
            registry_idle = (cpu_seconds([self.registry_pid]) - registry_cpu) / IDLE_S
            gcs_idle = (cpu_seconds([self.gcs_pid]) - gcs_cpu) / IDLE_S
            for run in runs:
                run.wait(timeout=seconds + 120)
        finally:
            for run in runs:
                if run.poll() is None:
                    run.kill()
        found = [json.loads(out.read_text()) for out in outs if out.exists()]
        arrivals: dict[int, list[float]] = {}
        for part in found:
            for version, times in part["arrivals"].items():
                arrivals.setdefault(int(version), []).extend(times)
        everywhere: list[float] = []
        each: list[float] = []
        missing = 0
        for version, at in made.items():
            times = arrivals.get(version, [])
            missing += readers - len(times)
            if times:
                everywhere.append(max(times) - at)
                each.extend(t - at for t in times)
        applies = [t for part in found for t in part["applies"]]
        paths = {path: sum(part["paths"][path] for part in found) for path in ("feed", "ray")}
        writes = sum(part["writes"] for part in found)
        with contextlib.suppress(OSError):
            for out in outs:
                out.unlink()
            folder.rmdir()
        return {
            "readers": readers,
            "path": "feed" if feed else "ray",
            "polls_by_path": paths,  # what the readers' long polls actually went through
            "changes": len(made),
            "missed_arrivals": missing,  # a reader that skipped a version (it got a later one)
            "everywhere_p50_s": statistics.median(everywhere),
            "everywhere_p99_s": _percentile(everywhere, 0.99),
            "each_p50_s": statistics.median(each),
            "each_p99_s": _percentile(each, 0.99),
            "registry_cores_changing": registry_changing / changing_s,
            "registry_cpu_ms_per_change": (registry_changing - registry_idle * changing_s)
            / len(made)
            * 1e3,
            "registry_cores_idle": registry_idle,
            "gcs_cores_changing": gcs_changing / changing_s,
            "gcs_cores_idle": gcs_idle,
            "kv_writes_per_s": writes / seconds,
            "apply_ms_p50": statistics.median(applies) * 1e3 if applies else None,
            "snapshot_bytes": self.snapshot_bytes,
        }

    def close(self) -> None:
        self.ray.shutdown()
