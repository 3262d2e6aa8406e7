"""A Markdown page's text as the checks of the docs read it: each heading, paragraph and list item, and each
table row with its table's header, in order; code blocks left out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from markdown_it import MarkdownIt

MARKDOWN = MarkdownIt("commonmark").enable("table")


@dataclass(frozen=True)
class Block:
    """One piece of a page's text, of a ``kind``: "heading", "text" (a paragraph or list item), "header" (a
    table's first row) or "row" (a table's other rows)."""

    kind: str
    text: str  # the inline text; a row's cells joined by " | "
    cells: tuple[str, ...]  # a header's or row's cells, else ()
    header: tuple[str, ...]  # the table's header cells, for a header or a row
    line: int  # the last line (0-based) of the page that the parser had reached


def markdown_blocks(text: str) -> Iterator[Block]:
    """The :class:`Block` of each heading, paragraph, list item and table row of the Markdown ``text``."""
    header: tuple[str, ...] = ()
    row: list[str] | None = None
    in_heading, line = False, 0
    for token in MARKDOWN.parse(text):
        line = token.map[0] if token.map else line
        if token.type == "heading_open":
            in_heading = True
        elif token.type == "heading_close":
            in_heading = False
        elif token.type == "thead_open":
            header = ()
        elif token.type == "tr_open":
            row = []
        elif token.type == "tr_close":
            kind = "row" if header else "header"
            header = header or tuple(row)
            yield Block(kind, " | ".join(row), tuple(row), header, line)
            row = None
        elif token.type == "inline":
            if row is not None:
                row.append(token.content)
            else:
                yield Block("heading" if in_heading else "text", token.content, (), (), line)
