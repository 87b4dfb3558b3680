"""Write one benchmark's part of a docs page, leaving the other benchmarks' parts alone.

Several benchmarks write docs/performance.md. Each owns the text between
`<!-- begin NAME -->` and `<!-- end NAME -->`; a part not yet in the page is appended.
"""

from __future__ import annotations

import re
from pathlib import Path


def write_section(path: Path, name: str, text: str, title: str = "# Performance") -> None:
    """Replace (or append) the part of `path` owned by `name`; create the page with `title` if needed."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    block = f"{begin}\n{text.strip()}\n{end}"
    page = path.read_text() if path.exists() else f"{title}\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(page):
        page = pattern.sub(lambda _: block, page, count=1)
    else:
        page = page.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
