"""A container replica's metrics, exported through Ray's metrics machinery.

Recorded with `ray.util.metrics` in the replica's supervisor (its container process's events are
replayed here), pushed by Ray to the metrics agent of the replica's node (every
`metrics_report_interval_ms`: Ray's default, or `cluster.METRICS_REPORT_INTERVAL_MS` on the embedded
Ray), and read from every node by the gateway's `GET /metrics` (`metrics.exposition`): a replica on
any node shows up in one scrape, with no port to discover.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ray.util import metrics as ray_metrics

from serving.metrics.invocations import LATENCY_BUCKETS
from serving.models.cache import CacheObserver
from serving.protocol import GPUS_ENV, MEMORY_ENV

logger = logging.getLogger("serving.replica_metrics")

UTILIZATION_PERIOD_S = 5.0
MAX_MODEL_LABELS = 10_000  # distinct `model` label values per replica; past them, OTHER_MODELS
OTHER_MODELS = "(other)"
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

_REPLICA = ("endpoint", "container", "replica")
_MODEL = _REPLICA + ("model",)
EXACT_SUM_SUFFIX = "_exact_sum"  # metrics.exposition puts these in place of Ray's histogram sums


class _Timing:
    """A histogram (latency buckets unless given) with an exact sum.

    Ray (2.60) exports a histogram's `_sum` as count x bucket midpoint, which can be off by half a
    bucket; a counter next to it carries the true sum, swapped in by `metrics.exposition`.
    """

    def __init__(
        self, name: str, description: str, boundaries: tuple[float, ...] = LATENCY_BUCKETS
    ) -> None:
        self._histogram = ray_metrics.Histogram(
            name, description, boundaries=list(boundaries), tag_keys=_REPLICA
        )
        self._sum = ray_metrics.Counter(
            name + EXACT_SUM_SUFFIX, f"Exact sum of {name}.", tag_keys=_REPLICA
        )

    def observe(self, seconds: float, tags: dict[str, str]) -> None:
        self._histogram.observe(seconds, tags=tags)
        if seconds > 0:  # Ray's counters refuse non-positive increments
            self._sum.inc(seconds, tags=tags)


class ModelLabels:
    """The `model` label's values of one replica, at most MAX_MODEL_LABELS: the names come from its
    container process, which runs tenant code and could report endless made-up names, each a series
    held by its supervisor (which may serve other containers) and the node's metrics agent."""

    def __init__(self, most: int = MAX_MODEL_LABELS) -> None:
        self._seen: set[str] = set()
        self._most = most

    def label(self, name: str) -> str:
        if name in self._seen:
            return name
        if len(self._seen) >= self._most:
            return OTHER_MODELS
        self._seen.add(name)
        return name


