"""What the model cache reports as it works: hits, misses, waits, loads and unloads, for the
MultiModel metrics (docs/metrics.md) to count; the cache itself is `cache`."""

from __future__ import annotations

__all__ = ["CacheObserver"]


class CacheObserver:
    """Receives the cache's events on the event loop; metrics subclass it. Every method defaults to
    a no-op.

    ModelCacheHit: `hit`/`miss`; ModelLoadingWaitTime: `waited`; ModelLoadingTime: `loaded`;
    ModelUnloadingTime: `unloaded`; LoadedModelCount: `changed`.

    `waited`, precisely: for each request that did not find its model cached, the time from entering
    `acquire` until the model is handed to it: queueing behind other loads and unloads, evictions
    that make room, and the load itself; a request that joins a load already in flight reports its
    own, shorter, wait. Hits report no wait; a failed load reports none (`load_failed` fires once
    per load instead). `loaded` is the load alone, lock held.
    """

    def hit(self, name: str) -> None:
        """A request found `name` cached."""

    def miss(self, name: str) -> None:
        """A request did not find `name` cached (it starts or joins a load)."""

    def waited(self, name: str, seconds: float) -> None:
        """A request that missed got its model after `seconds` (see the class docstring)."""

    def loaded(self, name: str, seconds: float, nbytes: int) -> None:
        """One load of `name` took `seconds` and grew the process by `nbytes`."""

    def unloaded(self, name: str, seconds: float) -> None:
        """One unload of `name` took `seconds`."""

    def load_failed(self, name: str, error: BaseException) -> None:
        """One load of `name` raised `error` (every request waiting on it gets the same error)."""

    def changed(self, loaded_count: int, total_bytes: int) -> None:
        """The set of cached models changed."""
