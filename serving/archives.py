"""`.tar.gz` archives unpacked safely: a model's `model.tar.gz` and a script's `sourcedir.tar.gz`.

An archive may hold only regular files and folders with relative names and no `..`: links,
devices and FIFOs are refused before anything is written (models and scripts need none of them).
With no links, no member can be redirected outside the folder, whatever the Python; tarfile's `data`
filter still runs as a second line (it also drops setuid bits and group/other write). Before
3.11.13 / 3.12.11 / 3.13.4 that filter alone can be bypassed by symlink chains (CVE-2025-4517);
before 3.11.14 / 3.12.12 / 3.13.6 a negative member size makes tarfile read forever (CVE-2025-8194),
so members are read one by one and such a member is refused. A caller may bound what an archive
unpacks to (`max_bytes`: the members' sizes, which are exactly what tarfile writes), checked, too,
before the first write. Error messages name the archive and the member, never a path of this
machine.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

__all__ = ["ARCHIVE_SUFFIXES", "ArtifactError", "extract_archive"]

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")


class ArtifactError(ValueError):
    """A model artifact that cannot be used; the message says which and why."""


def extract_archive(archive: Path, target: Path, max_bytes: int | None = None) -> Path:
    """Unpack `archive` into `target` (atomically: a half-written folder is never used); with
    `max_bytes`, refuse an archive whose members add up to more (each counts at least one 512-byte
    tar block, so that a million empty files do not pass as nothing)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = []
            total = 0
            # all of them before the first write; not getmembers(), which can loop forever
            for member in tar:
                _check_member(member)
                members.append(member)
                total += max(member.size, 512)
                if max_bytes is not None and total > max_bytes:
                    raise ArtifactError(
                        f"it unpacks to more than {max_bytes} bytes (the limit; member "
                        f"{_shown(member.name)} passes it)"
                    )
            tar.extractall(staging, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError, zlib.error, ArtifactError) as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise ArtifactError(f"cannot safely extract {archive.name}: {_reason(error)}") from None
    try:
        staging.rename(target)
    except OSError:  # another replica on this node won the race; use its copy
        shutil.rmtree(staging, ignore_errors=True)
    return target


_KINDS = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
}


def _check_member(member: tarfile.TarInfo) -> None:
    """Refuse anything but a regular file or folder, and any name that is absolute or climbs with
    `..`."""
    # sends tarfile back to an earlier header, forever, before 3.11.14 (CVE-2025-8194)
    if member.size < 0:
        raise ArtifactError(f"member {_shown(member.name)} has a negative size (a crafted archive)")
    if member.name.startswith("/"):
        raise ArtifactError("a member has an absolute name")
    if ".." in PurePosixPath(member.name).parts:
        raise ArtifactError(
            f"member {_shown(member.name)} climbs out of the archive's folder ('..')"
        )
    if not (member.isreg() or member.isdir()):
        kind = _KINDS.get(member.type, "special file")
        raise ArtifactError(
            f"member {_shown(member.name)} is a {kind}; an archive may hold only regular files and folders"
        )


def _reason(error: BaseException) -> str:
    """What went wrong, without the absolute paths OSError and tarfile's filter errors carry."""
    if isinstance(error, ArtifactError):
        return str(error)
    if isinstance(error, tarfile.FilterError):
        return f"member {_shown(error.tarinfo.name)} refused by tarfile's data filter ({type(error).__name__})"
    if isinstance(error, OSError):
        return error.strerror or type(error).__name__
    return " ".join(str(error).split()) or type(error).__name__


def _shown(name: str) -> str:
    return repr(name if len(name) <= 100 else name[:100] + "...")
