"""The documentation's links: every relative link and ``#anchor`` in README.md and docs/ resolves.

Anchors are GitHub's slugs of the headings (tests/docs_helpers.py reads the pages and makes them); links in
code are not links, and external links are not fetched. Every page of the user guide is in its table of
contents; the docs pointers of the program (``--help``, tips, errors and docstrings of ddim's code) name pages,
anchors and sections that exist; and a page links the Keras example where it first names it.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.docs_helpers import GUIDE, PAGES, README, REPO, anchors, broken, github_slug, links
from tests.markdown_blocks import MARKDOWN


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


# --- pointers from the program into the guide: `--help`, tips and errors name pages and sections that exist ------

POINTER = re.compile(r"docs/[\w./-]+?\.md(?:#[\w-]+)?")
NAMED_SECTION = re.compile(r"user guide(?:'s|,) '([^']+)'")  # "the user guide's 'Bundled models' page"


def help_texts() -> dict[str, str]:
    """Every command's and option's help, by ``ddim COMMAND [--option]``, as ``--help`` shows it."""
    import typer

    from ddim.cli import app

    texts = {}

    def walk(command, path):
        texts[path] = command.help or ""
        for param in command.params:
            texts[f"{path} {param.opts[0]}"] = getattr(param, "help", None) or ""
        for name, sub in getattr(command, "commands", {}).items():  # a group's subcommands
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "ddim")
    return texts


def source_pointers() -> dict[str, str]:
    """The docs pointers in ddim's own code (tips, errors, docstrings), by file."""
    return {path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8")
            for path in sorted((REPO / "ddim").rglob("*.py"))}


def headings() -> set[str]:
    """The rendered text of every heading of the README and the guides."""
    found = set()
    for page in PAGES:
        tokens = list(MARKDOWN.parse(page.read_text(encoding="utf-8")))
        for opening, inline in zip(tokens, tokens[1:]):
            if opening.type == "heading_open":
                found.add("".join(child.content for child in inline.children if child.type in ("text", "code_inline")))
    return found


def pointer_problems(texts: dict[str, str]) -> list[str]:
    problems = []
    for where, text in texts.items():
        text = re.sub(r"\s+", " ", text)
        for target in POINTER.findall(text):
            why = broken(README, target)
            if why:
                problems.append(f"{where}: {target}: {why}")
        problems += [f"{where}: the guide has no section {name!r}" for name in NAMED_SECTION.findall(text)
                     if name not in headings()]
    return problems


def test_every_help_pointer_names_an_existing_page_and_section():
    texts = help_texts()
    assert any(POINTER.search(text) for text in texts.values()), "the check sees the help's pointers"
    problems = pointer_problems(texts)
    assert not problems, "`--help` points to pages or sections that do not exist:\n" + "\n".join(problems)


def test_every_pointer_in_the_code_names_an_existing_page_and_section():
    problems = pointer_problems(source_pointers())
    assert not problems, "ddim's code points to pages or sections that do not exist:\n" + "\n".join(problems)


def test_the_pointer_check_catches_a_missing_section():
    assert pointer_problems({"x": "See docs/sampling.md#which-sampler-how-many-steps and the user guide's "
                                  "'Bundled models' page."}) == []
    assert pointer_problems({"x": "See the user guide, 'Sampling and samplers'."}) == [
        "x: the guide has no section 'Sampling and samplers'"]
    assert pointer_problems({"x": "docs/sampling.md#samplers-and-steps, docs/nowhere.md"}) == [
        "x: docs/sampling.md#samplers-and-steps: docs/sampling.md has no heading with the anchor #samplers-and-steps",
        "x: docs/nowhere.md: docs/nowhere.md does not exist"]


# --- the Keras example: linked where a page first names it ------------------------------------------------------

KERAS_EXAMPLE = "https://keras.io/examples/generative/ddim/"
NAMES_KERAS = re.compile(r"Keras(?: DDIM)? (?:example|network|recipe)")


def first_mention_links(page: Path, phrase: re.Pattern, url: str) -> bool | None:
    """Whether the first paragraph, list item or table cell of ``page`` (headings left out) that names ``phrase``
    in its text links ``url``; None when the page never names it."""
    tokens = list(MARKDOWN.parse(page.read_text(encoding="utf-8")))
    for previous, token in zip([None, *tokens], tokens):
        if token.type != "inline" or (previous is not None and previous.type == "heading_open"):
            continue
        text = "".join(child.content for child in token.children if child.type == "text")
        if phrase.search(text):
            return any(child.type == "link_open" and child.attrs["href"] == url for child in token.children)
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_a_page_links_the_keras_example_where_it_first_names_it(page):
    assert first_mention_links(page, NAMES_KERAS, KERAS_EXAMPLE) is not False, (
        f"{page.relative_to(REPO)} names the Keras example without linking it ({KERAS_EXAMPLE}) the first time")


def test_the_keras_check_sees_an_unlinked_first_mention(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# The Keras example\n\nAs the Keras network does.\n\nThe [Keras example]({KERAS_EXAMPLE}).\n")
    assert first_mention_links(page, NAMES_KERAS, KERAS_EXAMPLE) is False
    page.write_text(f"# The Keras example\n\n`Keras example` and the [Keras example]({KERAS_EXAMPLE}).\n")
    assert first_mention_links(page, NAMES_KERAS, KERAS_EXAMPLE) is True