class ReplicaMetrics(CacheObserver):
    """The replica-side metrics of DESIGN.md for one replica; also the model cache's observer."""

    def __init__(self, endpoint: str, container: str, replica: str) -> None:
        self.tags = {"endpoint": endpoint, "container": container, "replica": replica}
        self._model_latency = _Timing(
            "serving_model_latency_seconds",
            "Time a container spent running its model for one request (decode, predict, encode), excluding loading.",
        )
        self._cache_hit = ray_metrics.Counter(
            "serving_model_cache_hit",
            "MultiModel requests whose model was already loaded.",
            tag_keys=_MODEL,
        )
        self._cache_miss = ray_metrics.Counter(
            "serving_model_cache_miss",
            "MultiModel requests whose model had to be loaded (or was loading), counted once it loaded.",
            tag_keys=_MODEL,
        )
        self._loading_wait = _Timing(
            "serving_model_loading_wait_time_seconds",
            "Time a request that missed the cache waited for its model to be downloaded and loaded.",
        )
        self._loading = _Timing(
            "serving_model_loading_time_seconds",
            "Time to load one model into memory (after its download).",
        )
        self._downloading = _Timing(
            "serving_model_downloading_time_seconds",
            "Time to fetch and unpack one model from its store into the replica's disk cache.",
        )
        self._unloading = _Timing(
            "serving_model_unloading_time_seconds", "Time to unload one model."
        )
        self._loaded_count = ray_metrics.Gauge(
            "serving_loaded_model_count",
            "Models loaded in a MultiModel replica.",
            tag_keys=_REPLICA,
        )
        self._loaded_bytes = ray_metrics.Gauge(
            "serving_loaded_model_bytes",
            "Memory the loaded models of a MultiModel replica grew it by.",
            tag_keys=_REPLICA,
        )
        self._cpu = ray_metrics.Gauge(
            "serving_cpu_utilization_percent",
            "CPU used by the replica's process; 100 = one core.",
            tag_keys=_REPLICA,
        )
        self._memory = ray_metrics.Gauge(
            "serving_memory_utilization_percent",
            "Resident memory of the replica's process, in percent of its Resources.MemoryMb (else of the machine).",
            tag_keys=_REPLICA,
        )
        self._refused_hops = ray_metrics.Counter(
            "serving_refused_hops",
            "Requests a container's data port refused: not signed by the gateway for it.",
            tag_keys=_REPLICA,
        )
        self._restarts = ray_metrics.Counter(
            "serving_container_restarts",
            "Times a replica's supervisor started its container process again after it exited.",
            tag_keys=_REPLICA,
        )
        self._gpu = ray_metrics.Gauge(
            "serving_gpu_utilization_percent",
            "Utilization of the GPUs assigned to the replica.",
            tag_keys=_REPLICA,
        )
        self._batch_size = _Timing(  # an exact sum: rows batched
            "serving_batch_size",
            "Rows in one dynamic batch of a container's predict_fn (Batching).",
            BATCH_SIZE_BUCKETS,
        )
        self._queue_delay = _Timing(
            "serving_batch_queue_delay_seconds",
            "Time a batched request waited in its container's batch queue, from its decode to its batch's start.",
        )
        self._first_token = _Timing(
            "serving_time_to_first_token_seconds",
            "A generating container's time from a request reaching its model to the first new token.",
        )
        self._per_token = _Timing(
            "serving_time_per_output_token_seconds",
            "A generating request's mean time per new token after its first (1 / its tokens per second).",
        )
        self._output_tokens = ray_metrics.Counter(
            "serving_output_tokens",
            "New tokens a generating container made (rate(): its tokens per second).",
            tag_keys=_REPLICA,
        )
        self._models = ModelLabels()
        self._stop = threading.Event()
        # Re-set every period: Ray's agent evicts a gauge not refreshed within two export intervals
        # (a loaded-model count set once vanished from the scrape after a few seconds).
        self._loaded: tuple[int, int] | None = None

    def model_latency(self, seconds: float) -> None:
        self._model_latency.observe(seconds, tags=self.tags)

    def batch_size(self, rows: int) -> None:
        self._batch_size.observe(rows, tags=self.tags)

    def queue_delay(self, seconds: float) -> None:
        self._queue_delay.observe(seconds, tags=self.tags)

    def time_to_first_token(self, seconds: float) -> None:
        self._first_token.observe(seconds, tags=self.tags)

    def output_tokens(self, count: int, seconds: float) -> None:
        if count > 0:
            self._output_tokens.inc(count, tags=self.tags)
        if count > 1:
            self._per_token.observe(seconds / (count - 1), tags=self.tags)

    def restarted(self) -> None:
        self._restarts.inc(1, tags=self.tags)

    def refused_hops(self, count: int) -> None:
        if count > 0:
            self._refused_hops.inc(count, tags=self.tags)

    # -- the model cache's events (modelcache.CacheObserver) and the store's downloads -------------
    def hit(self, name: str) -> None:
        self._cache_hit.inc(1, tags={**self.tags, "model": self._models.label(name)})

    def waited(self, name: str, seconds: float) -> None:
        # A miss is counted once its model loaded: a name that fails to load (unknown, broken) must
        # not become a label value, or any caller could add series without bound.
        self._cache_miss.inc(1, tags={**self.tags, "model": self._models.label(name)})
        self._loading_wait.observe(seconds, tags=self.tags)

    def loaded(self, name: str, seconds: float, nbytes: int) -> None:
        self._loading.observe(seconds, tags=self.tags)

    def unloaded(self, name: str, seconds: float) -> None:
        self._unloading.observe(seconds, tags=self.tags)

    def changed(self, loaded_count: int, total_bytes: int) -> None:
        self._loaded = (loaded_count, total_bytes)
        self._set_loaded()

    def _set_loaded(self) -> None:
        if self._loaded is not None:
            self._loaded_count.set(self._loaded[0], tags=self.tags)
            self._loaded_bytes.set(self._loaded[1], tags=self.tags)

    def downloaded(self, name: str, seconds: float, nbytes: int) -> None:
        self._downloading.observe(seconds, tags=self.tags)

    # -- utilization -------------------------------------------------------------------------------
    def start_utilization(
        self,
        period_s: float = UTILIZATION_PERIOD_S,
        pids: Callable[[], list[int | None]] = lambda: [],
        environment: Mapping[str, str] | None = None,
        own: bool = True,
    ) -> None:
        """Sample CPU, memory (and GPU) every `period_s` on a daemon thread: this process's (`own`)
        plus those of `pids()` (the replica's container process). `environment`: the container's (its
        memory and GPU share)."""
        threading.Thread(
            target=self._sample_forever,
            args=(period_s, pids, environment or {}, own),
            name="utilization",
            daemon=True,
        ).start()

    def stop(self) -> None:
        self._stop.set()

    def _sample_forever(
        self,
        period_s: float,
        pids: Callable[[], list[int | None]],
        environment: Mapping[str, str],
        own: bool,
    ) -> None:
        processes = ReplicaProcesses(pids, own)
        limit = memory_limit_bytes(environment)
        gpus = _gpu_reader() if float(environment.get(GPUS_ENV) or 0) > 0 else None
        while not self._stop.wait(period_s):
            try:
                cpu, rss = processes.sample()
                self._cpu.set(cpu, tags=self.tags)
                self._memory.set(100.0 * rss / limit, tags=self.tags)
                if gpus is not None:
                    self._gpu.set(gpus(), tags=self.tags)
                self._set_loaded()
            except Exception:  # a metric must never take the replica down
                logger.exception("utilization sample failed")


