"""Locality-aware routing (issue 43): a gateway prefers its own node's replicas while they have
capacity, and spills over to other nodes by least outstanding requests.

Real `ContainerTransport`, real HTTP over loopback: a replica on 127.0.0.1 stands for one on the
gateway's node, one on 127.0.0.2 (also loopback on Linux) for one on another node. Each answers
after a delay, so requests overlap.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from serving.cli import build_parser
from serving.cli.up import _settings
from serving.gateway.replica_choice import local_hosts
from serving.gateway.transport import LOCAL_SLACK, ContainerTransport

DELAY_S = 0.05


class SlowReplica:
    """An HTTP/1.1 server answering every request after DELAY_S, counting requests and the most it
    held at once."""

    def __init__(self, host: str) -> None:
        self.host, self.served, self.now, self.most = host, 0, 0, 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, self.host, 0)
        return f"http://{self.host}:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.now += 1
                self.most = max(self.most, self.now)
                await asyncio.sleep(DELAY_S)
                self.now -= 1
                self.served += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]"
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def _route(
    calls: int, concurrency: int, locality_routing: bool = True
) -> tuple[SlowReplica, SlowReplica]:
    local, remote = SlowReplica("127.0.0.1"), SlowReplica("127.0.0.2")
    urls = [await local.start(), await remote.start()]
    # the gateway's node is 127.0.0.1, as `ray_wing.gateway` builds it
    transport = ContainerTransport(
        default_limit=64, local_hosts=local_hosts(locality_routing, "127.0.0.1")
    )
    await transport.start()
    transport.update({("e", "c"): urls})
    gate = asyncio.Semaphore(concurrency)

    async def call() -> None:
        async with gate:
            answer = await transport.send(
                "e", "c", b"{}", {"content-type": "application/json"}, timeout=10
            )
            assert answer.status == 200

    try:
        await asyncio.gather(*(call() for _ in range(calls)))
    finally:
        await transport.close()
        for replica in (local, remote):
            assert replica.server is not None
            replica.server.close()
    return local, remote


def test_one_at_a_time_every_call_stays_on_the_node() -> None:
    local, remote = asyncio.run(_route(calls=20, concurrency=1))
    assert (local.served, remote.served) == (20, 0)


def test_under_load_the_excess_spills_to_the_other_node_by_least_outstanding() -> None:
    # All traffic enters through this node (the uneven case the docs describe): the local replica
    # takes at most LOCAL_SLACK more requests in flight than the remote one, and the rest go there.
    local, remote = asyncio.run(_route(calls=120, concurrency=12))
    assert local.served + remote.served == 120
    assert remote.served > 0 and local.served > remote.served
    assert local.most <= remote.most + LOCAL_SLACK, Counter(local=local.most, remote=remote.most)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_without_node_addresses_routing_is_least_outstanding_over_all(concurrency: int) -> None:
    async def route() -> tuple[int, int]:
        a, b = SlowReplica("127.0.0.1"), SlowReplica("127.0.0.2")
        transport = ContainerTransport(default_limit=64)
        await transport.start()
        transport.update({("e", "c"): [await a.start(), await b.start()]})
        gate = asyncio.Semaphore(concurrency)

        async def call() -> None:
            async with gate:
                await transport.send("e", "c", b"{}", {}, timeout=10)

        await asyncio.gather(*(call() for _ in range(40)))
        await transport.close()
        return a.served, b.served

    served = asyncio.run(route())
    assert sum(served) == 40 and min(served) >= 10, served  # both used: no node is preferred


def test_with_locality_routing_off_calls_spread_over_both_nodes() -> None:
    # Issue 61 item 3: the operator's switch. One call at a time, which locality keeps on the node
    # (above), now goes to every node's replica in turn.
    args = build_parser().parse_args(["up", "spec.yaml", "--no-locality-routing"])
    settings = _settings(args, None)
    assert settings.locality_routing is False
    local, remote = asyncio.run(_route(calls=20, concurrency=1, locality_routing=False))
    assert local.served + remote.served == 20 and min(local.served, remote.served) >= 5, (
        local.served,
        remote.served,
    )


def test_locality_routing_is_on_unless_turned_off() -> None:
    assert _settings(build_parser().parse_args(["up", "spec.yaml"]), None).locality_routing
    assert local_hosts(True, "10.0.0.5") == {"10.0.0.5", "127.0.0.1", "localhost"}
    assert local_hosts(False, "10.0.0.5") == frozenset()
