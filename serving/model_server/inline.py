"""When a container process may run a prediction on its event loop instead of handing it to a worker
thread.

The hand-off to a thread and back costs more CPU than a small model's own prediction
(docs/benchmarks/bench_batching.md), so a model shown to be fast runs on the loop, which then waits
for it (and so do `/ping` and every other request) for about the budget
(`concurrency.inline_budget_s`) at most. `InlineGate` judges what the model did, not what the
machine did to it: its CPU time, less the garbage collections it happened to trigger (`GcClock`),
and, on the loop, its waits for anything but a core (`RunQueueClock`). The rules users see:
docs/spec.md, `Batching`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
from collections.abc import Iterator

STREAK = 8  # fast predictions in a row before one runs on the loop
MAX_STREAK = 1024  # the most a model that was caught waiting must wait for its next try on the loop
# run time, run-queue delay, time slices (ns); Linux's CONFIG_SCHED_INFO
SCHEDSTAT = "/proc/thread-self/schedstat"


class RunQueueClock:
    """Seconds the calling thread has waited for a core so far (0.0 where the kernel does not
    say)."""

    def __init__(self, path: str = SCHEDSTAT) -> None:
        self.path = path
        self._local = threading.local()  # the file names the thread that opened it: one per thread

    def __call__(self) -> float:
        fd = getattr(self._local, "fd", None)
        if fd is None:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                fd = -1
            self._local.fd = fd
        if fd < 0:
            return 0.0
        try:
            return int(os.pread(fd, 64, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0


class GcClock:
    """CPU seconds the calling thread has spent in garbage collections so far, from `gc.callbacks`
    once installed.

    A collection runs in the thread whose allocation triggered it, holding the GIL from its start to
    its stop callback, and collections do not nest, so one start time serves every thread. It is not
    the model's time: it stalls the loop wherever it runs, and moving the model to a thread would
    not spare the loop one."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._started = 0.0

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        now = time.thread_time()
        if phase == "start":
            self._started = now
        else:
            self._local.spent = getattr(self._local, "spent", 0.0) + now - self._started

    def __call__(self) -> float:
        return getattr(self._local, "spent", 0.0)


GC_CLOCK = GcClock()  # one per process, as gc.callbacks is


@contextlib.contextmanager
def loop_hidden() -> Iterator[None]:
    """Run a prediction on the loop as if on a thread of its own: a handler that calls
    `asyncio.run` (an async client, say) works there as it does on the worker thread and in AWS's
    toolkits, whose handlers run in no event loop. Only the running-loop marker asyncio keeps for
    this thread is lifted, and put back however the call ends."""
    running = asyncio.events._get_running_loop()
    asyncio.events._set_running_loop(None)
    try:
        yield
    finally:
        asyncio.events._set_running_loop(running)


class InlineGate:
    """Counts fast predictions in a row; `open` says whether the next one may run on the event loop.

    A prediction over the budget of CPU closes the gate; `required` fast ones in a row open it
    again. On the loop only, a prediction that waited longer than the budget (I/O, its own threads)
    also closes it and doubles `required` (up to MAX_STREAK), so a model that waits blocks the loop
    about log2(n) times in n predictions; as many good runs on the loop halve it again. Waiting is
    not judged on a worker thread, whose wall time also counts its waits for the GIL, which the loop
    holds while it answers other requests."""

    def __init__(self, budget_s: float, streak: int = STREAK) -> None:
        self.budget_s = budget_s
        self.streak = streak
        self.required = streak  # fast predictions in a row before the next runs on the loop
        self._fast = 0
        self._good_on_loop = 0  # runs on the loop without waiting, since `required` last changed
        self.inline = 0  # predictions run on the loop (the stats say how many)

    @property
    def open(self) -> bool:
        return self.budget_s > 0 and self._fast >= self.required

    def record(self, cpu_s: float, waited_s: float | None = None) -> None:
        """One prediction's CPU time on its thread and, for one run on the loop, the time it spent
        neither running nor waiting for a core (None on a worker thread); a failed one counts too.

        CPU time, not wall time, measures computing: on a busy machine the wall time of a 0.5 ms
        prediction often passes 2 ms while other processes hold the cores, and closing the gate then
        would add the hand-off's CPU exactly when CPU is short."""
        if cpu_s > self.budget_s:
            self._fast = 0
            return
        if waited_s is not None:
            if waited_s > self.budget_s:
                self._fast = self._good_on_loop = 0
                self.required = min(self.required * 2, MAX_STREAK)
                return
            self._good_on_loop += 1
            if self.required > self.streak and self._good_on_loop >= self.required:
                self.required, self._good_on_loop = max(self.required // 2, self.streak), 0
        self._fast += 1
