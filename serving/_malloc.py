"""glibc's allocator, told to give large freed blocks back to the OS (a no-op elsewhere).

glibc raises its mmap threshold each time it frees a large mmapped block (up to 32 MB), so the next
blocks of that size land in a heap that is seldom given back: a process that once held many large
buffers (request bodies, models) keeps their memory after freeing them, in amounts that vary run to
run. A fixed threshold keeps large blocks in mmap, unmapped as soon as they are freed.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

__all__ = ["keep_large_blocks_in_mmap", "release_freed_memory"]

_M_MMAP_THRESHOLD = -3  # mallopt(3)
_MMAP_THRESHOLD = 128 * 1024  # glibc's default, made fixed


@functools.cache
def keep_large_blocks_in_mmap() -> Any:
    """Fix the mmap threshold (once per process); returns glibc's malloc_trim, or None off glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):  # musl and others: nothing to tune
        return None
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    return malloc_trim


def release_freed_memory() -> None:
    """Return free heap pages to the OS, so that freeing shows up in the process's memory."""
    malloc_trim = keep_large_blocks_in_mmap()
    if malloc_trim is not None:
        malloc_trim(0)
