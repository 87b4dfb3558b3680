"""Issue 43: a bad --gateways-per-node, or a port this machine cannot give, fails `serving up` at
once with a message naming it, before any gateway is deployed. Ray's node list is replaced by fake
nodes (no Ray started); the port check binds a real socket."""

from __future__ import annotations

import argparse
import socket

import pytest

from serving.ray_wing import server_start
from serving.settings import ServerSettings


def test_zero_gateways_per_node_is_refused_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from serving.cli.up import _settings

    arguments = {
        "host": None,
        "port": None,
        "state": None,
        "api_identities": None,
        "model_root": None,
        "instance_types": None,
        "allow_anonymous": False,
        "gateways_per_node": 0,
    }
    with pytest.raises(SystemExit) as exited:
        _settings(argparse.Namespace(**arguments), None)
    assert exited.value.code == 2
    assert (
        "--gateways-per-node: Input should be greater than or equal to 1" in capsys.readouterr().err
    )


def test_more_gateways_than_a_nodes_cpus_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = [
        {"Alive": True, "Resources": {"CPU": 4.0}},
        {"Alive": True, "Resources": {"CPU": 2.0}},
        {"Alive": False, "Resources": {"CPU": 1.0}},
    ]
    monkeypatch.setattr(server_start.ray, "nodes", lambda: nodes)
    monkeypatch.setattr(
        server_start, "_start_container_host", lambda stacks: pytest.fail("host started first")
    )
    monkeypatch.setattr(
        server_start, "registry_handle", lambda: pytest.fail("registry started before the check")
    )
    with pytest.raises(
        RuntimeError,
        match=r"--gateways-per-node 3 is more than a node of this cluster has CPUs \(2\)",
    ):
        server_start.start_gateway(ServerSettings(port=0, gateways_per_node=3))


def test_a_port_held_on_this_machine_is_refused_before_any_gateway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        server_start.ray, "nodes", lambda: pytest.fail("asked Ray before checking the port")
    )
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(
            RuntimeError, match=f"cannot bind 127.0.0.1:{port}: Address already in use"
        ):
            server_start.start_gateway(ServerSettings(port=port), exclusive=True)


def test_a_held_grpc_port_is_refused_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        server_start.ray, "nodes", lambda: pytest.fail("asked Ray before checking the gRPC port")
    )
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(
            RuntimeError, match=f"cannot bind 127.0.0.1:{port}: Address already in use"
        ):
            server_start.start_gateway(ServerSettings(port=0, grpc_port=port), exclusive=True)
