"""The Unix socket beside a container's data port: hops from a gateway on the same machine skip TCP.

A replica's supervisor binds, next to the data port's TCP listener, a Unix socket whose path is
derived from that address (`path_for(host, port)`), and hands both to the container process. A
gateway that finds a socket at that path uses it, at less CPU and latency per hop
(docs/benchmarks/bench_hop_transport.md); one that finds none (a replica on another node) or is
refused (a socket left by a replica that died) uses TCP. Hops over it are signed as over TCP. Who
can reach it: a folder only this user may enter, sockets mode 0600, and no Unix sockets for tenant
code (docs/security.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import tempfile
import time

logger = logging.getLogger("serving.http.local_socket")

MAX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL
# a socket that refuses connections and is older than this was left by a replica that died
STALE_AFTER_S = 60.0


def folder(create: bool = False) -> str | None:
    """This user's socket folder, or None when it is missing (and not `create`d) or not safe to
    use."""
    path = os.path.join(tempfile.gettempdir(), f"serving-hops-{os.getuid()}")
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # checked below, as any folder found there
        except OSError as error:
            logger.warning("no Unix sockets for hops: cannot create %s: %s", path, error)
            return None
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        if create:
            logger.warning(
                "no Unix sockets for hops: %s is not a folder only this user may enter", path
            )
        return None
    return path


def path_for(host: str, port: int, create: bool = False) -> str | None:
    """Where the Unix socket of the data port `host:port` lives on this machine (None: no safe place
    for it)."""
    base = folder(create)
    if base is None:
        return None
    path = os.path.join(base, f"{host.strip('[]').replace(':', '_')}-{port}.sock")
    return path if len(os.fsencode(path)) <= MAX_PATH else None


def listen(host: str, port: int) -> socket.socket | None:
    """A listening Unix socket for the data port `host:port`, mode 0600; None where there is no safe
    place."""
    path = path_for(host, port, create=True)
    if path is None:
        return None
    sweep(os.path.dirname(path))
    with contextlib.suppress(FileNotFoundError):
        # left by a replica that died at this address (its TCP port is free again, so it is gone)
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(2048)
    except OSError as error:
        listener.close()
        logger.warning("no Unix socket for the data port %s:%s: %s", host, port, error)
        return None
    return listener


def sweep(base: str) -> int:
    """Remove the sockets in `base` that replicas killed without a chance to remove left behind:
    those that refuse a connection (nothing listens) and were made more than STALE_AFTER_S ago (not
    one between its bind and its listen). Returns how many went."""
    removed = 0
    now = time.time()
    with os.scandir(base) as entries:
        stale = [
            entry.path
            for entry in entries
            if entry.name.endswith(".sock") and _old_socket(entry, now)
        ]
    for path in stale:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # a live server with a full backlog makes connect wait: that one is not stale
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed += 1
        except OSError:
            pass
        finally:
            probe.close()
    return removed


def _old_socket(entry: os.DirEntry, now: float) -> bool:
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISSOCK(info.st_mode) and now - info.st_mtime > STALE_AFTER_S


def remove(listener: socket.socket, path: str) -> None:
    """Close a socket from `listen` (if still open) and remove its `path`."""
    listener.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


__all__ = ["folder", "listen", "path_for", "remove", "sweep"]
