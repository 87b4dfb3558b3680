"""Confine a container process before it loads a tenant's model: its own network, Landlock, seccomp,
no privileges.

A model's `code/inference.py` is code, so its process confines itself before it imports a framework
or reads the model: it leaves the node's network for a namespace of its own (`netns`: the wall,
whatever socket it opens), Landlock limits the files it may touch, the processes it may reach and
the TCP ports it may bind (none) and connect to (its own, and an operator's egress ports), seccomp
allows Internet TCP and UDP sockets only (`seccomp`), and it keeps no capabilities. What each layer
allows, and what tenant code can still do: docs/security.md, "Tenant code". Standard library and
ctypes only, since it runs first: Landlock binds the calling thread and its future threads, and a
user namespace needs a single-threaded process, so it must run while the process has one thread
(before numpy's BLAS starts its pool).
"""

from __future__ import annotations

import ctypes
import os
import platform
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from serving.model_server import netns, seccomp
from serving.protocol import HARMLESS_PYTHON_VARIABLES, STARTUP_VARIABLE_PREFIXES, STARTUP_VARIABLES

__all__ = [
    "NETWORKS",
    "SandboxError",
    "SandboxPolicy",
    "SandboxReport",
    "apply",
    "landlock_abi",
    "startup_variables",
]

# Syscall numbers of Landlock are the same on every architecture (the generic table).
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2

# Landlock filesystem rights, by the ABI version that introduced them.
_FS = {
    "EXECUTE": 1 << 0,
    "WRITE_FILE": 1 << 1,
    "READ_FILE": 1 << 2,
    "READ_DIR": 1 << 3,
    "REMOVE_DIR": 1 << 4,
    "REMOVE_FILE": 1 << 5,
    "MAKE_CHAR": 1 << 6,
    "MAKE_DIR": 1 << 7,
    "MAKE_REG": 1 << 8,
    "MAKE_SOCK": 1 << 9,
    "MAKE_FIFO": 1 << 10,
    "MAKE_BLOCK": 1 << 11,
    "MAKE_SYM": 1 << 12,
    "REFER": 1 << 13,
    "TRUNCATE": 1 << 14,
    "IOCTL_DEV": 1 << 15,
}
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_FILE_RIGHTS = (
    _FS["EXECUTE"] | _FS["WRITE_FILE"] | _FS["READ_FILE"] | _FS["TRUNCATE"] | _FS["IOCTL_DEV"]
)
_READ = _FS["EXECUTE"] | _FS["READ_FILE"] | _FS["READ_DIR"]
_DEVICE = _FS["READ_FILE"] | _FS["WRITE_FILE"] | _FS["IOCTL_DEV"]
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1

_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 38, 24
# "isolated": a network namespace of its own (the default); "host": the node's network, where only
# Landlock's TCP rules and seccomp's socket allowlist stand between it and the node's listeners (an
# operator's egress opt-in).
NETWORKS = ("isolated", "host")

# What Python and the frameworks read outside their install: name lookups, TLS roots, time zones,
# the dynamic loader's cache. Not /etc as a whole (/etc/shadow is readable by its owner, root).
_ETC = (
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/passwd",
    "/etc/group",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/os-release",
    "/etc/mime.types",
    "/etc/protocols",
    "/etc/services",
    "/etc/machine-id",
    "/etc/alternatives",
)
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt", "/proc", "/sys", *_ETC)
SYSTEM_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


def startup_variables(names: Iterable[str]) -> list[str]:
    """The names among `names` that a process reads as it starts, to choose code
    (`protocol.STARTUP_VARIABLES`): refused in a container's Environment, and never in a container
    process's environment."""
    return sorted(
        name
        for name in names
        if name in STARTUP_VARIABLES
        or (name.startswith(STARTUP_VARIABLE_PREFIXES) and name not in HARMLESS_PYTHON_VARIABLES)
    )


class SandboxError(RuntimeError):
    """The sandbox could not be applied (and the policy requires it)."""


