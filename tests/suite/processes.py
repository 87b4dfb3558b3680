"""Who holds a port, and what a process is, read from /proc: tests signal only processes they have
identified by title (a guess once killed the raylet, and the node with it)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil

CONTAINER_MAIN = "serving.model_server.main"
SERVE_REPLICA = "ray::ServeReplica:"
CONTAINER_HOST = "ray::ContainerHost"


def holders(url: str) -> list[psutil.Process]:
    """The processes holding a port's listening socket. A container's data port is held by the
    supervisor that bound it (a Serve replica, or its node's container host) and by the container
    process it passed it to (its child, or a child of its stack's template). The gateway's port has
    one holder."""
    port = int(url.rsplit(":", 1)[1])
    # psutil names one process per socket: every holder is found by the socket's inode
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    found = {
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and inodes & open_files(entry)
    }
    if not found:
        raise AssertionError(f"nothing listens on {url}")
    return [psutil.Process(pid) for pid in sorted(found)]


def open_files(process: Path) -> set[str]:
    """What a process's descriptors point to, read one by one: a descriptor closed while they are
    listed is skipped, not the process (a busy Ray worker opens and closes them all the time)."""
    try:
        descriptors = list((process / "fd").iterdir())
    except OSError:
        return set()
    found = set()
    for descriptor in descriptors:
        with contextlib.suppress(OSError):
            found.add(os.readlink(descriptor))
    return found


def title(process: psutil.Process) -> str:
    """Its command line; empty for a process that is gone or not ours to read."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def supervisor_of(url: str, kind: str | None = None) -> psutil.Process:
    """The Ray worker that supervises a container's data port (a Serve replica or a container host;
    `kind`: that title prefix only), checked by its process title."""
    kinds = (kind,) if kind else (SERVE_REPLICA, CONTAINER_HOST)
    deadline = time.monotonic() + 10  # a replica that just registered may still be naming itself
    while True:
        found = [p for p in holders(url) if title(p).startswith(kinds)]
        if len(found) == 1:
            return found[0]
        if time.monotonic() > deadline:
            titles = [(p.pid, title(p)[:80]) for p in holders(url)]
            raise AssertionError(f"no one supervisor owns {url} (holders: {titles})")
        time.sleep(0.2)


def container_process(url: str) -> psutil.Process:
    """The container process serving a data port (the model server its supervisor started), checked
    by its command."""
    found = [p for p in holders(url) if CONTAINER_MAIN in title(p)]
    if not found:
        raise AssertionError(f"no container process serves {url} (holders: {holders(url)})")
    return found[0]


def listener(url: str) -> psutil.Process:
    """The process serving a port: a container's process, else its only holder."""
    found = holders(url)
    containers = [p for p in found if CONTAINER_MAIN in title(p)]
    return containers[0] if containers else found[0]
