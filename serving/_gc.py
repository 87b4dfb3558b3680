"""Keep Python's cyclic garbage collector off the objects a process built while starting.

A container process holds ~170k tracked objects once its framework and model are loaded (a Ray replica holds
more), and every full collection walks all of them: 135 ms of CPU in a scikit-learn container on a 2-core VM, on
the thread that triggered it, i.e. in the middle of a request. Under load full collections come every few seconds,
because a young collection promotes whatever requests are in flight at that moment, and those later die in the old
generation. Freezing what start-up built leaves a full collection only the objects made since
(docs/performance.md).
"""

from __future__ import annotations

import gc

__all__ = ["defer_collections", "freeze_startup_objects"]

_deferred = False  # whether defer_collections turned the collector off (freeze_startup_objects turns it back on)


def defer_collections() -> None:
    """No collections until `freeze_startup_objects`. While a framework is imported the heap only grows, so the
    collector finds next to nothing, yet each full collection walks every object made so far: with collections
    on, ~15% of a container process's start-up CPU went to them (docs/performance.md). The one collection at
    the end still frees whatever cycles start-up left."""
    global _deferred
    if gc.isenabled():
        gc.disable()
        _deferred = True


def freeze_startup_objects() -> None:
    """Collect once (so that no cycle of start-up garbage, such as a model loader's temporaries, is kept for
    good), then move every surviving object to the generation that collections skip, and turn collections back
    on if `defer_collections` turned them off. Call once start-up is done; objects made later are collected as
    usual."""
    global _deferred
    gc.collect()
    gc.freeze()
    if _deferred:
        _deferred = False
        gc.enable()
