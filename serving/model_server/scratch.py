"""Container processes' scratch folders: one each, under one private root, reclaimed once their
supervisor is gone.

A supervisor removes its container's folder when it stops. One that is killed cannot, and its
container process, confined to what lies inside the folder, can empty it but not remove it. So each
folder's name carries its supervisor's process id and start time, and every new supervisor, and the
server's clean stop, removes the folders of supervisors no longer running (a start time tells a
reused process id apart).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import psutil

from serving.private_files import private_folder

__all__ = ["make", "root", "sweep"]

_NAME = re.compile(r"^(?P<pid>\d+)-(?P<started>\d+)-")


def root() -> Path:
    """This user's folder of scratch folders (0700, checked that no other user can write it)."""
    return private_folder(Path(tempfile.gettempdir()) / f"serving-scratch-{os.getuid()}")


def make(hostname: str) -> str:
    """A new scratch folder for a container process of this supervisor's, after reclaiming those of
    dead ones."""
    sweep()
    prefix = f"{os.getpid()}-{_started(os.getpid())}-{hostname}-"
    return tempfile.mkdtemp(prefix=prefix, dir=root())


def sweep() -> list[str]:
    """Remove the scratch folders whose supervisor is no longer running; returns their names."""
    folder = root()
    removed = []
    for entry in os.scandir(folder):
        match = _NAME.match(entry.name)
        if match is None or _started(int(match["pid"])) == int(match["started"]):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.name)
    return removed


def _started(pid: int) -> int:
    """A process's start time in milliseconds, 0 if it is not running."""
    try:
        return int(psutil.Process(pid).create_time() * 1000)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0
