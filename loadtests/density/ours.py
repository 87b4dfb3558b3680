"""Ours, per container: what its supervisor's Ray worker (a Serve replica of its own, or a share of
its node's container host: `model_server.supervisor.ContainerProcess` runs in it) and the container
process it started hold. Runs in bench_consolidation's scenario child, the Ray driver, after its
idle window."""

from __future__ import annotations

from typing import Any

from loadtests.density import smaps as by_package
from loadtests.density.imports import outside_sharers
from loadtests.harness.proctree import is_template, process_tree, smaps, title


def _sum(infos: list[dict[str, int]]) -> dict[str, int]:
    keys = ("pss", "uss", "shared", "rss")
    return {key: sum(info[key] for info in infos) for key in keys}


def _hosted_rows(
    host: int, stacks: dict[str, str], rows: list[dict[str, Any]], packages: dict[str, Any]
) -> None:
    """A container host's replicas: each container process, and an equal share of the host (the
    one Ray worker that supervises them all)."""
    children = [child for child in process_tree(host)[1:] if not is_template(child)]
    found = []
    for child in children:
        command = title(child)
        if not command.startswith("serving.model_server.main "):
            continue
        info = smaps(child)
        if info:
            found.append((child, command.split()[1].partition("/")[2], info))
    worker = smaps(host)
    if worker is None or not found:
        return
    share = {key: value // len(found) for key, value in worker.items()}
    for child, hostname, info in found:
        stack = stacks.get(hostname, "unknown")
        rows.append(
            {
                "hostname": hostname,
                "stack": stack,
                "worker": share,
                "container": _sum([info]),
                "container_processes": 1,
            }
        )
        if stack not in packages:
            packages[stack] = {
                "hostname": hostname,
                "hosted": True,
                "worker": by_package.read(host),
                "container": by_package.read(child),
            }


def per_container(stacks: dict[str, str]) -> dict[str, Any]:
    """One row per container replica: its Ray worker's and its container process's PSS, USS and
    shared pages; and, for the first replica of each stack, both processes' memory by package."""
    rows, packages = [], {}
    for pid in process_tree():
        command = title(pid)
        if command.startswith("ray::ContainerHost"):
            _hosted_rows(pid, stacks, rows, packages)
            continue
        if "ServeReplica:" not in command or "ServeReplica:serving-gateway" in command:
            continue
        # ray::ServeReplica:<endpoint>.<container>.<version>:<container>
        hostname = command.split("ServeReplica:", 1)[1].split()[0].rsplit(":", 1)[-1]
        stack = stacks.get(hostname, "unknown")
        worker = smaps(pid)
        # the container process (the launcher exec'd into it, or forked from its stack's template;
        # a template its replica happened to start is counted apart)
        children = [child for child in process_tree(pid)[1:] if not is_template(child)]
        infos = [info for info in map(smaps, children) if info]
        if worker is None or not infos:
            continue
        rows.append(
            {
                "hostname": hostname,
                "stack": stack,
                "worker": worker,
                "container": _sum(infos),
                "container_processes": len(infos),
            }
        )
        if stack not in packages:
            packages[stack] = {
                "hostname": hostname,
                "worker": by_package.read(pid),
                "container": by_package.read(children[0]),
            }
    return {
        "containers": rows,
        "packages": packages,
        "outside_sharers": outside_sharers(process_tree()),
        # the stack templates the container processes were forked from (none when started fresh)
        "templates": [info for info in map(smaps, filter(is_template, process_tree())) if info],
    }
