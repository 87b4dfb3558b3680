"""The API's SQLite state file, opened as the very file checked: never through a symbolic link.

SQLite opens a database by name, follows a link there, and opens its `-wal`, `-shm` and `-journal`
files by name beside it. A link at any of those names would have the server write its state (what
code runs where, the models' Environment) into whatever file the link names, or read a state someone
else wrote. So each name is checked without following links, SQLite opens only the existing file
just checked (`mode=rw`: it creates nothing by that name), and the file it reports having opened is
compared with the one checked. The folder is private (`private_files`): between the check and
SQLite's open, only this user or root could change a name there.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from serving.private_files import (
    PrivateFileError,
    check_private,
    open_private,
    private_folder,
    unfollowed,
)

__all__ = ["KEY_SUFFIX", "SIBLINGS", "check_state_file", "connect_state"]

SIBLINGS = ("-wal", "-shm", "-journal")  # what SQLite opens by name beside a database
KEY_SUFFIX = ".key"  # the state's sealing key (`sealed`), beside it


def check_state_file(path: str | Path) -> Path:
    """`path` (its folder's links resolved, not its own), once its folder is private and neither it
    nor a file kept beside it (SQLite's, the sealing key) is a link or another user's; else
    PrivateFileError naming it."""
    path = unfollowed(path)
    private_folder(path.parent)
    for name in (path, *(Path(f"{path}{suffix}") for suffix in (*SIBLINGS, KEY_SUFFIX))):
        check_private(name)
    return path


def connect_state(path: str | Path) -> sqlite3.Connection:
    """A connection to the state file at `path` (created 0600 if missing), shared by threads, in
    autocommit."""
    path = check_state_file(path)
    # held: its inode is the one SQLite must open
    descriptor = open_private(path, os.O_RDWR | os.O_CREAT)
    try:
        checked = os.fstat(descriptor)
        uri = f"file:{quote(str(path))}?mode=rw"
        db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
        try:
            opened = db.execute("PRAGMA database_list").fetchone()[2]
            now = os.lstat(path)
            if opened != str(path) or (now.st_dev, now.st_ino) != (checked.st_dev, checked.st_ino):
                raise PrivateFileError(
                    f"{path} changed while the server opened it (SQLite opened {opened}): a link or another file "
                    "was put in its place; remove it"
                )
        except BaseException:
            db.close()
            raise
    finally:
        os.close(descriptor)
    return db
