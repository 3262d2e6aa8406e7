"""The README and the guides as the checks of the docs read them: their pages, links, anchors and ``ddim`` commands.

Markdown is parsed with markdown-it-py (CommonMark plus tables, as GitHub renders them), so links in code
blocks are not links and headings are read as rendered text. Anchors follow GitHub's slugs (github-slugger):
the heading's text lowercased, everything but letters, digits, marks, spaces, hyphens and underscores dropped,
spaces turned into hyphens, and a repeated slug suffixed -1, -2, ... External (http, https, mailto) links
are not fetched. A command shown is parsed as the CLI parses it, without running it.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.markdown_blocks import MARKDOWN

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GUIDE = REPO / "docs"
PAGES = [README, *sorted(GUIDE.rglob("*.md"))]


def _tokens(page: Path):
    """Every token of ``page``, inline children included, in document order."""
    for token in MARKDOWN.parse(page.read_text(encoding="utf-8")):
        yield token
        yield from token.children or ()


# --- links and anchors -------------------------------------------------------------------------------------------


def github_slug(text: str) -> str:
    """The anchor GitHub gives a heading of this rendered text (before de-duplication)."""
    kept = (c for c in text.lower() if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return "".join(kept).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(page: Path) -> frozenset[str]:
    """The ``#anchors`` of a Markdown page: one per heading, repeats numbered as GitHub numbers them."""
    tokens = list(MARKDOWN.parse(page.read_text(encoding="utf-8")))
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


# --- the commands shown ------------------------------------------------------------------------------------------

PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")  # N, NAME, DIR, FOLDER, RUN: a value the reader fills in
SYNOPSIS = re.compile(r"\[|\.\.\.|<")  # `ddim train [--config FILE] ...`: a usage line, not a command


def shown_commands(page: Path, inline: bool = True) -> list[str]:
    """The ``ddim`` commands of ``page``: code-block lines (continuations joined, comments dropped, split at
    ``&&``, ``|`` and ``;``), and with ``inline`` the inline code that starts with ``ddim``; synopses left out."""
    found = []
    for token in _tokens(page):
        if token.type == "fence":
            found += block_commands(token.content)
        elif token.type == "code_inline" and inline:
            found += block_commands(token.content)
    return found


def block_commands(block: str) -> list[str]:
    """The ``ddim`` commands of one code block (or inline code), as :func:`shown_commands` reads them."""
    found = []
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        for part in re.split(r"&&|\|\||;|\|", line):
            words = part.strip()
            if words.startswith("ddim ") or words == "ddim":
                found.append(words)
    return [command for command in found if not SYNOPSIS.search(command)]


def command_words(command: str) -> list[str]:
    words = shlex.split(command, comments=True)
    return ["1" if PLACEHOLDER.fullmatch(word) else word for word in words[1:]]


def parse_command(words: list[str]):
    """Parse ``ddim WORDS`` as the CLI does, without running it: ``(the command, its parameters)``; click's own
    error (an unknown command or option, a value of the wrong type, a missing one) when it does not parse."""
    import typer

    from ddim.cli import app

    command = typer.main.get_command(app)
    context = command.make_context("ddim", list(words))
    while hasattr(command, "resolve_command"):  # a group: its subcommand
        rest = [*(getattr(context, "_protected_args", None) or getattr(context, "protected_args", [])), *context.args]
        if not rest:
            break
        name, command, rest = command.resolve_command(context, rest)
        context = command.make_context(name, rest, parent=context)
    return command, context.params
