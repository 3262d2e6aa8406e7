"""``ddim sample``: a thin wrapper over :meth:`ddim.sampling.Pipeline.generate` and :func:`ddim.save_images`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from ddim.cli.app import (
    CACHE_HELP,
    SAMPLER_HELP,
    SPACING_HELP,
    app,
    check_sampler_options,
    checkpoint_source,
    require_positive,
    setup_runtime,
    user_errors,
)


@app.command()
def sample(
    workdir: Optional[Path] = typer.Option(None, "--workdir", "-w", help="Work directory whose latest checkpoint to use."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="A checkpoint step directory (overrides --workdir)."),
    out: Path = typer.Option(Path("samples"), "--out", "-o", help="Output directory for NNNN.png and grid.png."),
    num: int = typer.Option(16, "--num", "-n", help="Number of images."),
    steps: int = typer.Option(20, "--steps", help="Sampling steps (network calls per image)."),
    seed: int = typer.Option(0, "--seed", help="Random seed (same seed, checkpoint and steps: same pixels)."),
    eta: float = typer.Option(0.0, "--eta", help="DDIM eta: 0 deterministic, 1 DDPM-like (DDIM eq. 16)."),
    sampler: str = typer.Option("ddim", "--sampler", help=SAMPLER_HELP),
    spacing: str = typer.Option("uniform", "--spacing", help=SPACING_HELP),
    batch_size: int = typer.Option(64, "--batch-size", "-b", help="Images generated at once (bounds memory)."),
    grid: bool = typer.Option(True, "--grid/--no-grid", help="Also write grid.png."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing files in --out."),
    compilation_cache: Optional[str] = typer.Option(None, "--compilation-cache", help=CACHE_HELP),
):
    """Generate images with the EMA weights of a checkpoint and write them as PNGs."""
    require_positive(num=num, steps=steps, batch_size=batch_size)
    check_sampler_options(sampler, spacing, eta)
    source = checkpoint_source(workdir, checkpoint)
    from ddim.images import prepare_output_dir

    names = [f"{i:04d}.png" for i in range(num)] + (["grid.png"] if grid else [])
    with user_errors():
        prepare_output_dir(out, names, overwrite)
    setup_runtime(compilation_cache)
    from ddim.images import save_images
    from ddim.sampling import load
    from ddim.summary import Progress

    started = time.perf_counter()
    with user_errors():
        pipe = load(source)
        typer.echo(f"checkpoint {pipe.path} (step {pipe.step}, config {pipe.config.name})", err=True)
        progress = Progress(num, 0, description="sample")
        done = 0

        def on_batch(count: int) -> None:
            nonlocal done
            done += count
            progress.update(done, "")

        try:
            images = pipe.generate(
                num, steps=steps, seed=seed, eta=eta, batch_size=batch_size, on_batch=on_batch,
                sampler=sampler, spacing=spacing,
            )
        finally:
            progress.close()
        save_images(images, out, grid=grid, overwrite=overwrite)
    elapsed = time.perf_counter() - started
    typer.echo(f"wrote {num} images{' and grid.png' if grid else ''} to {out} in {elapsed:.1f}s")
