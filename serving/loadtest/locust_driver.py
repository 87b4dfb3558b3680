"""Locust glue: every use of Locust's API is here (`__main__` only imports it first, for gevent's
patching).

Two load modes over one send path: closed loop (`--users N`: each user sends its next request when
the last is answered) and open loop (`--rate R`: each request launched at its intended time,
answered or not, so no coordinated omission; a request due while `--max-in-flight` are out is
counted as dropped, and latency runs from the intended send time, so a generator falling behind
shows as latency and `lag_ms`, not as missing samples). Runs end by a flag, not by killing users:
requests in flight are waited for, so every request the server saw is counted.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable
from typing import Any

import gevent
import gevent.pool
import locust  # noqa: F401, I001  (already first in `python -m serving.loadtest`; first here too in any case)
from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser
from locust.env import Environment
from locust.runners import STATE_STOPPED, STATE_STOPPING

from serving import protocol
from serving.loadtest import probe
from serving.loadtest.options import Plan, Prepared
from serving.loadtest.recorder import RunResult
from serving.loadtest.scenarios import Target, arrival_times

TICK_S = 0.1  # how often the control loop checks the deadline


class Load:
    """State shared by the users of one run: what to send, whether to keep sending, and the
    results."""

    def __init__(
        self, plan: Plan, result: RunResult, requests: dict[Target, Prepared], signing_base: str
    ) -> None:
        self.plan, self.result, self.requests = plan, result, requests
        self.signing_base = signing_base  # the URL origin + prefix the requests are signed for
        # perf_counter at the run's time 0 (set by the first user to start)
        self.t0: float | None = None
        self.stopping = False
        self.exhausted = False  # --max-requests reached
        self.schedule_done = False  # the open-loop schedule has no more arrivals
        self.launched = 0
        self.in_flight = 0
        self._next_index = 0
        self.pool: gevent.pool.Pool | None = None

    def begin(self) -> float:
        if self.t0 is None:
            self.t0 = time.perf_counter()
            self.result.started_at = time.time()
        return self.t0

    def elapsed(self) -> float:
        return 0.0 if self.t0 is None else time.perf_counter() - self.t0

    def next_index(self) -> int:
        self._next_index += 1
        return self._next_index - 1

    def claim(self) -> bool:
        """Take one request from the --max-requests budget; False once the run should send no
        more."""
        if self.stopping:
            return False
        if not self.plan.open_loop and self.t0 is not None and self.elapsed() >= self.plan.duration:
            # users stop at the deadline themselves, not a control-loop tick later
            self.stopping = True
            return False
        if self.plan.max_requests is not None and self.launched >= self.plan.max_requests:
            self.exhausted = True
            return False
        self.launched += 1
        return True

    def active_users(self) -> int:
        return int(math.floor(self.plan.level_at(self.elapsed()) + 0.5))

    def rng(self, stream: int) -> random.Random:
        return random.Random(self.plan.seed * 1_000_003 + stream)


def send(client: Any, load: Load, target: Target, intended: float) -> None:
    """Send one invocation and record it; latency runs from `intended` (perf_counter) to the full
    answer.

    The caller counted the request in `load.in_flight` when it launched it: a greenlet the scheduler
    has spawned may not have started yet when the control loop looks, and the run must not end
    without it."""
    try:
        prepared = load.requests[target]
        url = load.signing_base + prepared.path
        headers = {
            **prepared.headers,
            **load.plan.auth.headers("POST", url, prepared.headers, prepared.body),
        }
        with client.request(
            "POST",
            prepared.path,
            data=prepared.body,
            headers=headers,
            name=target.label,
            catch_response=True,
        ) as response:
            latency_ms = (time.perf_counter() - intended) * 1000
            # Locust's own stats (web UI) agree with ours
            response.request_meta["response_time"] = latency_ms
            status = response.status_code or 0
            code = None if 200 <= status < 300 else error_code(status, response)
            if code is None:
                response.success()
            else:
                response.failure(code)
        load.result.add(
            intended - (load.t0 or intended), latency_ms, target.label, target.model, status, code
        )
    finally:
        load.in_flight -= 1


def error_code(status: int, response: Any) -> str:
    """The SageMaker error code of a failed answer (x-amzn-ErrorType, else the body's __type), else
    a name for what went wrong (`HTTP 502`, or the exception when no answer came)."""
    if not status:
        error = getattr(response, "error", None)
        return type(error).__name__ if error is not None else "NoResponse"
    headers = response.headers or {}
    header = headers.get(protocol.ERROR_TYPE_HEADER) or headers.get(
        protocol.ERROR_TYPE_HEADER.lower()
    )
    if header:
        return str(header).split(":")[0]
    try:
        document = json.loads(response.content or b"")
        if isinstance(document, dict) and document.get("__type"):
            return str(document["__type"])
    except (ValueError, TypeError):
        pass
    return f"HTTP {status}"


class _Invoker(FastHttpUser):
    """Closed loop: send, wait for the answer, send again (no think time)."""

    abstract = True
    wait_time = constant(0)
    load: Load

    def on_start(self) -> None:
        self.load.begin()
        self.index = self.load.next_index()
        self.random = self.load.rng(self.index + 1)

    @task
    def invoke(self) -> None:
        load = self.load
        # The step scenario gates users by index rather than stopping them, so no request is killed
        # mid-flight.
        if load.stopping or self.index >= load.active_users():
            gevent.sleep(0.05)  # idle: stopping, or this user is above the step's current level
            return
        if not load.claim():
            return
        intended = time.perf_counter()
        load.in_flight += 1
        send(
            self.client,
            load,
            load.plan.scenario.target(intended - (load.t0 or intended), self.random),
            intended,
        )


class _Scheduler(FastHttpUser):
    """Open loop: the one user that launches every request on schedule, each in its own greenlet."""

    abstract = True
    wait_time = constant(0)
    load: Load

    @task
    def schedule(self) -> None:
        load, plan = self.load, self.load.plan
        if load.schedule_done:
            gevent.sleep(0.1)
            return
        t0 = load.begin()
        pool = load.pool = gevent.pool.Pool(plan.max_in_flight)
        targets, arrivals = load.rng(0), (load.rng(10**6) if plan.poisson else None)
        try:
            for due in arrival_times(plan.level_at, plan.duration, arrivals):
                intended = t0 + due
                _sleep_until(intended)
                if not load.claim():
                    break
                target = plan.scenario.target(due, targets)
                if pool.full():
                    load.result.drop(due, target.label)
                    continue
                load.result.lag_ms.append((time.perf_counter() - intended) * 1000)
                # from the launch, not from when the greenlet first runs (see send)
                load.in_flight += 1
                pool.spawn(send, self.client, load, target, intended)
        finally:
            load.schedule_done = True


def _sleep_until(when: float) -> None:
    """Yield to the other greenlets at least once, and return no earlier than `when` (perf_counter).

    gevent's timers run on the event loop's cached clock, which lags real time after a busy
    iteration, so one sleep can end early: sleep again for what is left rather than send early.
    """
    gevent.sleep(max(when - time.perf_counter(), 0.0))  # sleep(0) when late: still lets answers in
    while (left := when - time.perf_counter()) > 0:
        gevent.sleep(left)


def _user_class(load: Load, host: str) -> type[FastHttpUser]:
    plan = load.plan
    base = _Scheduler if plan.open_loop else _Invoker
    attributes = {
        "load": load,
        "host": host,
        "network_timeout": plan.timeout,
        "connection_timeout": min(plan.timeout, 10.0),
        "insecure": False,
        "concurrency": plan.max_in_flight if plan.open_loop else 1,
    }
    return type("OpenLoopUser" if plan.open_loop else "ClosedLoopUser", (base,), attributes)


def _poll_replicas(plan: Plan, load: Load, result: RunResult) -> None:
    """Record each container's CurrentReplicas every poll interval; failures are noted, never
    fatal."""
    while True:
        sample_replicas(plan, result, load.elapsed())
        gevent.sleep(plan.poll_interval)


def sample_replicas(plan: Plan, result: RunResult, at: float) -> None:
    try:
        description = probe.describe(
            plan.base_url, plan.endpoint, plan.auth, timeout=min(5.0, plan.timeout)
        )
        result.replicas.append((round(at, 3), probe.replica_counts(description)))
    except probe.ProbeError as error:
        if len(result.replica_errors) < 20:
            result.replica_errors.append(f"{at:.1f}s: {error}")


def run_load(
    plan: Plan,
    name: str,
    host: str,
    requests: dict[Target, Prepared],
    signing_base: str,
    poll: bool = True,
    web_port: int | None = None,
    on_progress: Callable[[Load], None] | None = None,
) -> RunResult:
    """Run one load against `host` (origin + prefix of the request paths) and return its raw
    result."""
    # its "spawn rate > 100" warning: we spawn at once
    logging.getLogger("locust.runners").setLevel(logging.ERROR)
    result = RunResult(name)
    load = Load(plan, result, requests, signing_base)
    users = 1 if plan.open_loop else max(1, int(math.ceil(plan.peak_level)))
    environment = Environment(user_classes=[_user_class(load, host)], host=host)
    runner = environment.create_local_runner()
    if web_port is not None:
        environment.create_web_ui("127.0.0.1", web_port)
        # let the UI finish starting before the schedule begins: it shares this event loop
        gevent.sleep(1.0)
    poller = gevent.spawn(_poll_replicas, plan, load, result) if poll else None
    runner.start(users, spawn_rate=users)
    try:
        last_report = 0.0
        while True:
            gevent.sleep(TICK_S)
            # The open loop ends with its schedule (every arrival due before the deadline is sent,
            # late if need be), unless the generator has fallen hopelessly behind; the closed loop
            # at the deadline.
            overtime = max(5.0, 0.1 * plan.duration) if plan.open_loop else 0.0
            if load.t0 is not None and load.elapsed() >= plan.duration + overtime:
                break
            if load.exhausted or runner.state in (STATE_STOPPING, STATE_STOPPED):
                result.interrupted = runner.state in (STATE_STOPPING, STATE_STOPPED)
                break
            if load.schedule_done and load.in_flight == 0:
                break
            if on_progress and load.elapsed() - last_report >= 5:
                last_report = load.elapsed()
                on_progress(load)
    except KeyboardInterrupt:
        result.interrupted = True
    load.stopping = True
    _drain(load, plan.timeout + 5.0)
    result.ended_at = time.time()
    result.cpu_warning = bool(runner.cpu_warning_emitted)
    if poller is not None:
        poller.kill()
        sample_replicas(plan, result, load.elapsed())
    if web_port is None:
        runner.quit()
    else:
        runner.stop()  # leave the web UI up with the final numbers
    result.levels = [plan.level_at(second + 0.5) for second in range(int(math.ceil(plan.duration)))]
    return result


def _drain(load: Load, timeout: float) -> None:
    """Wait for requests in flight to be answered (or time out); count and kill the rest."""
    deadline = time.perf_counter() + timeout
    try:
        while load.in_flight > 0 and time.perf_counter() < deadline:
            gevent.sleep(0.02)
    except KeyboardInterrupt:
        load.result.interrupted = True
    load.result.unfinished = load.in_flight
    if load.pool is not None:
        load.pool.kill(block=False)


def serve_web_ui_until_interrupted() -> None:
    """Keep the process (and the web UI) alive after the run, until Ctrl-C."""
    try:
        while True:
            gevent.sleep(1.0)
    except KeyboardInterrupt:
        pass


__all__ = ["Load", "run_load", "send", "serve_web_ui_until_interrupted"]
