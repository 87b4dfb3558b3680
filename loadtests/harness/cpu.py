"""CPU accounting from /proc: whose process the CPU time of a window went to, and whether the
machine was quiet.

A `CpuMeter` labels every process by the role of its nearest labelled ancestor (`roles`: pid ->
role, for peers this run started), by Ray's process titles for this run's Ray, or as other processes
(not this run's).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from loadtests.harness.processes import log
from serving.model_server.fork_template import supervisor_named

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
OTHER = "other processes (not started by this run)"


def logical_parent(ppid: int, cmdline: str) -> int:
    """A process's parent, where a container process forked from its stack's template
    (`serving/model_server/fork_template.py`) counts as its supervisor's child, as a fresh one is."""
    supervisor = supervisor_named(cmdline)
    return ppid if supervisor is None else supervisor


def read_procs() -> dict[int, tuple[str, int, int, str, int]]:
    """pid -> (comm, ppid, cpu ticks, cmdline, start time in ticks after boot) for every process
    (the ppid a `logical_parent`)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        close = stat.rfind(")")
        comm = stat[stat.find("(") + 1 : close]
        fields = stat[close + 2 :].split()
        table[int(entry)] = (
            comm,
            logical_parent(int(fields[1]), cmdline),
            int(fields[11]) + int(fields[12]),
            cmdline,
            int(fields[19]),
        )
    return table


def _machine_ticks() -> tuple[int, int, int]:
    """(total, idle + iowait, steal) jiffies of the whole machine. Steal: time the hypervisor gave
    other guests."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return sum(values), values[3] + values[4], values[7] if len(values) > 7 else 0


def _replica_name(title: str) -> str:
    """ "container DEPLOYMENT (APP)" for a Serve replica's process title."""
    app_name, _, deployment = title.split()[0][len("ray::ServeReplica:") :].partition(":")
    deployment = deployment.split(".")[0]  # the title shows the method running: "iris.check_health"
    return f"container {deployment} ({app_name})"


def _hosted_name(cmdline: str, table: dict[int, tuple[str, int, int, str, int]]) -> str | None:
    """ "container HOSTNAME (ENDPOINT.HOSTNAME.hosted)" for a container process forked for a
    container host (its title names it); None for any other."""
    marker = "serving.model_server.main "
    if not cmdline.startswith(marker) or "for supervisor " not in cmdline:
        return None
    supervisor = int(cmdline.rsplit("for supervisor ", 1)[1].rstrip(")").split()[0])
    if not table.get(supervisor, ("", 0, 0, "", 0))[3].startswith("ray::ContainerHost"):
        return None
    endpoint, _, hostname = cmdline[len(marker) :].split()[0].partition("/")
    return f"container {hostname} ({endpoint}.{hostname}.hosted)"


