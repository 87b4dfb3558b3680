"""Hosts as network namespaces on one bridge, each in a cgroup with a CPU quota.

Layout of one `Machine` (a tag of its own in every name, so two can run at once):

    <tag>-sw   a namespace holding the bridge `br0`: the "switch"; nothing else runs in it
    <tag>-hN   host N: `eth0` at 10.77.0.(10+N)/24 on the bridge, `lo` up, its own port space
    <tag>-ld   the load generators' namespace: `eth0` at 10.77.0.2/24

Every host's processes run in the cgroup `serving-sim-<tag>/hN` (cgroup v1's `cpu` hierarchy, or v2's
`cpu.max`), so a host can be given a CPU quota, and a host can be killed whole: every process in its
cgroup gets SIGKILL, whatever it forked or double-forked, and its namespace goes. Traffic between hosts is
real TCP over veths and the bridge; no host can reach another's loopback. Processes enter a host through
`nsenter --net` (only the network namespace changes: the file system and /sys stay the machine's), with
`TMPDIR` set to the host's own folder, so that what this project keeps in the temporary folder per
machine (the hop sockets' folder, the stack templates' sockets, Ray's session) is per host, as on real
machines.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.77.0"
LOAD_ADDRESS = f"{SUBNET}.2"
PERIOD_US = 100_000  # the CFS period a host's quota is a share of
CAP_PERIOD_US = 100_000  # ... and a single process's (10 ms periods cost a throttled gateway ~1.8x its CPU per call)
CGROUP_ROOT = Path("/sys/fs/cgroup")
KILL_ROUNDS = 50  # SIGKILL sweeps of a cgroup before giving up on it (each 0.1 s apart)


class SimulationUnavailable(RuntimeError):
    """This machine cannot simulate hosts: the message names the missing capability."""


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")


def cgroup_version() -> int:
    """1 for v1's `cpu` hierarchy, 2 for a v2 hierarchy with the `cpu` controller; raises otherwise."""
    if (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        return 1
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return 2
    raise SimulationUnavailable(
        "no cgroup CPU controller: neither /sys/fs/cgroup/cpu (v1) nor a v2 hierarchy with 'cpu' in "
        "/sys/fs/cgroup/cgroup.controllers"
    )


def preflight() -> None:
    """Raise SimulationUnavailable naming the first missing capability: the tools, network namespaces,
    veths and bridges, writable cgroups."""
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            raise SimulationUnavailable(
                f"the '{tool}' command is missing (Debian: iproute2, util-linux)"
            )
    probe = f"ssprobe{secrets.token_hex(3)}"
    try:
        _run("ip", "netns", "add", probe)
    except RuntimeError as error:
        raise SimulationUnavailable(
            f"cannot create network namespaces (needs root or CAP_SYS_ADMIN): {error}"
        ) from None
    try:
        _run("ip", "-n", probe, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
    except RuntimeError as error:
        raise SimulationUnavailable(
            f"cannot create bridges and veth pairs (needs CAP_NET_ADMIN): {error}"
        ) from None
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    version = cgroup_version()
    base = CGROUP_ROOT / "cpu" if version == 1 else CGROUP_ROOT
    try:
        (base / probe).mkdir()
        (base / probe).rmdir()
    except OSError as error:
        raise SimulationUnavailable(f"cannot create cgroups under {base}: {error}") from None


@dataclass
class Host:
    """One simulated host: its namespace, address, cgroup and temporary folder."""

    index: int
    namespace: str
    address: str
    cgroup: Path
    tmp: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def leaf(self) -> Path:
        """Where its processes start: a child of the host's cgroup, so that the host's quota covers them
        and, on cgroup v2 (no processes beside child cgroups), a process can get a cap of its own."""
        return self.cgroup / "procs"

    def pids(self) -> set[int]:
        """Every process now in this host's cgroups."""
        found: set[int] = set()
        for procs in self.cgroup.rglob("cgroup.procs") if self.cgroup.exists() else ():
            with contextlib.suppress(OSError):
                found |= {int(line) for line in procs.read_text().split()}
        return found


class Machine:
    """The namespaces, bridge, cgroups and processes of one simulation; `close()` removes them all."""

    def __init__(self, tag: str | None = None) -> None:
        preflight()
        self.tag = tag or f"ss{secrets.token_hex(2)}"
        self.version = cgroup_version()
        base = CGROUP_ROOT / "cpu" if self.version == 1 else CGROUP_ROOT
        self.cgroup = base / f"serving-sim-{self.tag}"
        self.folder = Path(tempfile.mkdtemp(prefix=f"serving-sim-{self.tag}-"))
        self.switch = f"{self.tag}-sw"
        self.hosts: dict[int, Host] = {}
        self.load: Host | None = None
        self._closed = False
        try:
            self.cgroup.mkdir()
            if self.version == 2:  # the hosts' cgroups may use cpu.max
                (self.cgroup / "cgroup.subtree_control").write_text("+cpu")
            _run("ip", "netns", "add", self.switch)
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
            self.load = self._attach(0, f"{self.tag}-ld", LOAD_ADDRESS)
        except BaseException:
            self.close()
            raise

    def _attach(self, index: int, namespace: str, address: str) -> Host:
        """A namespace on the bridge at `address`, with its cgroup and temporary folder."""
        outside, inside = f"{self.tag}v{index}a", f"{self.tag}v{index}b"
        _run("ip", "netns", "add", namespace)
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _run("ip", "link", "set", outside, "netns", self.switch)
        _run("ip", "link", "set", inside, "netns", namespace)
        _run("ip", "-n", self.switch, "link", "set", outside, "master", "br0", "up")
        _run("ip", "-n", namespace, "link", "set", inside, "name", "eth0")
        _run("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _run("ip", "-n", namespace, "link", "set", "eth0", "up")
        _run("ip", "-n", namespace, "link", "set", "lo", "up")
        cgroup = self.cgroup / namespace.removeprefix(f"{self.tag}-")
        cgroup.mkdir()
        if self.version == 2:
            (cgroup / "cgroup.subtree_control").write_text("+cpu")
        (cgroup / "procs").mkdir()
        tmp = self.folder / namespace.removeprefix(f"{self.tag}-")
        tmp.mkdir()
        return Host(index, namespace, address, cgroup, tmp)

    def add_host(self, index: int, cpus: float | None = None) -> Host:
        """Host `index` (1-based), at 10.77.0.(10+index), with at most `cpus` cores (None: no quota)."""
        if index in self.hosts:
            raise ValueError(f"host {index} exists")
        host = self._attach(index, f"{self.tag}-h{index}", f"{SUBNET}.{10 + index}")
        self.hosts[index] = host
        self.set_quota(host, cpus)
        return host

    def set_quota(
        self, host: Host, cpus: float | None, cgroup: Path | None = None, period_us: int = PERIOD_US
    ) -> None:
        """Cap `host` (or one of its sub-cgroups) at `cpus` cores of every `period_us`; None lifts the
        cap. A short period spreads a small quota evenly (a 0.1-core cap over 100 ms runs 10 ms, then
        waits 90)."""
        where = cgroup or host.cgroup
        if self.version == 1:
            quota = -1 if cpus is None else int(cpus * period_us)
            (where / "cpu.cfs_period_us").write_text(str(period_us))
            (where / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            quota_text = "max" if cpus is None else str(int(cpus * period_us))
            (where / "cpu.max").write_text(f"{quota_text} {period_us}")

    def cap_process(self, host: Host, pid: int, cpus: float) -> Path:
        """Move process `pid` of `host` (every thread of it) into a cgroup of its own under the host's,
        capped at `cpus` cores; what it starts afterwards is capped with it."""
        cgroup = host.cgroup / f"p{pid}"
        cgroup.mkdir(exist_ok=True)
        self.set_quota(host, cpus, cgroup, period_us=CAP_PERIOD_US)
        (cgroup / "cgroup.procs").write_text(str(pid))
        return cgroup

    def start(
        self,
        host: Host,
        command: list[str],
        environment: dict[str, str] | None = None,
        **popen: object,
    ) -> subprocess.Popen:
        """`command` inside `host`: its network namespace, its cgroup (joined before the command runs,
        so that everything it starts is counted and killed with the host) and its TMPDIR."""
        procs = host.leaf / "cgroup.procs"
        wrapper = [
            "sh",
            "-c",
            f'echo $$ > {procs} && exec nsenter --net=/run/netns/{host.namespace} -- "$@"',
            "sh",
            *command,
        ]
        env = {**(environment if environment is not None else os.environ), "TMPDIR": str(host.tmp)}
        process = subprocess.Popen(wrapper, env=env, **popen)  # type: ignore[call-overload]
        host.processes.append(process)
        return process

    def kill_host(self, host: Host) -> float:
        """SIGKILL every process of `host` (its cgroup's, forks included), then remove its namespace,
        as a machine that loses power; the seconds the sweep took."""
        started = time.monotonic()
        self._kill_cgroup(host.cgroup)
        for process in host.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, timeout=30)
        with contextlib.suppress(OSError):
            host.cgroup.rmdir()
        self.hosts.pop(host.index, None)
        return time.monotonic() - started

    def _kill_cgroup(self, cgroup: Path) -> None:
        """SIGKILL what is in `cgroup` (and its children) until it is empty: a process forking meanwhile
        is caught by the next sweep."""
        for _ in range(KILL_ROUNDS):
            pids = set()
            for procs in cgroup.rglob("cgroup.procs") if cgroup.exists() else ():
                with contextlib.suppress(OSError):
                    pids |= {int(line) for line in procs.read_text().split()}
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        children = [path for path in cgroup.rglob("*") if path.is_dir()] if cgroup.exists() else []
        for child in sorted(children, key=lambda path: len(path.parts), reverse=True):
            with contextlib.suppress(OSError):
                child.rmdir()

    def close(self) -> None:
        """Kill every process of every host and the load namespace, remove the namespaces (their veths
        go with them), the cgroups and the folder. Safe to call twice and after a failure midway."""
        if self._closed:
            return
        self._closed = True
        for host in [*self.hosts.values(), *([self.load] if self.load else [])]:
            self._kill_cgroup(host.cgroup)
            for process in host.processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(5)
        for namespace in self.namespaces():
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        if self.cgroup.exists():
            self._kill_cgroup(self.cgroup)
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()
        shutil.rmtree(self.folder, ignore_errors=True)

    def namespaces(self) -> list[str]:
        """This simulation's network namespaces that exist now."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
        names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
        return [name for name in names if name.startswith(f"{self.tag}-")]

    def __enter__(self) -> Machine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
