"""`serving._gc.freeze_startup_objects`: what start-up built is left out of later collections, its
garbage is not."""

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


def _generations_collected(work) -> list[int]:
    """The generation of every automatic collection that ran during `work()`."""
    seen: list[int] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(on_gc)
    try:
        work()
    finally:
        gc.callbacks.remove(on_gc)
    return seen


def _grow_the_old_generation() -> list:
    """Enough long-lived objects to make a full collection due (the oldest generation grows by more
    than a quarter)."""
    kept = []
    for _ in range(max(200_000, len(gc.get_objects()) // 2)):
        kept.append([])
    return kept


def test_full_collections_wait_for_the_freeze_once_deferred() -> None:
    """A container process defers full collections while it imports its framework; young ones go on,
    and the freeze collects what start-up left and puts the thresholds back."""
    from serving._gc import defer_collections, freeze_startup_objects

    before = gc.get_threshold()
    assert 2 in _generations_collected(_grow_the_old_generation), (
        "the control: growth like this makes one due"
    )
    try:
        defer_collections()
        young = _cycles(5 * before[0])
        assert any(ref() is None for ref in young), "young collections stopped too"
        old = _Node()
        old_ref = weakref.ref(old)
        gc.collect()  # `old` survives into the oldest generation, then dies there
        del old
        assert 2 not in _generations_collected(_grow_the_old_generation), (
            "a full collection ran while deferred"
        )
        assert old_ref() is not None
        freeze_startup_objects()
        assert old_ref() is None, "start-up garbage in the oldest generation outlived the freeze"
        assert gc.get_threshold() == before, "the freeze did not put the thresholds back"
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def test_the_freeze_leaves_thresholds_it_did_not_change_as_they_were() -> None:
    from serving._gc import freeze_startup_objects

    before = gc.get_threshold()
    gc.set_threshold(500, 5, 5)  # as a process that tunes its own collections would
    try:
        freeze_startup_objects()
        assert gc.get_threshold() == (500, 5, 5)
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
