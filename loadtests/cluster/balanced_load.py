"""Callers behind an L4 balancer, run in the simulation's load namespace.

    python -m loadtests.cluster.balanced_load --hosts 10.77.0.11,10.77.0.12 --endpoint NAME
        [--container HOST] [--seconds 20] [--callers 4] [--stop-file PATH]

Each caller sends InvokeEndpoint calls one after another. The balancer is the caller's choice of host:
the next address in turn among those it believes up, as a network load balancer spreads connections;
an address whose connection failed or timed out is taken out for `DOWN_S` (its health check), as a
balancer stops sending to a target that fails. A call whose connection breaks, is refused or gets no
answer within `TIMEOUT_S` is sent again on the next host, up to `ATTEMPTS` times in all, as botocore's
default (legacy) retry mode does for connection errors; an HTTP answer of any status is final. Prints
one JSON line: every call's outcome, the hosts calls entered, the attempts and the container process
that answered (the echo model's PID).
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ATTEMPTS = 5  # botocore's legacy mode: the call and 4 retries
TIMEOUT_S = 5.0
DOWN_S = 10.0  # a failed target stays out this long
PAUSE_S = 0.05  # between one caller's calls


class Balancer:
    """Round robin over the addresses not marked down."""

    def __init__(self, hosts: list[str]) -> None:
        self.hosts = hosts
        self.down: dict[str, float] = {}
        self.turn = 0
        self.lock = threading.Lock()

    def pick(self) -> str:
        with self.lock:
            now = time.monotonic()
            up = [host for host in self.hosts if self.down.get(host, 0) <= now] or self.hosts
            self.turn += 1
            return up[self.turn % len(up)]

    def failed(self, host: str) -> None:
        with self.lock:
            self.down[host] = time.monotonic() + DOWN_S


def call(host: str, port: int, endpoint: str, container: str | None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    headers = {"Content-Type": "application/json"}
    if container:
        headers["X-Amzn-SageMaker-Target-Container-Hostname"] = container
    try:
        connection.request("POST", f"/endpoints/{endpoint}/invocations", b'{"x": 1}', headers)
        answer = connection.getresponse()
        body = answer.read()
        try:
            return answer.status, json.loads(body)
        except ValueError:
            return answer.status, body.decode(errors="replace")[:200]
    finally:
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", required=True, help="comma-separated gateway addresses")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--container")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--stop-file", help="stop early once this file exists (the test's signal)")
    args = parser.parse_args()
    balancer = Balancer(args.hosts.split(","))
    outcomes: Counter = Counter()
    entered: Counter = Counter()
    attempts: Counter = Counter()
    answered_by: Counter = Counter()
    failures: list[str] = []
    lock = threading.Lock()
    until = time.monotonic() + args.seconds

    def running() -> bool:
        return time.monotonic() < until and not (args.stop_file and Path(args.stop_file).exists())

    def caller() -> None:
        while running():
            for attempt in range(1, ATTEMPTS + 1):
                host = balancer.pick()
                try:
                    status, body = call(host, args.port, args.endpoint, args.container)
                except (OSError, http.client.HTTPException) as error:
                    balancer.failed(host)
                    if attempt == ATTEMPTS:
                        with lock:
                            outcomes[type(error).__name__] += 1
                            failures.append(f"{host}: {error!r}")
                    continue
                with lock:
                    outcomes[status] += 1
                    entered[host] += 1
                    attempts[attempt] += 1
                    if isinstance(body, dict) and "pid" in body:
                        answered_by[f"{host}>{body['pid']}"] += 1
                    elif status != 200:
                        failures.append(f"{host}: {status} {body}")
                break
            time.sleep(PAUSE_S)

    threads = [threading.Thread(target=caller) for _ in range(args.callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(
        json.dumps(
            {
                "outcomes": {str(k): v for k, v in outcomes.items()},
                "entered": dict(entered),
                "attempts": {str(k): v for k, v in attempts.items()},
                "answered_by": dict(answered_by),
                "failures": failures[:20],
            }
        )
    )


if __name__ == "__main__":
    main()
