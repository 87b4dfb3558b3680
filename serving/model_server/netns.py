"""A network namespace of its own for a container process: the kernel's wall between tenant code and
the node.

A socket belongs to the namespace it was created in. Once a process has left the node's namespace,
every socket it creates, of any family or protocol (TCP, MPTCP, SCTP, UDP, raw, netlink, abstract
Unix names ...), lives in an empty one with a loopback of its own: it can neither reach a listener
of the node nor bind, or join by SO_REUSEPORT, a port of the node. No list of protocols is involved,
so a protocol nobody thought of is walled off too. The listeners its supervisor bound before (the
data port, its Unix socket) stay in the node's namespace and keep accepting. Root unshares the
network namespace alone; another user first unshares a user namespace (where the kernel allows
unprivileged ones), which maps only its own ids and so grants nothing outside.

Standard library and ctypes only: it runs in the launcher, before the sandbox's other layers and any
import of the container's.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct

__all__ = ["NamespaceError", "isolate", "listen_on_loopback", "unavailable"]

_CLONE_NEWNET, _CLONE_NEWUSER = 0x40000000, 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sH22x"  # struct ifreq: the interface's name, then ifr_flags in its 24-byte union


class NamespaceError(OSError):
    """The kernel would not give this process a network namespace of its own; the message says
    why."""


def isolate() -> str:
    """Move this process (single-threaded: unshare of a user namespace needs it) into a new network
    namespace with its loopback up; returns the namespaces made, "network" or "user+network". Raises
    NamespaceError saying what the host lacks."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "unshare"):
        raise NamespaceError(
            errno.ENOSYS, "this system has no network namespaces (they are Linux's)"
        )
    made = "network"
    if libc.unshare(_CLONE_NEWNET) != 0:
        first = ctypes.get_errno()
        if first != errno.EPERM:  # EINVAL: a kernel built without network namespaces
            raise NamespaceError(first, f"unshare(CLONE_NEWNET): {os.strerror(first)}")
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise NamespaceError(
                code,
                f"this process may not unshare its network namespace ({os.strerror(first)}: it is not root) nor a "
                f"user namespace to do it in ({os.strerror(code)}: the kernel allows no unprivileged user "
                "namespaces here; see the sysctls kernel.unprivileged_userns_clone, user.max_user_namespaces and, "
                "on Ubuntu, kernel.apparmor_restrict_unprivileged_userns)",
            )
        _write("/proc/self/setgroups", "deny")  # required before an unprivileged gid_map
        _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
        _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
        made = "user+network"
    _loopback_up()
    return made


def unavailable() -> str | None:
    """Why a container process could not have a network namespace of its own here, None if it can:
    tried in a child process (forked, so single-threaded), before a server starts any."""
    if not hasattr(os, "fork"):
        return "this system has no network namespaces (they are Linux's)"
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        os.close(read)
        try:
            isolate()
            code, message = 0, b""
        except OSError as error:
            code, message = 1, str(error).encode()
        os.write(write, message)
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as reason:
        told = reason.read().decode()
    _, status = os.waitpid(child, 0)
    return None if os.waitstatus_to_exitcode(status) == 0 else told or "the namespace probe failed"


def listen_on_loopback(port: int, backlog: int = 128) -> int:
    """An inheritable listening socket on 127.0.0.1:`port` of this process's own namespace: where
    the container calls itself (the tensorflow stack's `context.rest_uri`), bound before the sandbox
    forbids binding."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", port))
    listener.listen(backlog)
    descriptor = listener.detach()
    os.set_inheritable(descriptor, True)
    return descriptor


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(control, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(control, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def _write(path: str, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)
