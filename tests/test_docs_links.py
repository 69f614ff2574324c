"""The README stays a page (under 250 lines) and every relative link of README.md and docs/*.md reaches a file
that exists, and a heading that exists where the link names one (GitHub's anchor rules)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not t.startswith(("http://", "https://", "mailto:"))]


def test_the_readme_fits_a_page():
    assert len((ROOT / "README.md").read_text().splitlines()) < 250


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_reach_a_file_and_heading(page):
    broken = []
    for target in links(page):
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if "*" in path:
            ok = any(dest.parent.glob(dest.name))
        else:
            ok = dest.exists() and (not frag or dest.suffix != ".md" or frag in anchors(dest))
        if not ok:
            broken.append(target)
    assert broken == []


def test_anchor_follows_githubs_rules():
    assert anchor("`SPECDEC_DEMO_DRAFT=eagle3 make demo`: the story") == "specdec_demo_drafteagle3-make-demo-the-story"
    assert anchor("Training an EAGLE-3 head") == "training-an-eagle-3-head"
