"""A model's `code/requirements.txt`: its lines, and whether this environment already satisfies
them."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

REQUIREMENTS_FILE = "requirements.txt"


def parse_requirements(text: str) -> list[str]:
    """The requirement lines (comments and blanks dropped); pip options are refused, naming the
    line."""
    lines = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise ValueError(
                f"code/{REQUIREMENTS_FILE}: {line!r} is a pip option; list requirement specifiers or wheel paths only"
            )
        lines.append(line)
    return lines


def missing_requirements(code_folder: Path) -> list[str]:
    """The lines of `code_folder/requirements.txt` this environment does not satisfy."""
    path = code_folder / REQUIREMENTS_FILE
    if not path.is_file():
        return []
    return unmet(parse_requirements(path.read_text(encoding="utf-8")))


def unmet(lines: list[str], unknown_unmet: bool = False) -> list[str]:
    """Those of the requirement `lines` this environment does not satisfy (a version that does not
    match says which one is installed). A line naming no project (a URL) counts as met unless
    `unknown_unmet`."""
    missing = []
    for line in lines:
        reason = _unmet(line, unknown_unmet)
        if reason is not None:
            missing.append(reason)
    return missing


def _unmet(line: str, unknown_unmet: bool) -> str | None:
    from packaging.requirements import InvalidRequirement, Requirement

    requirement: Requirement | None
    try:
        requirement = Requirement(line)
    # a wheel path or URL: installed under its project name, unknown here
    except InvalidRequirement:
        name = Path(line).name.split("-", 1)[0]
        requirement = Requirement(name) if name.replace("_", "").isalnum() else None
    if requirement is None:
        return line if unknown_unmet else None
    try:
        installed = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        return line
    if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
        return f"{line} (installed: {installed})"
    return None
