"""``ddim configs``: the configs that ship with ddim, a line each, or one of them printed to start a file from.

A thin wrapper over :mod:`ddim.config.named`.
"""

from __future__ import annotations

from typing import Optional

import typer

from ddim.cli.app import app, user_errors


@app.command("configs")
def configs(name: Optional[str] = typer.Argument(None, help="Print this packaged config (to edit a copy: "
                                                 "`ddim configs NAME > my.toml`, then --config my.toml).")):
    """The packaged configs, a line each: name, image size, how a run starts, what it is for.

    Every command that takes --config takes one of these names, or a TOML file of your own.
    """
    from ddim.config import named

    with user_errors():
        if name is not None:
            typer.echo(named.resolve(name).read_text(), nl=False)
            return
        lines = [("name", "size", "start", "for")]
        lines += [(row.name, size_of(row), start_of(row), row.summary) for row in map(named.describe, named.names())]
    widths = [max(len(line[column]) for line in lines) for column in range(3)]  # the last column is not padded
    for line in lines:
        typer.echo("  ".join(text.ljust(width) for text, width in zip(line, widths)) + f"  {line[3]}")


def size_of(row) -> str:
    """The image size a run of the config trains at: its own, its source's, or its teacher's."""
    if row.image_size is not None:
        return f"{row.image_size}px"
    if row.kind == "distillation":
        return "teacher's"
    from ddim.pretrained.registry import find, pretrained_name

    name = pretrained_name(row.source)
    return f"{find(name).config.model.image_size}px" if name is not None else "source's"


def start_of(row) -> str:
    return f"fine-tune of {row.source.removeprefix('pretrained:')}" if row.kind == "fine-tune" else row.kind
