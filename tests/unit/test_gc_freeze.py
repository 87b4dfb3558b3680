"""`serving._gc.freeze_startup_objects`: what start-up built is left out of later collections, its garbage is not."""

from __future__ import annotations

import gc
import weakref


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_start_up_garbage_is_collected_and_the_rest_frozen() -> None:
    from serving._gc import freeze_startup_objects

    garbage = _Node()
    dead = weakref.ref(garbage)
    del garbage
    kept = _Node()
    frozen = weakref.ref(kept)
    try:
        freeze_startup_objects()
        assert dead() is None, "a cycle that was already garbage was frozen for good"
        del kept
        later = _Node()
        made_later = weakref.ref(later)
        del later
        gc.collect()
        assert frozen() is not None, "a collection walked the frozen objects"
        assert made_later() is None, "an object made after the freeze was not collected"
    finally:
        gc.unfreeze()  # this test process's other tests see the collector as usual
    gc.collect()
    assert frozen() is None
