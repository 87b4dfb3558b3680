"""Which replica of a container a hop goes to: the least busy, a MultiModel model's home while it
keeps up, a replica on the gateway's own node while it is not much busier."""

from __future__ import annotations

import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass, field

from serving import protocol

__all__ = [
    "LOCAL_SLACK",
    "MAX_HOMES",
    "SPILL_IN_FLIGHT",
    "ModelHomes",
    "Replica",
    "choose",
    "local_hosts",
]


@dataclass
class Replica:
    """One replica's data port and the requests now in flight to it."""

    url: str
    local: bool = False  # on the gateway's own node: preferred while it has capacity
    in_flight: int = 0
    invocations_url: str = field(init=False)
    address: tuple[str, int] = field(init=False)  # (host, port) for the hop client

    def __post_init__(self) -> None:
        self.invocations_url = self.url + protocol.INVOCATIONS_PATH
        parts = urllib.parse.urlsplit(self.url)
        self.address = (parts.hostname or "", parts.port or 80)


# A MultiModel request goes to the replica that last served its model (it holds it loaded),
# unless that replica has this many more requests in flight than the least busy one: then a
# second replica loads the model too, so a hot model spreads instead of queueing on one.
SPILL_IN_FLIGHT = 2
# A replica on the gateway's own node (a Unix socket, no network) is preferred while it carries at
# most this many more requests in flight than the least busy replica elsewhere; past that the hop
# leaves the node. So a node that receives all the traffic still spreads it over every node's
# replicas, by least outstanding requests.
LOCAL_SLACK = 2
MAX_HOMES = 100_000  # remembered (container, model) -> replica pairs, least recently used dropped


def local_hosts(locality_routing: bool, node_ip: str) -> frozenset[str]:
    """The addresses whose replicas a gateway on the node `node_ip` prefers (`choose`'s
    `local_first`): this node's, or none when the operator turned locality routing off."""
    return frozenset({node_ip, "127.0.0.1", "localhost"}) if locality_routing else frozenset()


def choose(
    replicas: list[Replica],
    turn: int,
    home: str | None = None,
    avoid: Replica | None = None,
    local_first: bool = False,
) -> Replica:
    """The replica for the next hop; `turn` rotates the start, so that ties spread evenly."""
    start = turn % len(replicas)
    ordered = replicas[start:] + replicas[:start]
    if avoid is not None and len(ordered) > 1:
        ordered = [replica for replica in ordered if replica is not avoid]
    least = min(ordered, key=lambda replica: replica.in_flight)
    if home is not None:
        for replica in replicas:
            if replica.url == home and replica.in_flight <= least.in_flight + SPILL_IN_FLIGHT:
                return replica
    if not least.local and local_first:
        local = [replica for replica in ordered if replica.local]
        if local:
            nearest = min(local, key=lambda replica: replica.in_flight)
            if nearest.in_flight <= least.in_flight + LOCAL_SLACK:
                return nearest
    return least


class ModelHomes:
    """(endpoint, container, model) -> the replica URL that last served that model, at most
    MAX_HOMES of them, the least recently used dropped."""

    def __init__(self) -> None:
        self._homes: OrderedDict[tuple[str, str, str], str] = OrderedDict()

    def get(self, key: tuple[str, str, str]) -> str | None:
        return self._homes.get(key)

    def remember(self, key: tuple[str, str, str], url: str) -> None:
        self._homes[key] = url
        self._homes.move_to_end(key)
        if len(self._homes) > MAX_HOMES:
            self._homes.popitem(last=False)
