"""Simulated gateways against the real registry: long-poll readers, each what a gateway process does with
the registry and Ray's key-value store, many to a process.

    python -m loadtests.cluster.registry_readers --address GCS --count N --first I --seconds S --out FILE

Each reader long-polls the registry exactly as `ray_wing.gateway` does, through a `RegistryFollower` of its own
(the registry's snapshot feed when it has one, each reader over its own connection, else a Ray call per poll),
notes when each version arrived, and, one reader in
`APPLY_EVERY`, applies it to a real `GatewayState` (its tables, access, descriptions) as a gateway does,
timing that. It also writes what a gateway writes to the GCS key-value store: the async journal's heartbeat
every `async_journal.HEARTBEAT_S` and its counters' exposition every `gateway_counters.PUBLISH_S`. Every
reader of a gateway applies every snapshot on its own core; on this machine a thousand of them share two,
so only a sample applies, and the apply time is reported beside the fan-out. Writes a JSON file: per
version, each reader's arrival time (wall clock, as the driver's), the apply times and the writes made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

APPLY_EVERY = 20
COUNTERS_BYTES = 6_000  # about a gateway's exposition with one endpoint's series


async def reader(
    name: str,
    registry: Any,
    until: float,
    arrivals: dict[int, list[float]],
    applies: list[float],
    apply: bool,
    paths: dict[str, int],
) -> None:
    from serving.control.status import StatusBoard
    from serving.gateway.invocation import Invocations
    from serving.gateway.state import GatewayState
    from serving.gateway.transport import ContainerTransport
    from serving.ray_wing.gateway import REGISTRY_WAIT_S
    from serving.ray_wing.operations import root_secret
    from serving.ray_wing.registry_follower import RegistryFollower
    from serving.settings import ServerSettings

    settings = ServerSettings()
    transport = ContainerTransport(default_limit=8)
    state = GatewayState(settings, Invocations(settings, transport), transport, StatusBoard())
    follower = RegistryFollower(registry, name, root_secret())
    first = registry.snapshot.remote(
        -1, 0.0, None, name
    )  # as a gateway's first read, before it listens
    follower.learn(await asyncio.wrap_future(first.future()))
    while time.monotonic() < until:
        asked = follower.via_feed
        snapshot = await follower.next(state.version, state.epoch, REGISTRY_WAIT_S)
        paths["feed" if follower.via_feed > asked else "ray"] += 1
        if snapshot is None:
            continue
        arrivals.setdefault(snapshot["version"], []).append(time.time())
        if apply:
            started = time.perf_counter()
            state.offer(snapshot)
            applies.append(time.perf_counter() - started)
        else:
            state.version, state.epoch = snapshot["version"], snapshot["epoch"]
    follower.close()


async def writer(names: list[str], until: float, writes: list[int]) -> None:
    """The key-value writes of these gateways: a journal heartbeat each every HEARTBEAT_S, counters
    every PUBLISH_S, spread over the period as independent gateways' would be."""
    from serving.ray_wing.async_journal import HEARTBEAT_S, GcsJournal
    from serving.ray_wing.gateway_counters import PUBLISH_S, GatewayCounters

    journals = [GcsJournal(owner=name) for name in names]
    counters = [GatewayCounters(name) for name in names]
    exposition = b"# counters\n" + b"x" * COUNTERS_BYTES
    tick, turn = 0.1, 0
    beats_per_tick = len(names) * tick / HEARTBEAT_S
    publishes_per_tick = len(names) * tick / PUBLISH_S
    owed_beats = owed_publishes = 0.0
    while time.monotonic() < until:
        owed_beats += beats_per_tick
        owed_publishes += publishes_per_tick
        while owed_beats >= 1:
            await asyncio.to_thread(journals[turn % len(names)].beat)
            owed_beats -= 1
            writes[0] += 1
            turn += 1
        while owed_publishes >= 1:
            await asyncio.to_thread(counters[turn % len(names)].publish, exposition)
            owed_publishes -= 1
            writes[0] += 1
            turn += 1
        await asyncio.sleep(tick)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from serving.ray_wing import registry_handle

    ray.init(address=args.address, namespace="serving", logging_level=logging.ERROR)
    registry = registry_handle()
    until = time.monotonic() + args.seconds
    arrivals: dict[int, list[float]] = {}
    applies: list[float] = []
    writes = [0]
    paths = {"feed": 0, "ray": 0}
    names = [f"sim-gateway-{args.first + i}" for i in range(args.count)]
    await asyncio.gather(
        *(
            reader(
                name, registry, until, arrivals, applies, (args.first + i) % APPLY_EVERY == 0, paths
            )
            for i, name in enumerate(names)
        ),
        writer(names, until, writes),
    )
    from serving.ray_wing.operations import control_token

    token = control_token()
    for name in names:  # as a gateway stopping cleanly
        registry.leave.remote(token, name)
    return {
        "arrivals": arrivals,
        "applies": applies,
        "writes": writes[0],
        "readers": len(names),
        "paths": paths,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    found = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(found))


if __name__ == "__main__":
    main()
