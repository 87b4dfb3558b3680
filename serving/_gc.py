"""Keep Python's cyclic garbage collector off the objects a process built while starting.

Once its framework and model are loaded a container process tracks a great many objects (a Ray
replica more), and every full collection walks them all on the thread that triggered it,
mid-request; under load one comes every few seconds, because a young collection promotes the
requests then in flight, which later die in the old generation. Freezing what start-up built leaves
a full collection only the objects made since (docs/benchmarks/bench_batching.md). A container
process also holds full collections off while it starts (`defer_collections`).
"""

from __future__ import annotations

import gc

__all__ = ["defer_collections", "freeze_startup_objects"]

# The thresholds defer_collections replaced (freeze_startup_objects puts them back), or None.
_deferred: tuple[int, ...] | None = None
_NO_FULL_COLLECTION = 1 << 30  # young collections between full ones: never, in practice


def defer_collections() -> None:
    """No full collections until `freeze_startup_objects`. While a framework is imported the heap
    only grows, so a full collection finds next to nothing, yet each walks every object made so far,
    and they come each time the old generation grew by a quarter: ~15% of a container process's
    start-up CPU (docs/benchmarks/bench_idle.md). Young collections go on, so the short-lived cycles
    of a model loader are still freed as it runs; the one full collection at the end frees whatever
    older cycles start-up left."""
    global _deferred
    if _deferred is None:
        _deferred = gc.get_threshold()
        gc.set_threshold(_deferred[0], _deferred[1], _NO_FULL_COLLECTION)


def freeze_startup_objects() -> None:
    """Collect once (so that no cycle of start-up garbage, such as a model loader's temporaries, is
    kept for good), then move every surviving object to the generation that collections skip, and
    put back the full collections `defer_collections` held off. Call once start-up is done; objects
    made later are collected as usual."""
    global _deferred
    gc.collect()
    gc.freeze()
    if _deferred is not None:
        gc.set_threshold(*_deferred)
        _deferred = None
