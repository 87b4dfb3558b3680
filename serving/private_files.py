"""Files only this user may read, in folders no other user can write: the API's state and the
control token.

A file opened by name in a folder another user can write is that user's to choose: they can create
it first (readable by them, so a token written into it leaks) or make it a link to a file of ours.
So the folder must be a real folder that no other user may write (owned by this user or root, no
group or other write), and the file is opened without following a link and must be this user's own.
A name is kept as given, its folder's links resolved (`unfollowed`): a link at the name itself is
refused, never followed to a file somewhere else.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["PrivateFileError", "check_private", "open_private", "private_folder", "unfollowed"]


class PrivateFileError(OSError):
    """A folder or file that another user could have chosen or can read."""


def private_folder(folder: str | Path) -> Path:
    """`folder`, created 0700 if missing (with its parents), once checked that no other user can
    write in it."""
    path = Path(folder).expanduser()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise PrivateFileError(
            f"{path} is not a folder (a link?): keep the server's state and tokens in a folder"
        )
    if info.st_uid not in (os.getuid(), 0) or info.st_mode & 0o022:
        raise PrivateFileError(
            f"{path} can be written by other users: a file the server keeps there could be theirs; use a folder "
            "only this user can write (SERVING_STATE_DIR, --state)"
        )
    return path


def open_private(path: str | Path, flags: int) -> int:
    """A descriptor of `path` (created 0600 if `flags` say so) in a private folder: not a link,
    owned by this user, readable by no one else."""
    path = Path(path).expanduser()
    private_folder(path.parent)
    try:
        descriptor = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _link(path) from None
        failure = PrivateFileError(
            f"cannot open {path} as a file of this user's ({error.strerror})"
        )
        failure.errno = error.errno  # ENOENT: missing, not refused
        raise failure from None
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(descriptor)
        raise _theirs(path)
    os.fchmod(descriptor, 0o600)
    return descriptor


def check_private(path: str | Path) -> None:
    """Nothing if `path` is missing or a file of this user's; PrivateFileError naming it if it is a
    link, not a file, or another user's (a file that a library opens by name beside one of ours:
    SQLite's `-wal`)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise _link(path)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        raise _theirs(path)


def unfollowed(path: str | Path) -> Path:
    """`path` made absolute with the links of its folder resolved but not a link at its own name,
    which opening it then refuses (a resolved name would be the link's target, chosen by whoever
    planted the link)."""
    path = Path(path).expanduser()
    return path.parent.resolve() / path.name


def _link(path: str | Path) -> PrivateFileError:
    return PrivateFileError(
        f"{path} is a symbolic link: the server follows no link to its state or tokens; remove it (name the real "
        "file instead)"
    )


def _theirs(path: str | Path) -> PrivateFileError:
    return PrivateFileError(
        f"{path} belongs to another user (or is not a file): remove it or choose another"
    )
