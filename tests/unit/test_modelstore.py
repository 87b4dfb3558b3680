"""serving.models.artifacts: directories pass through, archives unpack into the cache, crafted
archives are refused."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from serving.models.artifacts import ArtifactError, materialize

Member = Callable[[tarfile.TarFile], None]


def regular(name: str, data: bytes = b"data") -> Member:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(data))

    return add


def link(name: str, target: str, kind: bytes) -> Member:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = target
        tar.addfile(info)

    return add


def device(name: str) -> Member:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type = tarfile.CHRTYPE
        info.devmajor, info.devminor = 1, 3
        tar.addfile(info)

    return add


def write_archive(path: Path, *members: Member) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for add in members:
            add(tar)
    return path


def tree(root: Path) -> set[str]:
    """Every path under root (links not followed), relative to it."""
    found = set()
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(folder, name), root))
    return found


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "work" / "cache"
    cache.parent.mkdir()  # the cache itself is created on first use
    monkeypatch.setenv("SERVING_MODEL_CACHE_DIR", str(cache))
    return cache


def test_none_is_no_model() -> None:
    assert materialize(None) is None


@pytest.mark.parametrize("prefix", ["", "file://"])
def test_directory_passes_through_without_copying(
    tmp_path: Path, cache_dir: Path, prefix: str
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.skops").write_bytes(b"x")
    assert materialize(prefix + str(model)) == model
    assert not cache_dir.exists()


@pytest.mark.parametrize("suffix", [".tar.gz", ".tgz"])
def test_archive_is_extracted_into_the_cache(tmp_path: Path, cache_dir: Path, suffix: str) -> None:
    archive = write_archive(
        tmp_path / f"model{suffix}",
        regular("model.skops", b"weights"),
        regular("code/inference.py", b"# hooks\n"),
    )
    folder = materialize("file://" + str(archive))
    assert folder is not None and folder.parent == cache_dir
    assert (folder / "model.skops").read_bytes() == b"weights"
    assert (folder / "code" / "inference.py").read_bytes() == b"# hooks\n"
    assert tree(cache_dir) == {
        folder.name,
        f"{folder.name}/model.skops",
        f"{folder.name}/code",
        f"{folder.name}/code/inference.py",
    }


def test_same_archive_is_extracted_once(tmp_path: Path, cache_dir: Path) -> None:
    archive = write_archive(tmp_path / "model.tar.gz", regular("model.skops", b"v1"))
    first = materialize(str(archive))
    (first / "marker").write_text("kept")  # a second extraction would not have it
    second = materialize(str(archive))
    assert second == first
    assert (second / "marker").read_text() == "kept"


def test_changed_archive_is_extracted_again(tmp_path: Path, cache_dir: Path) -> None:
    archive = write_archive(tmp_path / "model.tar.gz", regular("model.skops", b"v1"))
    first = materialize(str(archive))
    write_archive(archive, regular("model.skops", b"version two"), regular("extra", b"more"))
    second = materialize(str(archive))
    assert second != first
    assert (second / "model.skops").read_bytes() == b"version two"
    assert (first / "model.skops").read_bytes() == b"v1"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda tmp: str(tmp / "absent"), "does not exist"),
        (lambda tmp: "file://" + str(tmp / "absent.tar.gz"), "does not exist"),
        (lambda tmp: _plain_file(tmp / "weights.bin"), "neither a directory nor a .tar.gz"),
        (
            lambda tmp: _plain_file(tmp / "broken.tar.gz", b"this is not gzip"),
            "cannot safely extract broken.tar.gz",
        ),
    ],
    ids=["missing dir", "missing archive", "plain file", "corrupt archive"],
)
def test_unusable_model_data(tmp_path: Path, cache_dir: Path, make, reason: str) -> None:
    with pytest.raises(ArtifactError, match=reason):
        materialize(make(tmp_path))
    assert not cache_dir.exists() or tree(cache_dir) == set()


def _plain_file(path: Path, data: bytes = b"\0") -> str:
    path.write_bytes(data)
    return str(path)


# Each archive tries to place something outside its extraction folder. The archive sits
# in tmp/archives and the cache in tmp/work/cache, so "../../../" from a staging folder
# (tmp/work/cache/<key>.xyz) reaches tmp itself. Entries take tmp as a string.
MALICIOUS = [
    ("dot-dot member", lambda tmp: [regular("model.skops"), regular("../../../evil", b"pwned")]),
    ("dot-dot inside a path", lambda tmp: [regular("code/../../../../evil", b"pwned")]),
    (
        "absolute path member",
        lambda tmp: [regular("model.skops"), regular(f"{tmp}/evil", b"pwned")],
    ),
    (
        "symlink to outside",
        lambda tmp: [link("escape", "../../..", tarfile.SYMTYPE), regular("escape/evil", b"pwned")],
    ),
    (
        "absolute symlink",
        lambda tmp: [link("escape", tmp, tarfile.SYMTYPE), regular("escape/evil", b"pwned")],
    ),
    (
        "symlink written through",
        lambda tmp: [link("code", "../../../", tarfile.SYMTYPE), regular("code/evil", b"pwned")],
    ),
    ("hardlink to outside", lambda tmp: [link("stolen", "../../../secret", tarfile.LNKTYPE)]),
    ("absolute hardlink", lambda tmp: [link("stolen", f"{tmp}/secret", tarfile.LNKTYPE)]),
    ("device file", lambda tmp: [device("null")]),
]


@pytest.mark.parametrize(
    "members", [case[1] for case in MALICIOUS], ids=[case[0] for case in MALICIOUS]
)
def test_malicious_archive_is_refused_and_writes_nothing_outside(
    tmp_path: Path, cache_dir: Path, members: Callable[[str], list[Member]]
) -> None:
    (tmp_path / "secret").write_text("do not link me")
    archive = write_archive(tmp_path / "archives" / "model.tar.gz", *members(str(tmp_path)))
    before = tree(tmp_path)

    with pytest.raises(ArtifactError, match="cannot safely extract model.tar.gz"):
        materialize(str(archive))

    assert not (tmp_path / "evil").exists()
    assert (tmp_path / "secret").read_text() == "do not link me"
    outside = {
        path for path in tree(tmp_path) - before if not (tmp_path / path).is_relative_to(cache_dir)
    }
    assert outside == set(), f"written outside the cache: {outside}"
    # A refused archive leaves neither a target nor a half-extracted staging folder behind.
    assert tree(cache_dir) == set()


def test_absolute_member_never_lands_at_its_absolute_path(tmp_path: Path, cache_dir: Path) -> None:
    # Containment on its own, whether or not the archive is refused (see the table above).
    archive = write_archive(
        tmp_path / "archives" / "model.tar.gz", regular(f"{tmp_path}/evil", b"pwned")
    )
    before = tree(tmp_path)
    try:
        materialize(str(archive))
    except ArtifactError:
        pass
    assert not (tmp_path / "evil").exists()
    outside = {
        path for path in tree(tmp_path) - before if not (tmp_path / path).is_relative_to(cache_dir)
    }
    assert outside == set()
