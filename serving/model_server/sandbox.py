"""Confine a container process before it loads a tenant's model: Landlock, seccomp, no privileges.

A model's `code/inference.py` is code, so its process confines itself before it imports a framework or reads the
model: Landlock limits the files it may touch, the processes it may reach and its TCP ports (the endpoint server's
closed), seccomp refuses Unix sockets and io_uring, and it keeps no capabilities. What each layer allows, and what
tenant code can still do: docs/security.md, "Tenant code". Standard library and ctypes only, since it runs first:
Landlock binds the calling thread and its future threads, so it must run while the process has one thread (before
numpy's BLAS starts its pool).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from serving.protocol import HARMLESS_PYTHON_VARIABLES, STARTUP_VARIABLE_PREFIXES, STARTUP_VARIABLES

__all__ = ["SandboxError", "SandboxPolicy", "SandboxReport", "apply", "landlock_abi", "startup_variables"]

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
_FILE_RIGHTS = _FS["EXECUTE"] | _FS["WRITE_FILE"] | _FS["READ_FILE"] | _FS["TRUNCATE"] | _FS["IOCTL_DEV"]
_READ = _FS["EXECUTE"] | _FS["READ_FILE"] | _FS["READ_DIR"]
_DEVICE = _FS["READ_FILE"] | _FS["WRITE_FILE"] | _FS["IOCTL_DEV"]
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_PORTS = 65536
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1

_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _PR_SET_SECCOMP = 38, 24, 22
_SECCOMP_MODE_FILTER = 2
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
# (audit arch, socket, io_uring_setup, io_uring_enter, io_uring_register) per machine.
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 425, 426, 427), "aarch64": (0xC00000B7, 198, 425, 426, 427)}
_X32_SYSCALL_BIT = 0x40000000
_AF_UNIX = 1

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
    """The names among `names` that a process reads as it starts, to choose code (`protocol.STARTUP_VARIABLES`):
    refused in a container's Environment, and never in a container process's environment."""
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
    """Which paths a container process may read, write and use as devices."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    closed_ports: tuple[int, ...] = ()  # TCP ports it may not connect to, on any address (Landlock ABI >= 4)


@dataclass
class SandboxReport:
    """What was applied, for the container's log and its description."""

    landlock_abi: int = 0
    seccomp: bool = False
    capabilities_dropped: bool = False
    closed_ports: list[int] = field(default_factory=list)  # the policy's closed ports, where the kernel enforces them
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
        ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
    )
    return max(int(version), 0)


