"""serving.ray_wing.gateway_count: the gateway deployment follows the live nodes (issue 43). Ray's
node list is replaced by a counter the test moves, and Serve's policy context by the two fields the
policy reads; the policy itself runs in Serve's controller in the multinode tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from serving.ray_wing import gateway_count
from serving.ray_wing.gateway_count import GatewayCount, autoscaling_config


def test_per_node_gateways_follow_nodes_that_join_and_leave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = [1]
    monkeypatch.setattr(gateway_count, "live_nodes", lambda: nodes[0])
    clock = [0.0]
    monkeypatch.setattr(gateway_count.time, "monotonic", lambda: clock[0])
    policy, context = GatewayCount(per_node=2), SimpleNamespace(policy_state={"kept": True})
    assert policy(context) == (2, {"kept": True})
    nodes[0] = 3  # two nodes join
    assert policy(context)[0] == 2  # counted again only after NODES_TTL_S
    clock[0] += gateway_count.NODES_TTL_S + 0.1
    assert policy(context)[0] == 6
    nodes[0] = 2  # one leaves
    clock[0] += gateway_count.NODES_TTL_S + 0.1
    assert policy(context)[0] == 4


def test_an_unreadable_node_list_keeps_the_last_count(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable() -> int:
        raise ConnectionError("GCS")

    policy, context = GatewayCount(per_node=1), SimpleNamespace(policy_state={})
    monkeypatch.setattr(gateway_count, "live_nodes", lambda: 2)
    assert policy(context)[0] == 2
    monkeypatch.setattr(gateway_count, "live_nodes", unreachable)
    policy._counted_at = float("-inf")
    assert policy(context)[0] == 2


def test_the_deployment_starts_with_every_node_served() -> None:
    config = autoscaling_config(per_node=2, nodes=3)
    assert (config["min_replicas"], config["initial_replicas"]) == (2, 6)
    assert config["policy"]["policy_function"] == "serving.ray_wing.gateway_count:GatewayCount"