class ReplicaProcesses:
    """CPU (100 = one core) and resident memory of a replica: its container process, plus its
    supervisor where that serves this replica alone (`own`)."""

    def __init__(self, pids: Callable[[], list[int | None]], own: bool = True) -> None:
        import psutil

        self._psutil = psutil
        self._pids = pids
        self._processes: dict[int, Any] = {}
        self._own = psutil.Process() if own else None
        if self._own is not None:
            self._own.cpu_percent(None)  # the first call only starts the interval

    def sample(self) -> tuple[float, int]:
        cpu, rss = 0.0, 0
        if self._own is not None:
            cpu, rss = self._own.cpu_percent(None), self._own.memory_info().rss
        for pid in self._pids():
            if pid is None:
                continue
            process = self._processes.get(pid)
            try:
                if process is None:  # a new process: its first interval starts now
                    process = self._processes[pid] = self._psutil.Process(pid)
                    process.cpu_percent(None)
                else:
                    cpu += process.cpu_percent(None)
                rss += process.memory_info().rss
            except self._psutil.Error:  # it exited: its supervisor reports the failure
                self._processes.pop(pid, None)
        return cpu, rss


def memory_limit_bytes(environment: Mapping[str, str]) -> float:
    """100% of the memory utilization metrics: the container's Resources.MemoryMb
    (`SERVING_MEMORY_MB` in its `environment`), else the machine's memory."""
    import psutil

    memory_mb = float(environment.get(MEMORY_ENV) or 0)
    return memory_mb * 1024 * 1024 if memory_mb > 0 else psutil.virtual_memory().total


def _gpu_reader():
    """A function returning the mean utilization (%) of the replica's GPUs, or None without NVML."""
    try:
        import pynvml  # nvidia-ml-py: present where CUDA builds of the frameworks are installed
    except ImportError:
        logger.warning("GPU utilization is not reported: nvidia-ml-py (pynvml) is not installed")
        return None
    pynvml.nvmlInit()
    visible = [
        item for item in os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") if item.strip()
    ]
    handles = [
        pynvml.nvmlDeviceGetHandleByIndex(int(item))
        if item.isdigit()
        else pynvml.nvmlDeviceGetHandleByUUID(item)
        for item in visible
    ]

    def read() -> float:
        rates = [pynvml.nvmlDeviceGetUtilizationRates(handle).gpu for handle in handles]
        return sum(rates) / len(rates) if rates else 0.0

    return read


class AutoscalingStats:
    """What a replica reports to its container's autoscaler (`record_autoscaling_stats`), per call.

    Invocations per minute since the previous call (Serve calls every ~2 s and averages over its
    look-back window), requests in flight, CPU % (100 = one core) and memory % of the process, and
    whatever the model's `code/inference.py` returns from `autoscaling_metrics(model)`.
    """

    def __init__(
        self,
        counters: Callable[[], tuple[int, int, dict[str, float]]],
        pids: Callable[[], list[int | None]] = lambda: [],
        environment: Mapping[str, str] | None = None,
    ) -> None:
        """`counters()`: the container's invocations so far, requests in flight and the model's own
        metrics; `environment`: the container's (its memory share)."""
        self.counters = counters
        # its own CPU interval, apart from the utilization sampler's
        self._processes = ReplicaProcesses(pids)
        self._memory_limit = memory_limit_bytes(environment or {})
        self._last = (time.monotonic(), counters()[0])

    def sample(self) -> dict[str, float]:
        from serving.autoscaling.policy import (
            CONCURRENT_REQUESTS_PER_REPLICA,
            CPU_UTILIZATION,
            INVOCATIONS_PER_INSTANCE,
            MEMORY_UTILIZATION,
        )

        count, in_flight, custom = self.counters()
        now = time.monotonic()
        then, before = self._last
        self._last = (now, count)
        cpu, rss = self._processes.sample()
        stats = {
            INVOCATIONS_PER_INSTANCE: max(count - before, 0) * 60.0 / max(now - then, 1e-3),
            CONCURRENT_REQUESTS_PER_REPLICA: float(in_flight),
            CPU_UTILIZATION: cpu,
            MEMORY_UTILIZATION: 100.0 * rss / self._memory_limit,
        }
        # the model's own `autoscaling_metrics` (computed in the container process)
        stats.update(custom)
        return stats