def apply(policy: SandboxPolicy, *, require: bool = False) -> SandboxReport:
    """Confine this process (call while it has one thread); raises SandboxError if `require` and any layer fails."""
    report = SandboxReport()
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail_or_skip(require, "prctl(PR_SET_NO_NEW_PRIVS)")
    report.capabilities_dropped = _drop_capabilities(libc)
    abi = landlock_abi()
    if abi:
        _landlock(libc, abi, policy, report)
        report.landlock_abi = abi
    elif require:
        raise SandboxError("Landlock is not available (Linux 5.13+ with Landlock enabled is needed)")
    report.seccomp = _seccomp(libc)
    if require and not report.seccomp:
        raise SandboxError(f"seccomp filter could not be installed on {platform.machine()}")
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
    closed = set(policy.closed_ports) if abi >= 4 else set()
    attr = _RulesetAttr(
        handled_access_fs=handled,
        # no listening (the port is inherited); connecting to any port but the closed ones
        handled_access_net=(_NET_BIND_TCP | (_NET_CONNECT_TCP if closed else 0)) if abi >= 4 else 0,
        scoped=(_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0,
    )
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    libc.syscall.restype = ctypes.c_long
    ruleset = libc.syscall(
        ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
    )
    if ruleset < 0:
        raise SandboxError(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    try:
        grants = [(path, _READ) for path in policy.read] + [(path, handled) for path in policy.write]
        grants += [(path, _DEVICE) for path in policy.devices]
        for path, rights in grants:
            _allow(libc, int(ruleset), path, rights & handled, report)
        if closed:
            _allow_ports(libc, int(ruleset), closed)
            report.closed_ports = sorted(closed)
        if libc.syscall(ctypes.c_long(_SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
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
        rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
        if (
            libc.syscall(
                ctypes.c_long(_SYS_LANDLOCK_ADD_RULE),
                ctypes.c_int(ruleset),
                ctypes.c_int(_RULE_PATH_BENEATH),
                ctypes.byref(rule),
                ctypes.c_uint32(0),
            )
            != 0
        ):
            raise SandboxError(f"landlock_add_rule({path}) failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def _allow_ports(libc: ctypes.CDLL, ruleset: int, closed: set[int]) -> None:
    """Allow connecting to every TCP port but `closed`: Landlock's network rules name only what is allowed.

    65,535 system calls: their arguments are built once (ctypes objects made per call cost more than the calls)."""
    rule = _NetPortAttr(allowed_access=_NET_CONNECT_TCP, port=0)
    add_rule, pointer, zero = libc.syscall, ctypes.byref(rule), ctypes.c_uint32(0)
    number, fd, kind = ctypes.c_long(_SYS_LANDLOCK_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(_RULE_NET_PORT)
    for port in range(_PORTS):
        if port in closed:
            continue
        rule.port = port
        if add_rule(number, fd, kind, pointer, zero) != 0:
            raise SandboxError(f"landlock_add_rule(port {port}) failed: {os.strerror(ctypes.get_errno())}")


# --- seccomp -----------------------------------------------------------------------------------
class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The BPF filter (code, jt, jf, k) for `machine`, or None for an architecture we have no table for."""
    numbers = _SECCOMP_ARCH.get(machine)
    if numbers is None:
        return None
    arch, socket_nr, *uring = numbers
    deny = _SECCOMP_RET_ERRNO | errno.EPERM
    program = [
        (_LD_W_ABS, 0, 0, 4),  # 0: A = seccomp_data.arch
        (_JEQ_K, 1, 0, arch),  # 1: our arch? skip the next
        (_RET_K, 0, 0, deny),  # 2: another ABI (e.g. 32-bit entry): refuse
        (_LD_W_ABS, 0, 0, 0),  # 3: A = seccomp_data.nr
        (_JGE_K, 0, 1, _X32_SYSCALL_BIT),  # 4: x32 numbers: refuse
        (_RET_K, 0, 0, deny),  # 5
    ]
    for number in uring:  # io_uring creates sockets without socket(2)
        program += [(_JEQ_K, 0, 1, number), (_RET_K, 0, 0, deny)]
    program += [
        (_JEQ_K, 0, 3, socket_nr),  # socket(2)? else allow
        (_LD_W_ABS, 0, 0, 16),  # A = low 32 bits of args[0] (the domain)
        (_JEQ_K, 0, 1, _AF_UNIX),  # AF_UNIX? refuse
        (_RET_K, 0, 0, deny),
        (_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
    ]
    return program


def _seccomp(libc: ctypes.CDLL) -> bool:
    program = seccomp_program(platform.machine())
    if program is None:
        return False
    filters = (_SockFilter * len(program))(*[_SockFilter(*instruction) for instruction in program])
    fprog = _SockFprog(len(program), filters)
    return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0


# --- capabilities ------------------------------------------------------------------------------
class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CAPABILITY_VERSION_3 = 0x20080522
_CAP_LAST = 63


def _drop_capabilities(libc: ctypes.CDLL) -> bool:
    """Empty the bounding, effective, permitted and inheritable sets (a no-op for an ordinary user)."""
    for capability in range(_CAP_LAST + 1):
        libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0)  # EINVAL past the kernel's last one; EPERM if not root
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    return libc.capset(ctypes.byref(header), ctypes.byref(data)) == 0
