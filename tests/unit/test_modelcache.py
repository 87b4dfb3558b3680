"""serving.models.cache: LRU order, byte bound by measured size, single-flight, pins, Disabled mode,
clock."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from serving.models.cache import CacheObserver, ModelCache
from serving.models.memory import process_memory

MiB = 1 << 20


@dataclass(eq=False)
class Model:
    name: str
    weights: Any = None


@dataclass
class Recorder(CacheObserver):
    """Keeps every event, in order."""

    events: list[tuple] = field(default_factory=list)

    def hit(self, name: str) -> None:
        self.events.append(("hit", name))

    def miss(self, name: str) -> None:
        self.events.append(("miss", name))

    def waited(self, name: str, seconds: float) -> None:
        self.events.append(("waited", name, seconds))

    def loaded(self, name: str, seconds: float, nbytes: int) -> None:
        self.events.append(("loaded", name, seconds, nbytes))

    def unloaded(self, name: str, seconds: float) -> None:
        self.events.append(("unloaded", name, seconds))

    def load_failed(self, name: str, error: BaseException) -> None:
        self.events.append(("load_failed", name, error))

    def changed(self, loaded_count: int, total_bytes: int) -> None:
        self.events.append(("changed", loaded_count, total_bytes))

    def of(self, kind: str) -> list[tuple]:
        return [event[1:] for event in self.events if event[0] == kind]


class Fakes:
    """A loader and unloader that log their calls; loads may sleep or fail on request."""

    def __init__(self, delay: float = 0.0) -> None:
        self.log: list[tuple[str, str]] = []
        self.delay = delay
        self.failures: dict[str, int] = {}  # name -> loads left that raise
        self._lock = threading.Lock()

    def load(self, name: str) -> Model:
        time.sleep(self.delay)
        with self._lock:
            self.log.append(("load", name))
            if self.failures.get(name, 0) > 0:
                self.failures[name] -= 1
                raise RuntimeError(f"cannot load {name}")
        return Model(name)

    def unload(self, model: Model) -> None:
        with self._lock:
            self.log.append(("unload", model.name))

    def count(self, kind: str) -> Counter[str]:
        return Counter(name for event, name in self.log if event == kind)


def fake_cache(fakes: Fakes, **options: Any) -> tuple[ModelCache, Recorder]:
    observer = Recorder()
    options.setdefault("measure", lambda: 0)
    options.setdefault("release_memory", False)
    return ModelCache(fakes.load, fakes.unload, observer=observer, **options), observer


async def use(cache: ModelCache, name: str) -> Any:
    async with cache.acquire(name) as model:
        return model


def test_arguments_are_validated() -> None:
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="max_models"):
            ModelCache(lambda name: name, max_models=bad)  # type: ignore[arg-type]
    for bad in (0, -5, 2.0, False):
        with pytest.raises(ValueError, match="max_bytes"):
            ModelCache(lambda name: name, max_models=1, max_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="load"):
        ModelCache("not callable", max_models=1)  # type: ignore[arg-type]


def test_lru_hits_misses_and_eviction_order() -> None:
    # name, hit?, events of the step (room is made before the load), cache afterwards (oldest first)
    script = [
        ("a", False, [("load", "a")], ["a"]),
        ("b", False, [("load", "b")], ["a", "b"]),
        ("c", False, [("load", "c")], ["a", "b", "c"]),
        ("a", True, [], ["b", "c", "a"]),
        ("d", False, [("unload", "b"), ("load", "d")], ["c", "a", "d"]),
        ("c", True, [], ["a", "d", "c"]),
        ("b", False, [("unload", "a"), ("load", "b")], ["d", "c", "b"]),
        ("a", False, [("unload", "d"), ("load", "a")], ["c", "b", "a"]),
        ("a", True, [], ["c", "b", "a"]),
        ("e", False, [("unload", "c"), ("load", "e")], ["b", "a", "e"]),
    ]

    async def main() -> None:
        fakes = Fakes()
        cache, observer = fake_cache(fakes, max_models=3)
        for name, hit, step_events, after in script:
            seen = len(fakes.log)
            hits = len(observer.of("hit"))
            model = await use(cache, name)
            assert model.name == name
            assert fakes.log[seen:] == step_events, name
            assert len(observer.of("hit")) == hits + hit
            assert cache.loaded_models() == after
            assert cache.loaded_count == len(after)
        assert [name for name, _ in observer.of("unloaded")] == ["b", "a", "d", "c"]
        assert len(observer.of("miss")) == 7 and len(observer.of("hit")) == 3
        assert observer.of("changed")[-1] == (3, 0)

    asyncio.run(main())


def test_byte_bound_with_measured_numpy_models() -> None:
    """8 MiB arrays under a 20 MiB bound: never more than two cached, each measured as about 8 MiB.

    Runs in a fresh process, as a replica's cache does: sizes are the growth of the whole process,
    and this test session's own threads (a live Ray driver, test servers) allocate meanwhile.
    """
    if process_memory() == 0:
        pytest.skip("no way to read this process's memory here")
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(_byte_bound_scenario)  # raises the child's AssertionError here


def _load_8_mib(name: str) -> Model:
    return Model(name, np.full(MiB, 1.0))  # 8 MiB of float64, touched so resident


def _byte_bound_scenario() -> None:
    load = _load_8_mib

    async def main() -> None:
        observer = Recorder()
        cache = ModelCache(load, max_models=10, max_bytes=20 * MiB, observer=observer)
        names = [f"m{i}" for i in range(8)]
        for name in names:
            async with cache.acquire(name) as model:
                assert model.weights.nbytes == 8 * MiB
                assert cache.loaded_count <= 2
                assert cache.total_bytes <= 20 * MiB
                assert 7 * MiB <= cache.entry_bytes(name) <= 10 * MiB, cache.entry_bytes(name)
                del model
        assert cache.loaded_models() == names[-2:]
        assert [name for name, _ in observer.of("unloaded")] == names[:-2]
        assert all(7 * MiB <= nbytes <= 10 * MiB for _, _, nbytes in observer.of("loaded"))
        await cache.unload_all()
        assert cache.loaded_models() == [] and cache.total_bytes == 0

    asyncio.run(main())


def test_model_larger_than_max_bytes_is_served_then_evicted() -> None:
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # measured: see the test above
        pool.apply(_larger_than_the_bound_scenario)


def _load_8_mib_of_twos(name: str) -> Model:
    return Model(name, np.full(MiB, 2.0))  # 8 MiB


def _larger_than_the_bound_scenario() -> None:
    load = _load_8_mib_of_twos

    async def main() -> None:
        cache = ModelCache(load, max_models=5, max_bytes=4 * MiB)
        async with cache.acquire("small-bound") as model:
            assert float(model.weights.sum()) == 2.0 * MiB
            assert cache.loaded_models() == ["small-bound"]  # pinned: kept while in use
            del model
        assert cache.loaded_models() == []

    asyncio.run(main())


def test_single_flight_one_load_for_twenty_concurrent_requests() -> None:
    async def main() -> None:
        fakes = Fakes(delay=0.05)
        cache, observer = fake_cache(fakes, max_models=2)
        models = await asyncio.gather(*(use(cache, "a") for _ in range(20)))
        assert fakes.log == [("load", "a")]
        assert all(model is models[0] for model in models)
        assert len(observer.of("miss")) == 20 and observer.of("hit") == []
        assert len(observer.of("waited")) == 20
        assert len(observer.of("loaded")) == 1
        assert await use(cache, "a") is models[0]
        assert observer.of("hit") == [("a",)] and len(observer.of("waited")) == 20

    asyncio.run(main())


def test_failed_load_reaches_every_waiter_and_is_not_cached() -> None:
    async def main() -> None:
        fakes = Fakes(delay=0.05)
        fakes.failures["a"] = 1
        cache, observer = fake_cache(fakes, max_models=2)
        results = await asyncio.gather(*(use(cache, "a") for _ in range(5)), return_exceptions=True)
        assert isinstance(results[0], RuntimeError)
        assert all(result is results[0] for result in results)
        assert fakes.log == [("load", "a")]
        assert cache.loaded_models() == [] and cache.loaded_count == 0
        assert observer.of("load_failed") == [("a", results[0])]
        assert observer.of("waited") == [] and observer.of("loaded") == []
        model = await use(cache, "a")
        assert model.name == "a"
        assert fakes.log == [("load", "a"), ("load", "a")]
        assert cache.loaded_models() == ["a"]
        await cache.unload_all()
        assert fakes.count("unload") == {"a": 1}  # the failed load is never unloaded

    asyncio.run(main())


def test_pinned_models_are_never_unloaded() -> None:
    async def main() -> None:
        fakes = Fakes()
        cache, _ = fake_cache(fakes, max_models=1)
        async with cache.acquire("a") as a:
            async with cache.acquire("b") as b:
                assert cache.loaded_models() == ["a", "b"]  # a is in use: overshoot
                assert fakes.count("unload") == {}
            # b released: the least recently used unpinned model goes; a is still pinned
            assert fakes.log == [("load", "a"), ("load", "b"), ("unload", "b")]
            assert cache.loaded_models() == ["a"]
            evicting = asyncio.create_task(cache.evict("a"))
            await asyncio.sleep(0.05)
            assert not evicting.done()
            assert fakes.count("unload")["a"] == 0  # evicted, but unloaded only once released
            assert cache.loaded_models() == []
            assert (a.name, b.name) == ("a", "b")
        assert await evicting is True
        assert fakes.count("unload") == {"a": 1, "b": 1}
        assert await cache.evict("a") is False

    asyncio.run(main())


def test_unload_runs_once_when_evict_and_unload_all_race() -> None:
    async def main() -> None:
        fakes = Fakes(delay=0.02)
        cache, observer = fake_cache(fakes, max_models=5)
        for name in ("a", "b", "c"):
            await use(cache, name)
        holding = asyncio.Event()
        release = asyncio.Event()

        async def hold(name: str) -> None:
            async with cache.acquire(name):
                holding.set()
                await release.wait()

        holder = asyncio.create_task(hold("c"))
        await holding.wait()
        loading_d = asyncio.create_task(use(cache, "d"))  # a load still in flight
        await asyncio.sleep(0)
        racers = asyncio.gather(
            cache.evict("a"),
            cache.unload_all(),
            cache.evict("a"),
            cache.evict("b"),
            cache.evict("c"),
            cache.unload_all(),
        )
        await asyncio.sleep(0.1)
        assert fakes.count("unload")["c"] == 0  # still pinned by its request
        release.set()
        await asyncio.gather(racers, holder, loading_d)
        await cache.unload_all()
        assert fakes.count("unload") == {"a": 1, "b": 1, "c": 1, "d": 1}
        assert fakes.count("load") == {"a": 1, "b": 1, "c": 1, "d": 1}
        assert Counter(name for name, _ in observer.of("unloaded")) == {
            "a": 1,
            "b": 1,
            "c": 1,
            "d": 1,
        }
        assert cache.loaded_models() == [] and cache.total_bytes == 0

    asyncio.run(main())


def test_disabled_cache_loads_and_unloads_per_request() -> None:
    async def main() -> None:
        fakes = Fakes()
        cache, observer = fake_cache(fakes, max_models=1, enabled=False)
        for _ in range(3):
            async with cache.acquire("a") as model:
                assert model.name == "a"
                assert cache.loaded_models() == []
        assert fakes.log == [("load", "a"), ("unload", "a")] * 3
        fakes.log.clear()
        fakes.delay = 0.02
        models = await asyncio.gather(*(use(cache, "b") for _ in range(5)))
        assert len({id(model) for model in models}) == 5  # no sharing, no single-flight
        assert fakes.count("load") == {"b": 5} and fakes.count("unload") == {"b": 5}
        assert observer.of("hit") == [] and len(observer.of("miss")) == 8
        assert len(observer.of("waited")) == 8 and observer.of("changed") == []

    asyncio.run(main())


def reference_lru(names: list[str], size: int) -> tuple[int, int]:
    """Hits and misses of a plain LRU of `size`, for comparison."""
    cache: OrderedDict[str, None] = OrderedDict()
    hits = misses = 0
    for name in names:
        if name in cache:
            hits += 1
            cache.move_to_end(name)
        else:
            misses += 1
            cache[name] = None
            if len(cache) > size:
                cache.popitem(last=False)
    return hits, misses


def test_two_hundred_models_through_a_cache_of_ten() -> None:
    async def main() -> None:
        fakes = Fakes()
        cache, observer = fake_cache(fakes, max_models=10)
        everyone = [f"m{i}" for i in range(200)]

        async def run(names: list[str]) -> tuple[int, int]:
            hits, misses = len(observer.of("hit")), len(observer.of("miss"))
            for name in names:
                assert (await use(cache, name)).name == name
            return len(observer.of("hit")) - hits, len(observer.of("miss")) - misses

        assert await run(everyone) == (0, 200)  # round robin over 200: every request misses
        assert cache.loaded_models() == everyone[-10:]
        assert await run(everyone[-10:] * 5) == (50, 0)  # a window of 10 fits: all hits
        mixed = [f"m{(i * 7) % 13}" for i in range(300)] + [f"m{i % 11}" for i in range(50)]
        expected = reference_lru(everyone[-10:] + mixed, 10)
        # the window's 10 loads came earlier
        assert await run(mixed) == (expected[0], expected[1] - 10)
        loads, unloads = sum(fakes.count("load").values()), sum(fakes.count("unload").values())
        assert loads == len(observer.of("miss")) and unloads == loads - 10
        assert cache.loaded_count == 10

    asyncio.run(main())


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_times_come_from_the_injected_clock() -> None:
    async def main() -> None:
        clock = FakeClock()
        a_waited = threading.Event()

        class Observer(Recorder):
            def waited(self, name: str, seconds: float) -> None:
                super().waited(name, seconds)
                if name == "a":
                    a_waited.set()

        def load(name: str) -> Model:
            if name == "b":
                assert a_waited.wait(5)  # a's requests read the clock before b's load moves it
            clock.now += {"a": 1.0, "b": 1.0, "c": 2.5}[name]
            return Model(name)

        def unload(model: Model) -> None:
            clock.now += 0.25

        observer = Observer()
        cache = ModelCache(
            load, unload, max_models=5, clock=clock, observer=observer, measure=lambda: 0
        )
        # c: three requests share one 2.5 s load and each waited 2.5 s
        await asyncio.gather(*(use(cache, "c") for _ in range(3)))
        assert observer.of("loaded") == [("c", 2.5, 0)]
        assert observer.of("waited") == [("c", 2.5)] * 3
        # a and b arrive together: b queues behind a's load, so it waits for both
        await asyncio.gather(use(cache, "a"), use(cache, "b"))
        assert observer.of("loaded")[1:] == [("a", 1.0, 0), ("b", 1.0, 0)]
        assert observer.of("waited")[3:] == [("a", 1.0), ("b", 2.0)]
        await use(cache, "a")  # a hit waits for nothing
        assert len(observer.of("waited")) == 5
        assert await cache.evict("c") is True
        assert observer.of("unloaded") == [("c", 0.25)]

    asyncio.run(main())


def test_real_estimators_load_from_bytes_and_predict() -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(60, 3))
    blobs = {
        f"clf-{k}": pickle.dumps(
            LogisticRegression().fit(features, (features[:, k] > 0).astype(int))
        )
        for k in range(3)
    }
    unloaded: list[str] = []

    async def main() -> None:
        cache = ModelCache(
            lambda name: pickle.loads(blobs[name]),
            lambda model: unloaded.append(type(model).__name__),
            max_models=2,
        )
        for name in ("clf-0", "clf-1", "clf-0", "clf-2"):
            k = int(name[-1])
            async with cache.acquire(name) as model:
                predicted = model.predict(features)
                assert (predicted == (features[:, k] > 0)).mean() > 0.9
        assert cache.loaded_models() == ["clf-0", "clf-2"]
        assert unloaded == ["LogisticRegression"]
        await cache.unload_all()
        assert len(unloaded) == 3

    asyncio.run(main())
