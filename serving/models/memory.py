"""How much memory this process holds, as a model load grows it: exact (a page-table walk) or
approximate (cheap).

Linux's /proc first; elsewhere RSS or peak RSS. The cache measures each load with one of these; the
MultiModel handler picks which (the exact one only where a byte bound depends on it).
"""

from __future__ import annotations

import os
import sys

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

__all__ = ["approximate_memory", "process_memory"]


def approximate_memory() -> int:
    """RssAnon from /proc/self/status: ~30 us against smaps_rollup's 10-15 ms in a replica, but the
    kernel's per-CPU counters may lag by megabytes. Good enough to report sizes where no byte bound
    depends on them."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return process_memory()


def process_memory() -> int:
    """Memory a model load grows, in bytes: anonymous memory from /proc/self/smaps_rollup (exact, a
    page-table walk of a few ms), else RssAnon from /proc/self/status (cheaper, but the kernel's
    per-CPU counters may lag by megabytes in a process with many threads), else RSS, else peak
    RSS."""
    for path, key in (
        ("/proc/self/smaps_rollup", b"Anonymous:"),
        ("/proc/self/status", b"RssAnon:"),
    ):
        try:
            with open(path, "rb") as table:
                for line in table:
                    if line.startswith(key):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    if resource is None:
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
