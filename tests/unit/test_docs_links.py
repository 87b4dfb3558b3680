"""Every relative link in the docs resolves: the file (or folder) exists, and a `#anchor` into a
markdown file of this repository names one of its headings, by GitHub's slug rules. Moving a section
to another page cannot leave a dead link behind."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    {
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "loadtests" / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "containers").rglob("README.md"),
        *(ROOT / "deploy").rglob("README.md"),
    }
)

FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)


def prose(text: str) -> str:
    """The page without fenced code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text, lower case, without punctuation, spaces as
    hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    # emphasis markers, not snake_case's underscores
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub gives `page`: one per heading (repeats numbered -1, -2, ...) and any HTML
    anchors."""
    text = page.read_text(encoding="utf-8")
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for _, heading in HEADING.findall(FENCE.sub("", text)):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    text = prose(page.read_text(encoding="utf-8"))
    return LINK.findall(text) + REFERENCE.findall(text)


def broken(page: Path) -> list[str]:
    problems = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not path.exists():
            problems.append(f"{target}: no such file")
        elif not path.is_relative_to(ROOT):
            problems.append(f"{target}: outside the repository")
        elif anchor and path.suffix == ".md" and unquote(anchor).lower() not in anchors(path):
            problems.append(f"{target}: no heading with that anchor in {path.relative_to(ROOT)}")
    return problems


def test_slug_follows_github() -> None:
    assert (
        slug("Process priority: Ray's worker niceness") == "process-priority-rays-worker-niceness"
    )
    assert slug("Consolidation: one 15-container endpoint vs fifteen endpoints") == (
        "consolidation-one-15-container-endpoint-vs-fifteen-endpoints"
    )
    assert slug("Inside the replicas (py-spy)") == "inside-the-replicas-py-spy"
    assert slug("`hop_unix_socket` and the *floor*") == "hop_unix_socket-and-the-floor"
    assert slug("bench_one_write") == "bench_one_write"
    assert (
        slug("Serve replica start: the runtime_env's cost")
        == "serve-replica-start-the-runtime_envs-cost"
    )


def test_pages_are_found() -> None:
    names = {page.relative_to(ROOT).as_posix() for page in PAGES}
    assert {"README.md", "CONTRIBUTING.md", "docs/performance.md", "loadtests/README.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    assert broken(page) == []
