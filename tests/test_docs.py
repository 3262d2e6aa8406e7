"""The documentation's links: every relative link and ``#anchor`` in README.md and docs/ resolves.

Markdown is parsed with markdown-it-py (CommonMark plus tables, as GitHub renders them), so links in code
blocks are not links and headings are read as rendered text. Anchors follow GitHub's slugs (github-slugger):
the heading's text lowercased, everything but letters, digits, marks, spaces, hyphens and underscores dropped,
spaces turned into hyphens, and a repeated slug suffixed -1, -2, ... External (http, https, mailto) links
are not fetched.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GUIDE = REPO / "docs"
PAGES = [README, *sorted(GUIDE.rglob("*.md"))]
FRONT_PAGE_MAX_LINES = 250

_MARKDOWN = MarkdownIt("commonmark").enable("table")


def _tokens(page: Path):
    """Every token of ``page``, inline children included, in document order."""
    for token in _MARKDOWN.parse(page.read_text(encoding="utf-8")):
        yield token
        yield from token.children or ()


def github_slug(text: str) -> str:
    """The anchor GitHub gives a heading of this rendered text (before de-duplication)."""
    kept = (c for c in text.lower() if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return "".join(kept).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(page: Path) -> frozenset[str]:
    """The ``#anchors`` of a Markdown page: one per heading, repeats numbered as GitHub numbers them."""
    tokens = list(_MARKDOWN.parse(page.read_text(encoding="utf-8")))
    seen: dict[str, int] = {}
    found = set()
    for opening, inline in zip(tokens, tokens[1:]):
        if opening.type != "heading_open":
            continue
        text = "".join(child.content for child in inline.children if child.type in ("text", "code_inline"))
        base = slug = github_slug(text)
        while slug in seen:
            seen[base] += 1
            slug = f"{base}-{seen[base]}"
        seen.setdefault(slug, 0)
        found.add(slug)
    return frozenset(found)


def links(page: Path) -> list[str]:
    """The targets of ``page``'s links and images, as written."""
    targets = []
    for token in _tokens(page):
        if token.type == "link_open":
            targets.append(token.attrs["href"])
        elif token.type == "image":
            targets.append(token.attrs["src"])
    return targets


def broken(page: Path, target: str) -> str | None:
    """Why ``target``, a link on ``page``, does not resolve; None when it does (or is external)."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return None if parts.scheme in ("http", "https", "mailto") else f"unexpected scheme {parts.scheme!r}"
    path = (page.parent / unquote(parts.path)).resolve() if parts.path else page
    if REPO not in path.parents and path != REPO:
        return "points outside the repository"
    relative = path.relative_to(REPO).as_posix()
    if not path.exists():
        return f"{relative} does not exist"
    if parts.fragment:
        if path.suffix != ".md":
            return f"an anchor into {relative}, which is not a Markdown page"
        if unquote(parts.fragment) not in anchors(path):
            return f"{relative} has no heading with the anchor #{parts.fragment}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    problems = [f"{target}: {why}" for target in links(page) if (why := broken(page, target))]
    assert not problems, f"broken links in {page.relative_to(REPO)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("heading, slug", [
    ("Sampling and samplers", "sampling-and-samplers"),
    ("Measured: which sampler, how many steps", "measured-which-sampler-how-many-steps"),
    ("DDIM's tools: inversion, reconstruction", "ddims-tools-inversion-reconstruction"),
    ("Getting the InceptionV3 weights (for `--kid-net keras` / `--fid-net keras`)",
     "getting-the-inceptionv3-weights-for---kid-net-keras----fid-net-keras"),
    ("Outputs (in the work directory)", "outputs-in-the-work-directory"),
    ("Über_große Blüten 2", "über_große-blüten-2"),
])
def test_slugs_follow_github(heading, slug):
    assert github_slug(heading) == slug


def test_repeated_headings_are_numbered(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Measured\n\n## Measured\n\n### Measured\n\n## `ddim eval`\n")
    assert anchors(page) == {"measured", "measured-1", "measured-2", "ddim-eval"}


def test_links_in_code_are_not_links(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](a.md) `[b](b.md)`\n\n```\n[c](c.md)\n```\n\n| x |\n| - |\n| [d](d.md#e) |\n")
    assert links(page) == ["a.md", "d.md#e"]


def test_every_guide_page_is_in_the_table_of_contents():
    index = GUIDE / "README.md"
    listed = {(index.parent / urlsplit(target).path).resolve() for target in links(index)}
    missing = [page.name for page in GUIDE.glob("*.md") if page != index and page.resolve() not in listed]
    assert not missing, f"pages not linked from docs/README.md: {missing}"
    assert "docs/README.md" in links(README), "the README links the user guide's table of contents"


def test_the_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= FRONT_PAGE_MAX_LINES, f"README.md has {lines} lines; move detail into the user guide (docs/)"


def test_the_readme_test_command_is_the_one_ci_runs():
    """.ci/run runs the README's test command, copied verbatim under a marker comment: they must not drift."""
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    marker = ci.index("# The README's test command, verbatim:")
    command = ci[marker + 1].strip()
    blocks = [token.content for token in _MARKDOWN.parse(README.read_text(encoding="utf-8")) if token.type == "fence"]
    assert any(command in block.splitlines() for block in blocks), f"README.md has no code line {command!r}"