class CpuMeter:
    """CPU seconds per process group over a window: which process the time went to."""

    def __init__(self) -> None:
        self.roles: dict[int, str] = {}  # pid -> role of it and its descendants

    def label(self, pid: int, table: dict[int, tuple[str, int, int, str, int]]) -> str:
        comm, _, _, cmdline, _ = table[pid]
        me = os.getpid()
        if pid == me:
            return "bench driver (also the Ray driver)"
        # The nearest ancestor with a role decides; only our own descendants are ours (another
        # Ray instance on this machine has processes with the same titles).
        role, seen, current = None, 0, pid
        while current > 1 and seen < 64:
            role = self.roles.get(current) or ("ours" if current == me else None)
            if role is not None:
                break
            current = table.get(current, ("", 0, 0, "", 0))[1]
            seen += 1
        if self.roles.get(pid) == "mlserver":
            return "mlserver: HTTP process"
        if role == "mlserver":
            return "mlserver: inference worker"
        if role is not None and role != "ours":
            return role
        if role is None:
            return "other processes (not started by this run)"
        if comm == "wrk":
            return "wrk (load generator)"
        if cmdline.startswith(("ray::NodeGateway", "ray::ServeReplica:serving-gateway")):
            return "gateway replica"
        if cmdline.startswith("ray::ServeReplica:"):
            return f"{_replica_name(cmdline)}: Ray replica (supervisor)"
        if "serving.model_server.fork_template" in cmdline:
            return "container templates (one per stack)"
        hosted = _hosted_name(cmdline, table)
        if hosted is not None:
            return hosted
        if cmdline.startswith("ray::ContainerHost"):
            return "container host (supervisor of the node's hosted containers)"
        parent = table.get(table[pid][1])
        if parent is not None and parent[3].startswith("ray::ServeReplica:"):
            # the replica's child: the container's own process (its model)
            return _replica_name(parent[3])
        if cmdline.startswith("ray::ServeController"):
            return "ray: serve controller"
        return "ray: other processes (gcs, raylet, registry, idle workers, ...)"

    def snapshot(self):
        uptime_ticks = float(Path("/proc/uptime").read_text().split()[0]) * CLOCK_TICKS
        table = read_procs()
        procs = {pid: (self.label(pid, table), info[2], info[4]) for pid, info in table.items()}
        return time.monotonic(), procs, _machine_ticks(), uptime_ticks

    @staticmethod
    def delta(before, after) -> tuple[dict[str, float], float]:
        """CPU seconds per label between two snapshots, and the machine's busy cores on average."""
        t0, procs0, (total0, idle0, steal0), uptime0 = before
        t1, procs1, (total1, idle1, steal1), _ = after
        seconds: dict[str, float] = {}
        for pid, (label, ticks, started) in procs1.items():
            previous = procs0.get(pid)
            if previous is not None and previous[2] == started:
                used = (ticks - previous[1]) / CLOCK_TICKS
            elif started >= uptime0 - 1:  # born during the window: all its CPU is in the window
                used = ticks / CLOCK_TICKS
            # existed before but was not seen (a read raced with it): no baseline, leave it out
            else:
                continue
            if used > 0:
                seconds[label] = seconds.get(label, 0.0) + used
        busy_cores, _ = CpuMeter.machine(before, after)
        return seconds, busy_cores

    @staticmethod
    def machine(before, after) -> tuple[float, float]:
        """This machine's average busy cores (its own work, steal excluded) and cores stolen by the
        hypervisor."""
        (total0, idle0, steal0), (total1, idle1, steal1) = before[2], after[2]
        if total1 <= total0:
            return 0.0, 0.0
        cores, span = os.cpu_count() or 1, total1 - total0
        steal = (steal1 - steal0) / span * cores
        return (1 - (idle1 - idle0) / span) * cores - steal, steal

    @staticmethod
    def clamp_other(seconds: dict[str, float], busy_cores: float, elapsed: float) -> None:
        """Other processes cannot have used more than the machine's busy time minus ours."""
        if OTHER in seconds:
            ours = sum(v for k, v in seconds.items() if k != OTHER)
            seconds[OTHER] = max(0.0, min(seconds[OTHER], busy_cores * elapsed - ours))


def run_cpu_us(case) -> float:
    """CPU per request of everything this run started (wrk included), not of other processes."""
    return sum(v for k, v in case.cpu_us_per_request.items() if k != OTHER)


def wait_for_quiet(
    meter: CpuMeter,
    limit_s: float,
    threshold: float = 0.15,
    window: float = 5.0,
    quiet: bool = False,
) -> float:
    """Wait (up to limit_s) until processes outside this run use under `threshold` cores over
    `window` s."""
    deadline = time.monotonic() + limit_s
    told = False
    while True:
        before = meter.snapshot()
        time.sleep(window)
        after = meter.snapshot()
        seconds, busy = CpuMeter.delta(before, after)
        CpuMeter.clamp_other(seconds, busy, after[0] - before[0])
        other = seconds.get(OTHER, 0.0) / window + CpuMeter.machine(before, after)[1]
        if other < threshold or time.monotonic() >= deadline:
            return other
        if not told and not quiet:
            log(
                f"other processes (and steal) use {other:.2f} cores; waiting up to {limit_s:g} s for a quieter machine ..."
            )
            told = True
