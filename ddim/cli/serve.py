"""``ddim serve``: a local web page over a checkpoint (:mod:`ddim.ui`, the ``[ui]`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddim.cli.app import (
    app,
    checkpoint_option,
    checkpoint_source,
    compilation_cache_option,
    fail,
    pretrained_option,
    require_positive,
    setup_runtime,
    user_errors,
    workdir_option,
)


@app.command()
def serve(
    workdir: Optional[Path] = workdir_option(),
    checkpoint: Optional[Path] = checkpoint_option(),
    pretrained: Optional[str] = pretrained_option(),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; anything but localhost exposes the page (a warning says so)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port to listen on (default: 7860, or the next free one if it is taken)."),
    max_images: int = typer.Option(64, "--max-images", help="Most images one request may ask for."),
    max_steps: int = typer.Option(1000, "--max-steps", help="Most diffusion steps one request may ask for."),
    share: bool = typer.Option(False, "--share", help="Also open a public gradio.live link (needs internet; anyone with the link can use the page)."),
    compilation_cache: Optional[str] = compilation_cache_option(),
):
    """Serve a local web page to sample, interpolate, reconstruct, edit and inpaint with a checkpoint.

    Prints the address (http://127.0.0.1:7860 unless taken) and opens nothing by itself; Ctrl-C stops it.
    """
    require_positive(max_images=max_images, max_steps=max_steps)
    if port is not None and not 1 <= port <= 65535:
        fail(f"--port must be between 1 and 65535 (got {port})", code=2)
    from ddim.ui import INSTALL_HINT, gradio_available

    if not gradio_available():
        fail(INSTALL_HINT)
    source = checkpoint_source(workdir, checkpoint, pretrained)
    setup_runtime(compilation_cache)
    from ddim.ui.server import serve as run_server
    from ddim.ui.workbench import Limits

    with user_errors():
        run_server(source, host=host, port=port, limits=Limits(max_images, max_steps), share=share,
                   echo=lambda line: typer.echo(line, err=line.startswith("warning:")))
