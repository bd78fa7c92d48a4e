"""The documentation holds together: README.md is a short front door that links every page
under docs/, every relative link in README.md and docs/ resolves (the file, and the heading of
an #anchor by GitHub's rule), and no page speaks of how the work was organised. Pure: reads
files."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 250

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
# [text](target) and ![alt](target), with an optional "title"; the text may hold `code`.
LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\(\s*<?(?P<target>[^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...
FORBIDDEN = {
    "an issue number": re.compile(r"\bissues? ?#?\d", re.IGNORECASE),
    "a session": re.compile(r"\bsessions?\b", re.IGNORECASE),
}


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/ (generated ones included)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def top_pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and match and match.group(1)[0] == fence[0]:
            if len(match.group(1)) >= len(fence) and not line.strip()[len(match.group(1)) :]:
                fence = None
        elif fence is None:
            out.append((number, line))
    return out


def github_anchor(heading: str) -> str:
    """GitHub's slug of a heading: markup dropped, lowercased, every character other than a
    letter, digit, space, '-' or '_' removed, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor a page's headings make, duplicates suffixed -1, -2, ... as GitHub does."""
    seen: dict[str, int] = {}
    made: set[str] = set()
    for _, line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_anchor(match.group(2))
        if slug in seen:
            seen[slug] += 1
            made.add(f"{slug}-{seen[slug]}")
        else:
            seen[slug] = 0
            made.add(slug)
    return frozenset(made)


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each run of prose lines between blank lines and code."""
    blocks: list[tuple[int, list[str]]] = []
    previous = -1
    for number, line in prose_lines(text):
        if not line.strip():
            previous = -1
            continue
        if number != previous + 1:
            blocks.append((number, []))
        blocks[-1][1].append(line)
        previous = number
    return [(start, "\n".join(lines)) for start, lines in blocks]


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link outside code; a link's text may wrap."""
    found: list[tuple[int, str]] = []
    for start, block in paragraphs(path.read_text()):
        # Blank out code spans, keeping their newlines so that line numbers stay right.
        prose = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), block)
        for match in LINK.finditer(prose):
            found.append((start + prose.count("\n", 0, match.start()), match.group("target")))
    return found


def relative_links(path: Path) -> list[tuple[int, str]]:
    return [(n, t) for n, t in links(path) if not EXTERNAL.match(t)]


def where(path: Path, number: int) -> str:
    return f"{path.relative_to(REPO)}:{number}"


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_links_every_docs_page() -> None:
    linked = {
        (README.parent / target.split("#", 1)[0]).resolve()
        for _, target in relative_links(README)
        if target.split("#", 1)[0]
    }
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert missing == [], f"docs pages README.md does not link: {missing}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for number, target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{where(page, number)}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where(page, number)}: {target}: no heading #{anchor}")
    assert broken == [], "\n".join(broken)


@pytest.mark.parametrize("page", top_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_speaks_of_how_the_work_was_organised(page: Path) -> None:
    found = [
        f"{where(page, number)}: {what}: {line.strip()}"
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for what, pattern in FORBIDDEN.items()
        if pattern.search(line)
    ]
    assert found == [], "\n".join(found)


def test_the_anchor_rule() -> None:
    assert github_anchor("Check the network first: `orchestrate check CONFIG`") == (
        "check-the-network-first-orchestrate-check-config"
    )
    assert github_anchor("Which Keras: `TF_USE_LEGACY_KERAS`") == "which-keras-tf_use_legacy_keras"
    assert github_anchor("What is detected, and how") == "what-is-detected-and-how"
    assert github_anchor("Bad input: one line, exit 2, nothing started") == (
        "bad-input-one-line-exit-2-nothing-started"
    )
