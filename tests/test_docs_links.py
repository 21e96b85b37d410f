"""Every relative link in README.md and docs/ names a file or folder the repository holds (the raw JSONs a
figure cites, the docs that cite each other)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(doc: Path) -> list[str]:
    return [t.split("#", 1)[0] for t in LINK.findall(doc.read_text(encoding="utf-8"))
            if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_every_relative_link_in_the_docs_resolves() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    links = [(doc, t) for doc in docs for t in _relative_links(doc)]
    missing = sorted({f"{doc.name}: {t}" for doc, t in links if not (doc.parent / t).exists()})
    assert len(links) > 20 and missing == []