@dataclass(frozen=True)
class SandboxPolicy:
    """Which paths a container process may read, write and use as devices, and which network it
    has."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    network: str = "isolated"  # one of NETWORKS
    # the only TCP ports it may connect to (Landlock ABI >= 4); it binds none
    connect_ports: tuple[int, ...] = ()
    # isolated: the data port's number, listened on in its namespace's loopback too
    own_port: int | None = None
    # isolated, where no namespace can be made: the host network's rules instead
    shared_fallback: bool = False


@dataclass
class SandboxReport:
    """What was applied, for the container's log and its description."""

    landlock_abi: int = 0
    seccomp: bool = False
    capabilities_dropped: bool = False
    # "network" or "user+network" (the namespaces it has of its own), or "host"
    network: str = "host"
    connect_ports: list[int] = field(default_factory=list)  # where the kernel enforces them
    loopback_fd: int | None = None  # the own_port listener in its namespace
    skipped: list[str] = field(default_factory=list)  # paths granted but absent on this machine

    @property
    def confined(self) -> bool:
        return self.landlock_abi > 0 and self.seccomp


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where Landlock is missing or disabled."""
    if platform.system() != "Linux":
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(
        ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET),
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(_CREATE_RULESET_VERSION),
    )
    return max(int(version), 0)


def apply(policy: SandboxPolicy, *, require: bool = False) -> SandboxReport:
    """Confine this process (call while it has one thread). Raises SandboxError when its network
    cannot be walled off (always: a namespace, or the host network's rules, whatever `require` says)
    and, if `require`, when any other layer fails."""
    if policy.network not in NETWORKS:
        raise SandboxError(f"network must be one of {', '.join(NETWORKS)}, not {policy.network!r}")
    report = SandboxReport()
    network = policy.network
    if network == "isolated":
        try:
            report.network = netns.isolate()
        except netns.NamespaceError as error:
            if not policy.shared_fallback:
                raise SandboxError(
                    f"no network namespace for the container process: {error}"
                ) from None
            network = "host"  # the operator's choice (--shared-container-network)
    if network == "isolated" and policy.own_port is not None:
        report.loopback_fd = netns.listen_on_loopback(policy.own_port)
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail_or_skip(require, "prctl(PR_SET_NO_NEW_PRIVS)")
    report.capabilities_dropped = _drop_capabilities(libc)
    abi = landlock_abi()
    if abi:
        _landlock(libc, abi, policy, report)
        report.landlock_abi = abi
    elif require:
        raise SandboxError(
            "Landlock is not available (Linux 5.13+ with Landlock enabled is needed)"
        )
    # UDP: in its own namespace it reaches nothing; in the node's network, only where the operator
    # allowed egress (DNS)
    report.seccomp = seccomp.install(libc, udp=network == "isolated" or bool(policy.connect_ports))
    if require and not report.seccomp:
        raise SandboxError(f"seccomp filter could not be installed on {platform.machine()}")
    if network == "host" and (abi < 4 or not report.seccomp):
        raise SandboxError(
            "in the node's network a container process is walled off from the node's listeners by Landlock's TCP "
            f"rules (Linux 6.7+, ABI 4; this kernel: {abi}) and seccomp's socket allowlist "
            f"({'installed' if report.seccomp else 'unavailable on ' + platform.machine()}), and this host lacks one"
        )
    return report


def _fail_or_skip(require: bool, what: str) -> None:
    if require:
        raise SandboxError(f"{what} failed: {os.strerror(ctypes.get_errno())}")


# --- Landlock --------------------------------------------------------------------------------
class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _handled_fs(abi: int) -> int:
    return _FS_BY_ABI[max(version for version in _FS_BY_ABI if version <= abi)]


def _landlock(libc: ctypes.CDLL, abi: int, policy: SandboxPolicy, report: SandboxReport) -> None:
    handled = _handled_fs(abi)
    ports = sorted(
        {*policy.connect_ports, *([policy.own_port] if policy.own_port is not None else [])}
    )
    attr = _RulesetAttr(
        handled_access_fs=handled,
        # no binding (its listeners are inherited), connecting to the policy's ports only: deny by
        # default
        handled_access_net=(_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0,
        scoped=(_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0,
    )
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    libc.syscall.restype = ctypes.c_long
    ruleset = libc.syscall(
        ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET),
        ctypes.byref(attr),
        ctypes.c_size_t(size),
        ctypes.c_uint32(0),
    )
    if ruleset < 0:
        raise SandboxError(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    try:
        grants = [(path, _READ) for path in policy.read] + [
            (path, handled) for path in policy.write
        ]
        grants += [(path, _DEVICE) for path in policy.devices]
        for path, rights in grants:
            _allow(libc, int(ruleset), path, rights & handled, report)
        if abi >= 4:
            _allow_connect(libc, int(ruleset), ports)
            report.connect_ports = ports
        if (
            libc.syscall(
                ctypes.c_long(_SYS_LANDLOCK_RESTRICT_SELF),
                ctypes.c_int(ruleset),
                ctypes.c_uint32(0),
            )
            != 0
        ):
            raise SandboxError(f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(int(ruleset))


def _allow(libc: ctypes.CDLL, ruleset: int, path: str, rights: int, report: SandboxReport) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        report.skipped.append(path)
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS  # directory-only rights on a file are refused (EINVAL)
        _add_rule(
            libc,
            ruleset,
            _RULE_PATH_BENEATH,
            _PathBeneathAttr(allowed_access=rights, parent_fd=fd),
            path,
        )
    finally:
        os.close(fd)


def _allow_connect(libc: ctypes.CDLL, ruleset: int, ports: list[int]) -> None:
    """Allow connecting to `ports` over TCP: Landlock's network rules name only what is allowed."""
    for port in ports:
        _add_rule(
            libc,
            ruleset,
            _RULE_NET_PORT,
            _NetPortAttr(allowed_access=_NET_CONNECT_TCP, port=port),
            f"port {port}",
        )


def _add_rule(
    libc: ctypes.CDLL, ruleset: int, kind: int, rule: ctypes.Structure, what: str
) -> None:
    number = ctypes.c_long(_SYS_LANDLOCK_ADD_RULE)
    if (
        libc.syscall(
            number,
            ctypes.c_int(ruleset),
            ctypes.c_int(kind),
            ctypes.byref(rule),
            ctypes.c_uint32(0),
        )
        != 0
    ):
        raise SandboxError(f"landlock_add_rule({what}) failed: {os.strerror(ctypes.get_errno())}")


# --- capabilities ------------------------------------------------------------------------------
class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_CAPABILITY_VERSION_3 = 0x20080522
_CAP_LAST = 63


def _drop_capabilities(libc: ctypes.CDLL) -> bool:
    """Empty the bounding, effective, permitted and inheritable sets (a no-op for an ordinary
    user)."""
    for capability in range(_CAP_LAST + 1):
        # EINVAL past the kernel's last one; EPERM if not root
        libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0)
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    return libc.capset(ctypes.byref(header), ctypes.byref(data)) == 0
