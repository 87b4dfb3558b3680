"""A replica's cache of loaded models for a MultiModel container (SageMaker multi-model semantics).

`ModelCache` keeps models loaded least recently used first, bounded by count and by their measured
memory, with single-flight loads and pinned models never unloaded mid-request; `CacheObserver` turns
its events into the MultiModel metrics (docs/metrics.md). What users see of it: docs/spec.md,
"MultiModel containers".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from typing import Any

from serving._malloc import keep_large_blocks_in_mmap, release_freed_memory
from serving.models.cache_events import CacheObserver
from serving.models.memory import process_memory

__all__ = ["CacheObserver", "ModelCache"]  # CacheObserver: also importable from here

logger = logging.getLogger("serving.modelcache")

_LOADING, _CACHED, _LEAVING, _GONE, _FAILED = "loading", "cached", "leaving", "gone", "failed"


class _Entry:
    """One load of one model, from the load through its unload."""

    __slots__ = ("name", "model", "nbytes", "pins", "state", "task", "unloading", "done")

    def __init__(self, name: str) -> None:
        self.name = name
        self.model: Any = None
        self.nbytes = 0
        self.pins = 0  # requests holding or waiting for this entry
        self.state = _LOADING
        self.task: asyncio.Task[None] | None = None
        self.unloading: asyncio.Task[None] | None = None  # set once: the one and only unload
        self.done = asyncio.Event()  # set when unloaded or failed


class ModelCache:
    """LRU cache of loaded models bounded by count and measured bytes.

    - `async with cache.acquire(name) as model:` hands out a loaded model and pins it for the block;
      a pinned model is never unloaded, so no request loses its model half-way.
    - A miss loads with the blocking `load(name)` in an executor. Loads are single-flight:
      concurrent first requests share one load; a failed load raises to all of them, leaves nothing
      behind, and the next request loads again.
    - Loads and unloads run one at a time (one lock, as Ray Serve's model multiplexing does), so the
      growth of process memory across a load is that model's size: entries are measured, not
      guessed. After an unload, freed memory goes back to the OS (glibc, `release_memory`), else the
      next load would measure as free.
    - Eviction is least recently used first, until at most `max_models` are cached (loads in flight
      hold a place) and their sizes sum to at most `max_bytes`, when given. Room by count is made
      before a load; the byte bound right after it, before the model is handed out. Pinned models
      are skipped: when all are pinned the cache overshoots and evicts as soon as a request
      releases. A model larger than `max_bytes` alone is still served, then evicted when its last
      request releases it.
    - `enabled=False` (SageMaker `ModelCacheSetting: Disabled`): each request loads its own copy and
      unloads it on release; no sharing, no single-flight, no hits, nothing counted as cached.
    - All state lives on the event loop; only `load`, `unload` and `measure` run in the executor.
    """

    def __init__(
        self,
        load: Callable[[str], Any],
        unload: Callable[[Any], None] | None = None,
        *,
        max_models: int,
        max_bytes: int | None = None,
        enabled: bool = True,
        measure: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        observer: CacheObserver | None = None,
        executor: Executor | None = None,
        release_memory: bool = True,
    ) -> None:
        if not callable(load):
            raise ValueError("load must be a callable taking a model name")
        if unload is not None and not callable(unload):
            raise ValueError("unload must be a callable taking a loaded model, or None")
        if isinstance(max_models, bool) or not isinstance(max_models, int) or max_models < 1:
            raise ValueError(f"max_models must be an integer of at least 1, got {max_models!r}")
        if max_bytes is not None and (
            isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1
        ):
            raise ValueError(f"max_bytes must be a positive integer or None, got {max_bytes!r}")
        self._load_fn = load
        self._unload_fn = unload
        self._max_models = max_models
        self._max_bytes = max_bytes
        self._enabled = enabled
        self._measure = measure or process_memory
        self._clock = clock
        self._observer = observer or CacheObserver()
        self._executor = executor
        self._release_memory = release_memory
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # cached, least recently used first
        self._loading: dict[str, _Entry] = {}  # single-flight loads in flight
        self._live: set[_Entry] = set()  # every entry not yet unloaded or failed
        self._bytes = 0
        self._lock = asyncio.Lock()  # one load or unload at a time: memory deltas stay attributable

    # -- reading -----------------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """False under ModelCacheSetting Disabled: nothing stays loaded between requests."""
        return self._enabled

    def holds(self, name: str) -> bool:
        """Whether `name` is loaded or loading (a request for it evicts nothing)."""
        return name in self._entries or name in self._loading

    def loaded_models(self) -> list[str]:
        """Cached model names, least recently used first."""
        return list(self._entries)

    @property
    def loaded_count(self) -> int:
        """Models cached now (entries being unloaded no longer count)."""
        return len(self._entries)

    @property
    def total_bytes(self) -> int:
        """Sum of the cached models' measured sizes."""
        return self._bytes

    def entry_bytes(self, name: str) -> int:
        """Measured size of cached model `name`; KeyError when it is not cached."""
        return self._entries[name].nbytes

    # -- requests ----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def acquire(self, name: str) -> AsyncIterator[Any]:
        """The loaded model `name`, pinned until the block exits; loads it on a miss."""
        start = self._clock()
        entry = self._entries.get(name) if self._enabled else None
        missed = entry is None
        if entry is not None:
            self._entries.move_to_end(name)
            self._notify("hit", name)
        else:
            entry = self._loading.get(name) if self._enabled else None
            if entry is None:
                entry = self._start_load(name)
            self._notify("miss", name)
        entry.pins += 1
        try:
            if missed:
                assert entry.task is not None
                await asyncio.shield(entry.task)  # raises the load's own exception
                self._notify("waited", name, self._clock() - start)
            yield entry.model
        finally:
            entry.pins -= 1
            if entry.pins == 0:
                await self._released(entry)

    async def evict(self, name: str) -> bool:
        """Unload cached model `name` (after its last request releases it); False if it was not
        cached."""
        entry = self._entries.get(name)
        if entry is None:
            return False
        self._retire(entry)
        self._changed()
        await entry.done.wait()
        return True

    async def unload_all(self) -> None:
        """Unload everything, waiting for loads in flight and requests still holding models
        (shutdown).

        Returns once nothing is loaded; call it after the replica stopped taking requests.
        """
        while self._live:
            if self._entries:
                for entry in list(self._entries.values()):
                    self._retire(entry)
                self._changed()
            entry = next(iter(self._live))
            if entry.state == _LOADING:
                assert entry.task is not None
                await asyncio.wait([entry.task])
            else:
                await entry.done.wait()

    # -- loading -----------------------------------------------------------------------------------

    def _start_load(self, name: str) -> _Entry:
        entry = _Entry(name)
        self._live.add(entry)
        if self._enabled:
            self._loading[name] = entry
            task = asyncio.get_running_loop().create_task(self._fill(entry))
        else:
            task = asyncio.get_running_loop().create_task(self._load_alone(entry))
        task.add_done_callback(functools.partial(self._load_ended, entry))
        entry.task = task
        return entry

    async def _fill(self, entry: _Entry) -> None:
        """The single-flight load into the cache: room by count, load, then both bounds."""
        try:
            await self._enforce_bounds()
            await self._load(entry)
        except BaseException as error:
            self._fail(entry, error)
            raise
        finally:
            del self._loading[entry.name]
        entry.state = _CACHED
        self._entries[entry.name] = entry
        self._bytes += entry.nbytes
        self._changed()
        await self._enforce_bounds()

    async def _load_alone(self, entry: _Entry) -> None:
        """A Disabled cache's per-request load: the copy is unloaded when its request releases
        it."""
        try:
            await self._load(entry)
        except BaseException as error:
            self._fail(entry, error)
            raise
        entry.state = _LEAVING
        if entry.pins == 0:  # its request was cancelled while waiting
            self._start_unload(entry)

    async def _load(self, entry: _Entry) -> None:
        loop = asyncio.get_running_loop()
        async with self._lock:
            started = self._clock()
            entry.model, entry.nbytes = await loop.run_in_executor(
                self._executor, self._measured_load, entry.name
            )
            seconds = self._clock() - started
        self._notify("loaded", entry.name, seconds, entry.nbytes)

    def _measured_load(self, name: str) -> tuple[Any, int]:
        """In the executor: the model and how much the process grew while loading it."""
        if self._release_memory:
            keep_large_blocks_in_mmap()  # fix malloc's threshold before the first measurement
        before = self._measure()
        model = self._load_fn(name)
        return model, max(0, self._measure() - before)

    def _fail(self, entry: _Entry, error: BaseException) -> None:
        entry.state = _FAILED
        entry.model = None
        self._live.discard(entry)
        entry.done.set()
        if isinstance(error, Exception):
            self._notify("load_failed", entry.name, error)

    def _load_ended(self, entry: _Entry, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            if entry.state == _LOADING:  # cancelled before it ever ran
                self._loading.pop(entry.name, None)
                self._fail(entry, asyncio.CancelledError())
        else:
            # retrieved: a load whose waiters all left must not log "never retrieved"
            task.exception()

    # -- eviction ----------------------------------------------------------------------------------

    def _over(self) -> bool:
        if len(self._entries) + len(self._loading) > self._max_models:
            return True
        return self._max_bytes is not None and self._bytes > self._max_bytes

    async def _enforce_bounds(self) -> None:
        """Evict unpinned models, least recently used first, until both bounds hold or none is
        left."""
        victims = []
        while self._over():
            victim = next((entry for entry in self._entries.values() if entry.pins == 0), None)
            if victim is None:  # everything pinned: overshoot until a request releases
                break
            self._retire(victim)
            victims.append(victim)
        if victims:
            self._changed()
            for victim in victims:
                await victim.done.wait()

    def _retire(self, entry: _Entry) -> None:
        """Take `entry` out of the cache; it is unloaded now, or when its last request releases
        it."""
        del self._entries[entry.name]
        self._bytes -= entry.nbytes
        entry.state = _LEAVING
        if entry.pins == 0:
            self._start_unload(entry)

    async def _released(self, entry: _Entry) -> None:
        if entry.state == _LEAVING:
            self._start_unload(entry)
            await entry.done.wait()
        elif entry.state == _CACHED:
            await self._enforce_bounds()

    def _start_unload(self, entry: _Entry) -> None:
        if entry.unloading is None:  # whoever comes first starts it; everyone else waits on `done`
            entry.unloading = asyncio.get_running_loop().create_task(self._unload(entry))

    async def _unload(self, entry: _Entry) -> None:
        box = [entry.model]  # the executor drops the last reference before releasing memory
        entry.model = None
        seconds = 0.0
        try:
            async with self._lock:
                started = self._clock()
                try:
                    await asyncio.get_running_loop().run_in_executor(
                        self._executor, self._unload_box, box
                    )
                finally:
                    seconds = self._clock() - started
        except Exception:
            logger.exception("unloading model %s failed; dropping it anyway", entry.name)
        finally:
            entry.state = _GONE
            self._live.discard(entry)
            entry.done.set()
        self._notify("unloaded", entry.name, seconds)

    def _unload_box(self, box: list[Any]) -> None:
        try:
            if self._unload_fn is not None:
                self._unload_fn(box[0])
        finally:
            box.clear()
            if self._release_memory:
                release_freed_memory()

    # -- observer ----------------------------------------------------------------------------------

    def _changed(self) -> None:
        self._notify("changed", len(self._entries), self._bytes)

    def _notify(self, event: str, *args: Any) -> None:
        try:
            getattr(self._observer, event)(*args)
        except Exception:  # a broken metric must not break serving
            logger.exception("model cache observer failed on %s", event)
