"""What a benchmark leaves behind: its results JSON, its section of a docs page, and the facts that
make a number comparable (machine, versions, the command that produced it)."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata as metadata
import json
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """A detached git worktree of `revision` in a temporary folder, removed afterwards (a
    baseline's tree, run with the same interpreter and packages)."""
    folder = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(folder), revision],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    try:
        yield folder
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT, capture_output=True
        )


def write_section(path: Path, name: str, text: str, title: str | None = None) -> None:
    """Replace (or append) the part of `path` owned by `name`; create the page with `title` (`#
    name`) if needed."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    block = f"{begin}\n{text.strip()}\n{end}"
    page = path.read_text() if path.exists() else f"{title or '# ' + name}\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(page):
        page = pattern.sub(lambda _: block, page, count=1)
    else:
        page = page.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)


def write_results(path: Path, result: dict[str, Any], indent: int = 2) -> None:
    """The results JSON (its folder created), ending in a newline."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent) + "\n")


def command_line(script: str) -> str:
    """How this run was started (`python -m loadtests.NAME ...` for the module file `script`), the
    interpreter relative to the repository where possible (for the docs)."""
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):
        python = python.relative_to(ROOT) if python.is_relative_to(ROOT) else python
    module = ".".join(Path(script).resolve().relative_to(ROOT).with_suffix("").parts)
    return shlex.join([str(python), "-m", module, *sys.argv[1:]])


def run_meta(script: str, **settings: Any) -> dict[str, Any]:
    """What every run's results begin with: its command line, when it started, the machine, our
    versions, and the benchmark's own `settings`. `run_line` writes it back once "seconds" (the
    run's length) is set."""
    return {
        "command": command_line(script),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "versions": our_versions(),
        **settings,
    }


def run_line(saved: dict[str, Any], results: Path) -> str:
    """The docs' last line for a run saved with "command", "started", "seconds" and
    `machine_facts()` as "machine"."""
    return (
        f"Run: `{saved['command']}` at {saved['started']} ({saved['seconds']:.0f} s); load average before "
        f"{saved['machine']['loadavg_at_start']}; {saved['machine']['nproc']} CPUs. Results: "
        f"`{results.relative_to(ROOT)}`."
    )


def package_versions(names: tuple[str, ...]) -> dict[str, str]:
    """Python's and each installed package's version ("-" for one not installed)."""
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "-"
    return versions


def machine_facts() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    nproc = subprocess.run(["nproc"], capture_output=True, text=True, timeout=10).stdout.strip()
    return {
        "nproc": nproc,
        "cpu_model": model,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "loadavg_at_start": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
    }


def our_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for name in (
        "ray",
        "scikit-learn",
        "numpy",
        "skops",
        "uvicorn",
        "starlette",
        "aiohttp",
        "uvloop",
        "httptools",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    path = shutil.which("wrk")
    if path is None:  # not installed yet: the benchmark's ensure_wrk installs it, or says how
        versions["wrk"] = "?"
        return versions
    wrk = subprocess.run([path, "-v"], capture_output=True, text=True, timeout=10)
    versions["wrk"] = (
        (wrk.stdout + wrk.stderr).splitlines()[0].split(" Copyright")[0]
        if (wrk.stdout + wrk.stderr)
        else "?"
    )
    return versions
