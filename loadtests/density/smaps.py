"""Where a process's memory lies, from /proc/PID/smaps: PSS and private pages per mapping, grouped
by what mapped them (a package under site-packages, the interpreter, system libraries, the heap and
anonymous memory). Shared library pages are what processes of one stack could share; heap and
anonymous pages (Python objects, framework allocations) are each process's own."""

from __future__ import annotations

from pathlib import Path

HEAP = "heap and anonymous"
PYTHON = "python (interpreter, stdlib)"
SYSTEM = "system libraries"
OTHER = "other files"


def category(path: str) -> str:
    """What a mapping's path belongs to: a site-packages package (its `.libs` folder counted with
    it), the interpreter, a system library, other files, or heap/anonymous memory."""
    if not path or path.startswith("["):  # [heap], [stack], [anon:...], [vdso]
        return HEAP
    if "/site-packages/" in path:
        top = path.split("/site-packages/", 1)[1].split("/", 1)[0]
        top = top.removesuffix(".libs")
        if top.endswith(".so"):  # a top-level extension module: _brotli.cpython-311-...so
            top = top.split(".", 1)[0]
        return top.lstrip("_") or top
    if "/lib/python3" in path or "libpython3" in path or "/bin/python" in path:
        return PYTHON
    if path.startswith(("/usr/lib", "/lib", "/usr/local/lib")):
        return SYSTEM
    return OTHER


def parse(text: str) -> dict[str, dict[str, int]]:
    """/proc/PID/smaps text -> {category: {"pss", "private", "shared"}} in bytes."""
    groups: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in text.splitlines():
        first = line.split(None, 1)[0] if line.strip() else ""
        if "-" in first and not first.endswith(":"):  # a mapping's header: range perms offset ...
            fields = line.split(None, 5)
            path = fields[5].strip() if len(fields) > 5 else ""
            current = groups.setdefault(category(path), {"pss": 0, "private": 0, "shared": 0})
            continue
        if current is None or not line.endswith("kB"):
            continue
        key, value = line.split(":", 1)
        size = int(value.split()[0]) * 1024
        if key == "Pss":
            current["pss"] += size
        elif key in ("Private_Clean", "Private_Dirty"):
            current["private"] += size
        elif key in ("Shared_Clean", "Shared_Dirty"):
            current["shared"] += size
    return groups


def read(pid: int) -> dict[str, dict[str, int]] | None:
    """`parse` of a live process, or None when it is gone (or not ours to read)."""
    try:
        return parse(Path(f"/proc/{pid}/smaps").read_text())
    except OSError:
        return None


def top(groups: dict[str, dict[str, int]], count: int = 4) -> list[tuple[str, dict[str, int]]]:
    """The `count` categories holding the most PSS, largest first."""
    return sorted(groups.items(), key=lambda item: -item[1]["pss"])[:count]
