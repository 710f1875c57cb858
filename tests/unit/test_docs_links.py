"""Every relative link of the README and docs/ points at a file that exists, and at a
heading that exists in it (the reference moved from the README to docs/, issue 41)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings (lower case, punctuation dropped)."""
    out, in_code = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,6} ", line):
            text = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


LINKS = [
    pytest.param(page, target, id=f"{page.relative_to(ROOT)}->{target}")
    for page in PAGES
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    if not re.match(r"[a-z]+://|mailto:", target)
]


@pytest.mark.parametrize(("page", "target"), LINKS)
def test_a_relative_link_resolves(page, target):
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    assert dest.exists(), f"{page.name}: no {path}"
    if anchor and dest.suffix == ".md":
        assert anchor in anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"
