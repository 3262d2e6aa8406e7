"""The ``ddim`` command line: thin Typer wrappers over importable functions.

One module per command (or family of commands), each registering itself on
:data:`ddim.cli.app.app`. Expected failures (a :class:`ddim.errors.UserError`:
bad config, missing checkpoint, unusable output directory, ...) print one
``error:`` line on stderr and exit with status 1 (2 for bad arguments), never
a traceback.
"""

from __future__ import annotations

from ddim.cli import configs, data, distill, env, evaluate, pretrained, sample, serve, tools, train  # noqa: F401  (each registers its command)
from ddim.cli.app import app

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover - console script entry point
    from ddim import runtime

    runtime.restart_with_fast_allocator()  # before JAX loads; see ddim/runtime.py
    app()
