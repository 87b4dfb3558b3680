"""The container process's seccomp filter: which sockets it may create, and the calls that reach
other processes.

Defence in depth behind the network namespace (`netns`): `socket(2)` is allowed for the Internet
families with TCP or UDP only (protocol 0 or its number; UDP not at all for a process in the node's
network with no egress), and refused for everything else, new protocols included, with the error a
kernel without that protocol gives (EAFNOSUPPORT for a family, EPROTONOSUPPORT for a type or
protocol), so libraries fall back as they would there. io_uring (which creates sockets without
`socket(2)`) and the calls that read or take another process's memory or descriptors, join a
namespace or load BPF are refused with EPERM. Any other ABI of the machine (32-bit entry points,
x32) is refused whole. Standard library and ctypes only.
"""

from __future__ import annotations

import ctypes
import errno
import platform

__all__ = ["install", "program"]

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_X32_SYSCALL_BIT = 0x40000000
_AF_INET, _AF_INET6 = 2, 10
_SOCK_STREAM, _SOCK_DGRAM, _SOCK_TYPE_MASK = 1, 2, 0xF
_IPPROTO_TCP, _IPPROTO_UDP = 6, 17

# Per machine: (audit arch, socket, the calls refused with EPERM: io_uring_setup, io_uring_enter,
# io_uring_register, ptrace, process_vm_readv, process_vm_writev, pidfd_getfd, setns, bpf).
_ARCH = {
    "x86_64": (0xC000003E, 41, (425, 426, 427, 101, 310, 311, 438, 308, 321)),
    "aarch64": (0xC00000B7, 198, (425, 426, 427, 117, 270, 271, 438, 268, 280)),
}

# BPF: load a word of seccomp_data (nr at 0, arch at 4, args[i]'s low half at 16 + 8 i), compare,
# and, mask, return.
_LD_W_ABS, _JEQ_K, _JGE_K, _AND_K, _RET_K = 0x20, 0x15, 0x35, 0x54, 0x06
_NR, _ARCH_WORD, _ARG0, _ARG1, _ARG2 = 0, 4, 16, 24, 32


def program(machine: str, udp: bool = True) -> list[tuple[int, int, int, int]] | None:
    """The BPF filter (code, jt, jf, k) for `machine` (UDP sockets refused too unless `udp`), or
    None for an architecture we have no table for."""
    numbers = _ARCH.get(machine)
    if numbers is None:
        return None
    arch, socket_nr, refused = numbers
    # (code, jump-if-true label, jump-if-false label, k, label of this instruction); None: the next
    # one.
    code: list[tuple[int, str | None, str | None, int, str | None]] = [
        (_LD_W_ABS, None, None, _ARCH_WORD, None),
        (_JEQ_K, None, "eperm", arch, None),
        (_LD_W_ABS, None, None, _NR, None),
        (_JGE_K, "eperm", None, _X32_SYSCALL_BIT, None),
        *[(_JEQ_K, "eperm", None, number, None) for number in refused],
        (_JEQ_K, None, "allow", socket_nr, None),
        (_LD_W_ABS, None, None, _ARG0, None),  # the family
        (_JEQ_K, "type", None, _AF_INET, None),
        (_JEQ_K, "type", "eafnosupport", _AF_INET6, None),
        (_LD_W_ABS, None, None, _ARG1, "type"),  # the type, less SOCK_NONBLOCK and SOCK_CLOEXEC
        (_AND_K, None, None, _SOCK_TYPE_MASK, None),
        (_JEQ_K, "stream", None, _SOCK_STREAM, None),
        (_JEQ_K, "datagram" if udp else "eprotonosupport", "eprotonosupport", _SOCK_DGRAM, None),
        (_LD_W_ABS, None, None, _ARG2, "stream"),  # the protocol: 0 or TCP (not MPTCP, SCTP ...)
        (_JEQ_K, "allow", None, 0, None),
        (_JEQ_K, "allow", "eprotonosupport", _IPPROTO_TCP, None),
        (_LD_W_ABS, None, None, _ARG2, "datagram"),  # 0 or UDP (not UDP-Lite, ICMP ...)
        (_JEQ_K, "allow", None, 0, None),
        (_JEQ_K, "allow", "eprotonosupport", _IPPROTO_UDP, None),
        (_RET_K, None, None, _RET_ALLOW, "allow"),
        (_RET_K, None, None, _RET_ERRNO | errno.EPERM, "eperm"),
        (_RET_K, None, None, _RET_ERRNO | errno.EAFNOSUPPORT, "eafnosupport"),
        (_RET_K, None, None, _RET_ERRNO | errno.EPROTONOSUPPORT, "eprotonosupport"),
    ]
    where = {label: index for index, (*_, label) in enumerate(code) if label}

    def offset(index: int, label: str | None) -> int:
        return 0 if label is None else where[label] - index - 1

    return [(op, offset(i, jt), offset(i, jf), k) for i, (op, jt, jf, k, _) in enumerate(code)]


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def install(libc: ctypes.CDLL, udp: bool = True) -> bool:
    """Install the filter on this process (no-new-privileges must be set first); False where it
    cannot be."""
    instructions = program(platform.machine(), udp)
    if instructions is None:
        return False
    filters = (_SockFilter * len(instructions))(
        *[_SockFilter(*instruction) for instruction in instructions]
    )
    fprog = _SockFprog(len(instructions), filters)
    return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0
