"""Hostile model archives: nothing is ever written outside the extraction folder.

Each archive is built with tarfile itself, the way an attacker would. The realpath chain is
CPython's own reproducer of CVE-2025-4517 (gh-135034), which defeats tarfile's `data` filter
on Pythons before 3.11.13 / 3.12.11 / 3.13.4: symlinks whose expansion overflows PATH_MAX
stop `os.path.realpath`, so a later link that "looks" inside actually leaves the folder.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from serving.errors import ValidationError
from serving.models.artifacts import ArtifactError, extract_archive, materialize
from serving.models.store import ModelStore

Member = Callable[[tarfile.TarFile], None]
SECRET = b"do not touch"


def regular(name: str, data: bytes = b"pwned") -> Member:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))

    return add


def folder(name: str) -> Member:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, 0o777
        tar.addfile(info)

    return add


def special(name: str, kind: bytes, linkname: str = "") -> Member:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, linkname
        if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
            info.devmajor, info.devminor = 1, 3
        tar.addfile(info)

    return add


def realpath_chain(dest_len: int, climb: int) -> list[Member]:
    """CPython's CVE-2025-4517 reproducer: `escape` really points `climb` folders above the
    destination."""
    steps = "abcdefghijklmnop"
    component = "d" * ((os.pathconf("/", "PC_PATH_MAX") - dest_len) // (len(steps) + 1))
    members, path = [], ""
    for step in steps:
        members += [
            folder(os.path.join(path, component)),
            special(os.path.join(path, step), tarfile.SYMTYPE, component),
        ]
        path = os.path.join(path, component)
    linkpath = os.path.join(*steps, "l" * 254)
    members.append(special(linkpath, tarfile.SYMTYPE, os.path.join(*[".."] * len(steps))))
    members.append(special("escape", tarfile.SYMTYPE, os.path.join(linkpath, *[".."] * climb)))
    return members


def hostile(tmp: Path, dest_len: int, climb: int) -> dict[str, list[Member]]:
    """Archives that try to write `tmp/evil` or overwrite `tmp/secret`; `climb` folders lead from
    the destination to tmp."""
    up = "/".join([".."] * climb)
    chain = realpath_chain(dest_len, climb)
    return {
        "realpath chain, file through it": chain + [regular("escape/evil")],
        "realpath chain, hardlink through it": chain
        + [special("flag", tarfile.LNKTYPE, "escape/secret"), regular("flag", b"overwritten")],
        "hardlink to outside": [
            special("flag", tarfile.LNKTYPE, f"{up}/secret"),
            regular("flag", b"overwritten"),
        ],
        "absolute hardlink": [
            special("flag", tarfile.LNKTYPE, f"{tmp}/secret"),
            regular("flag", b"overwritten"),
        ],
        "symlink then file through it": [
            special("code", tarfile.SYMTYPE, up),
            regular("code/evil"),
        ],
        "absolute symlink then file": [
            special("code", tarfile.SYMTYPE, str(tmp)),
            regular("code/evil"),
        ],
        # Lexically inside (a/b/c/up/../../.. is a), really `climb` folders above the destination.
        "symlink to a symlink": [
            folder("a/b/c"),
            special("a/b/c/up", tarfile.SYMTYPE, "../../.."),
            special("x", tarfile.SYMTYPE, "a/b/c/up/" + up),
            regular("x/evil"),
        ],
        "absolute path": [regular("model.skops", b"w"), regular(f"{tmp}/evil")],
        "dot-dot": [regular("model.skops", b"w"), regular(f"{up}/evil")],
        "dot-dot inside a path": [regular("code/" + "../" * (climb + 1) + "evil")],
        "fifo": [special("model.skops", tarfile.FIFOTYPE)],
        "character device": [special("null", tarfile.CHRTYPE)],
        "block device": [special("disk", tarfile.BLKTYPE)],
    }


CASES = list(hostile(Path("/x"), 10, 3))


def write_archive(path: Path, members: list[Member]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for add in members:
            add(tar)
    return path


def snapshot(root: Path, skip: Path) -> dict[str, bytes | None]:
    """Every path under root (links not followed) with a regular file's content, except under
    `skip`."""
    found: dict[str, bytes | None] = {}
    for folder_, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if Path(folder_, d) != skip]
        for name in dirs + files:
            path = Path(folder_, name)
            found[str(path.relative_to(root))] = (
                path.read_bytes() if path.is_file() and not path.is_symlink() else None
            )
    return found


def assert_nothing_written_outside(tmp: Path, before: dict, cache: Path) -> None:
    assert not (tmp / "evil").exists() and not (tmp / "evil").is_symlink()
    assert (tmp / "secret").read_bytes() == SECRET
    assert snapshot(tmp, cache) == before
    leftovers = [p for p in cache.rglob("*") if p.name != ".keep"] if cache.exists() else []
    assert leftovers == [], f"a refused archive left {leftovers}"


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    (tmp_path / "secret").write_bytes(SECRET)
    return tmp_path


@pytest.mark.parametrize("case", CASES)
def test_materialize_refuses_and_writes_nothing_outside(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    cache = tmp / "work" / "cache"
    cache.parent.mkdir()  # materialize creates the cache itself, and its parents
    monkeypatch.setenv("SERVING_MODEL_CACHE_DIR", str(cache))
    # materialize extracts into cache/<16 hex>.<8 random> (mkdtemp): three folders below tmp.
    dest_len = len(str(cache)) + 1 + 16 + 1 + 8 + 1
    archive = write_archive(tmp / "archives" / "model.tar.gz", hostile(tmp, dest_len, 3)[case])
    before = snapshot(tmp, cache)

    with pytest.raises(ArtifactError) as caught:
        materialize(str(archive))

    assert "cannot safely extract model.tar.gz" in str(caught.value)
    assert str(tmp) not in str(caught.value)
    assert_nothing_written_outside(tmp, before, cache)


@pytest.mark.parametrize("case", CASES)
def test_extract_archive_refuses_and_writes_nothing_outside(tmp: Path, case: str) -> None:
    target = tmp / "out" / "model"
    dest_len = len(str(target.parent)) + 1 + len("model.") + 8 + 1
    archive = write_archive(tmp / "archives" / "model.tar.gz", hostile(tmp, dest_len, 2)[case])
    before = snapshot(tmp, target.parent)

    with pytest.raises(ArtifactError):
        extract_archive(archive, target)

    assert not target.exists()
    assert_nothing_written_outside(tmp, before, target.parent)


@pytest.mark.parametrize("case", CASES)
def test_multimodel_store_refuses_naming_the_model_without_server_paths(
    tmp: Path, case: str
) -> None:
    cache = tmp / "cache"
    # ModelStore extracts into cache/.staging-<8>/model.<8>: two folders below tmp.
    dest_len = len(str(cache)) + 1 + len(".staging-") + 8 + 1 + len("model.") + 8 + 1
    write_archive(tmp / "store" / "team" / "evil.tar.gz", hostile(tmp, dest_len, 3)[case])
    store = ModelStore(str(tmp / "store"), cache)
    before = snapshot(tmp, cache)

    with pytest.raises(ValidationError) as caught:
        store.fetch("team/evil.tar.gz")

    error = caught.value
    assert error.status == 400 and error.code == "ValidationError"
    assert "model 'team/evil.tar.gz' cannot be used" in error.message
    for fragment in (str(tmp), "/tmp/", "/work/", "site-packages", "Traceback"):
        assert fragment not in error.message, error.message
    assert store.cached_targets() == []
    assert_nothing_written_outside(tmp, before, cache)


@pytest.mark.parametrize(
    ("member", "kind"),
    [
        (special("model.skops", tarfile.SYMTYPE, "weights/v1.skops"), "symbolic link"),
        (special("model.skops", tarfile.LNKTYPE, "weights/v1.skops"), "hard link"),
        (special("pipe", tarfile.FIFOTYPE), "FIFO"),
        (special("null", tarfile.CHRTYPE), "character device"),
    ],
)
def test_links_and_special_files_are_refused_even_pointing_inside(
    tmp: Path, member: Member, kind: str
) -> None:
    # Models need none of these; refusing them outright does not depend on tarfile's filter being
    # right.
    archive = write_archive(
        tmp / "model.tar.gz", [folder("weights"), regular("weights/v1.skops", b"w"), member]
    )
    with pytest.raises(
        ArtifactError, match=f"is a {kind}; an archive may hold only regular files and folders"
    ):
        extract_archive(archive, tmp / "out" / "model")
    assert not (tmp / "out" / "model").exists()


def test_modes_are_normalised_by_the_data_filter(tmp: Path) -> None:
    def setuid(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo("tool")
        info.size, info.mode = 1, 0o6777
        tar.addfile(info, io.BytesIO(b"x"))

    archive = write_archive(tmp / "model.tar.gz", [setuid])
    out = extract_archive(archive, tmp / "out" / "model")
    mode = (out / "tool").stat().st_mode
    # no setuid/setgid/sticky, not group/other writable
    assert not mode & 0o7000 and not mode & 0o022


def test_a_plain_model_archive_still_extracts(tmp: Path) -> None:
    archive = write_archive(
        tmp / "model.tar.gz",
        [
            folder("code"),
            regular("code/inference.py", b"# hooks\n"),
            regular("model.skops", b"weights"),
            regular("./extra.txt", b"x"),
        ],
    )
    out = extract_archive(archive, tmp / "out" / "model")
    assert (out / "code" / "inference.py").read_bytes() == b"# hooks\n"
    assert (out / "model.skops").read_bytes() == b"weights" and (out / "extra.txt").is_file()


def looping_archive(path: Path) -> Path:
    """A tar whose second header has a negative size, sending the reader back to itself
    (CVE-2025-8194)."""
    import gzip

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        regular("model.skops", b"w")(tar)
        header = tarfile.TarInfo("again").tobuf(tarfile.GNU_FORMAT)
        tar.fileobj.write(header)
        tar.offset += len(header)
    data = bytearray(buffer.getvalue())
    second = 1024  # header, one data block, then this header; after it, -512 leads back to it
    # GNU base-256 size
    data[second + 124 : second + 136] = b"\xff" + ((-512) % 256**11).to_bytes(11, "big")
    data[second + 148 : second + 156] = b" " * 8
    data[second + 148 : second + 156] = b"%06o\0 " % sum(data[second : second + 512])
    path.write_bytes(gzip.compress(bytes(data)))
    return path


@pytest.mark.timeout(5)
def test_an_archive_whose_headers_loop_is_refused_not_read_forever(tmp: Path) -> None:
    # Before 3.11.14 / 3.12.12 / 3.13.6, tarfile itself reads such an archive forever (getmembers
    # never returns).
    archive = looping_archive(tmp / "model.tar.gz")
    with pytest.raises(ArtifactError, match="negative size"):
        extract_archive(archive, tmp / "out" / "model")
    assert not (tmp / "out" / "model").exists()


def test_a_refused_archive_reaches_the_multimodel_caller_as_a_400(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import tempfile

    from serving.models.multimodel import MultiModelHandler
    from serving.runtimes import InvocationContext

    (tmp / "system-tmp").mkdir()
    # the replica's cache goes in there
    monkeypatch.setattr(tempfile, "tempdir", str(tmp / "system-tmp"))
    (tmp / "store").mkdir()
    handler = MultiModelHandler("python", str(tmp / "store"), {}, hostname="mm")
    # Extraction happens in
    # tmp/system-tmp/serving-models-mm-XXXXXXXX/.staging-XXXXXXXX/model.XXXXXXXX.
    dest_len = len(str(handler.cache_dir)) + 1 + len(".staging-") + 8 + 1 + len("model.") + 8 + 1
    write_archive(
        tmp / "store" / "evil.tar.gz", hostile(tmp, dest_len, 4)["realpath chain, file through it"]
    )

    async def scenario() -> ValidationError:
        with pytest.raises(ValidationError) as caught:
            await handler.ainvoke(
                b"[1]", "application/json", None, InvocationContext(target_model="evil.tar.gz")
            )
        return caught.value

    try:
        error = asyncio.run(scenario())
    finally:
        handler.close()
    assert error.status == 400 and "model 'evil.tar.gz' cannot be used" in error.message
    assert (
        "symbolic link" in error.message
        and str(tmp) not in error.message
        and "/tmp/" not in error.message
    )
    assert not (tmp / "evil").exists() and (tmp / "secret").read_bytes() == SECRET
