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


def _cycles(count: int) -> list[weakref.ref]:
    refs = []
    for _ in range(count):
        node = _Node()
        refs.append(weakref.ref(node))
        del node
    return refs


def test_collections_wait_for_the_freeze_once_deferred() -> None:
    """A container process defers collections while it imports its framework; the freeze collects its garbage
    and turns collections back on."""
    from serving._gc import defer_collections, freeze_startup_objects

    assert gc.isenabled()
    try:
        defer_collections()
        assert not gc.isenabled()
        start_up = _cycles(5 * gc.get_threshold()[0])  # enough allocations for several young collections
        assert all(ref() is not None for ref in start_up), "a collection ran while collections were deferred"
        freeze_startup_objects()
        assert gc.isenabled(), "the freeze did not turn collections back on"
        assert all(ref() is None for ref in start_up), "start-up garbage outlived the freeze"
        later = _cycles(5 * gc.get_threshold()[0])
        assert sum(ref() is None for ref in later) > 0, "no automatic collection after the freeze"
    finally:
        gc.enable()
        gc.unfreeze()


def test_the_freeze_leaves_a_collector_it_did_not_turn_off_as_it_was() -> None:
    from serving._gc import freeze_startup_objects

    gc.disable()  # as a process that manages its own collections would
    try:
        freeze_startup_objects()
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
