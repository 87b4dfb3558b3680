"""A driver's process tree from /proc: every process it started, their memory (PSS/USS/RSS) and CPU
time, and which process listens on a URL's port."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from loadtests.harness.cpu import logical_parent, read_procs
from loadtests.harness.processes import BenchError

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def parent_of(pid: int) -> int | None:
    """The parent pid, or None when the process is gone. A container process forked from its
    stack's template (`serving/model_server/fork_template.py`) counts as its supervisor's child, as
    a fresh one is."""
    parent = _real_parent(pid)
    return None if parent is None else logical_parent(parent, title(pid))


def is_template(pid: int) -> bool:
    """Whether a process is a stack's template, from which container processes are forked."""
    return "serving.model_server.fork_template" in title(pid)


def templates_of(code: Path) -> list[int]:
    """The stack templates running now whose code is the checkout at `code` (a template's command
    line names it: one runs per stack and per code)."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
        and is_template(int(entry.name))
        and f" {code} " in f" {title(int(entry.name))} "
    ]


def stop_templates(code: Path, timeout: float = 30.0) -> None:
    """Stop the templates of `code` (a server of that checkout started them; unused, they would
    linger `fork_template.LINGER_S` and the next server of that checkout would start warm), and
    wait, bounded, until they are gone."""
    for pid in templates_of(code):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while templates_of(code) and time.monotonic() < deadline:
        time.sleep(0.1)


def process_tree(root: int | None = None) -> list[int]:
    """This driver (what `serving up` is), or process `root`, and every process it started: Ray's,
    Serve's, the replicas, and the stack templates its container processes were forked from (which
    are nobody's children)."""
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    parents = {pid: parent_of(pid) for pid in pids}
    root = os.getpid() if root is None else root
    tree, frontier = [root], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        tree += children
        frontier = children
    templates = {_real_parent(pid) for pid in tree} - set(tree)
    return tree + sorted(pid for pid in templates if pid is not None and is_template(pid))


def _real_parent(pid: int) -> int | None:
    """The kernel's parent pid (the field after the state; comm may hold spaces)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def title(pid: int) -> str:
    """A process's command line, its arguments joined by spaces ("" once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def smaps(pid: int) -> dict[str, int] | None:
    """PSS, USS (private pages), shared pages and RSS of a process, in bytes, from
    /proc/PID/smaps_rollup."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kib = {}
    for line in text.splitlines()[1:]:
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            kib[key] = int(value.split()[0])
    return {
        "pss": kib.get("Pss", 0) * 1024,
        "rss": kib.get("Rss", 0) * 1024,
        "uss": (kib.get("Private_Clean", 0) + kib.get("Private_Dirty", 0)) * 1024,
        "shared": (kib.get("Shared_Clean", 0) + kib.get("Shared_Dirty", 0)) * 1024,
    }


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far; raises OSError once it is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds (user + system) the whole tree (of `root`, else this driver) has used so far."""
    total = 0.0
    for pid in process_tree(root):
        try:
            total += process_cpu_seconds(pid)
        except OSError:
            continue
    return total


def idle_cpu(window: float, root: int | None = None) -> float:
    """Cores the whole tree (of `root`, else this driver) uses, on average over `window` seconds
    (call it while no request runs)."""
    before = tree_cpu_seconds(root)
    time.sleep(window)
    return (tree_cpu_seconds(root) - before) / window


def listener(url: str):
    """The psutil.Process listening on `url`'s port on this machine, or None."""
    import psutil

    port = int(url.rsplit(":", 1)[1])
    for connection in psutil.net_connections("tcp"):
        if (
            connection.status == psutil.CONN_LISTEN
            and connection.laddr.port == port
            and connection.pid
        ):
            return psutil.Process(connection.pid)
    return None


def gateway_and_container(endpoint: str) -> dict[str, int]:
    """The gateway's process and `endpoint`'s (first) container process, by PID: {"gateway": ..,
    "container": ..}."""
    table = read_procs()
    found: dict[str, int] = {}
    for pid, (_, parent, _, cmdline, _) in table.items():
        if cmdline.startswith(("ray::NodeGateway", "ray::ServeReplica:serving-gateway")):
            found["gateway"] = pid
        elif "serving.model_server.main" in cmdline and (
            f"serving.model_server.main {endpoint}/" in cmdline  # its title, wherever supervised
            or table.get(parent, ("",) * 4)[3].startswith(f"ray::ServeReplica:{endpoint}.")
        ):
            found["container"] = pid
    if set(found) != {"gateway", "container"}:
        raise BenchError(f"could not find the gateway and {endpoint}'s container process: {found}")
    return found
