"""``ddim sample``: a thin wrapper over :meth:`ddim.sampling.Pipeline.generate` and :func:`ddim.save_images`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from ddim.cli.app import (
    app,
    batch_size_option,
    check_sampler_options,
    checkpoint_option,
    checkpoint_source,
    compilation_cache_option,
    eta_option,
    overwrite_option,
    require_positive,
    sampler_tip,
    sampler_option,
    setup_runtime,
    spacing_option,
    user_errors,
    workdir_option,
)


@app.command()
def sample(
    workdir: Optional[Path] = workdir_option(),
    checkpoint: Optional[Path] = checkpoint_option(),
    out: Path = typer.Option(Path("samples"), "--out", "-o", help="Output directory for NNNN.png and grid.png."),
    num: int = typer.Option(16, "--num", "-n", help="Number of images."),
    steps: int = typer.Option(20, "--steps", help="Sampling steps (network calls per image)."),
    seed: int = typer.Option(0, "--seed", help="Random seed (same seed, checkpoint and steps: same pixels)."),
    eta: float = eta_option(),
    sampler: str = sampler_option(),
    spacing: str = spacing_option(),
    batch_size: int = batch_size_option("Images generated at once (bounds memory)."),
    grid: bool = typer.Option(True, "--grid/--no-grid", help="Also write grid.png."),
    trajectory: bool = typer.Option(
        False, "--trajectory", help="Also write trajectory.gif: the predicted images after every step."
    ),
    overwrite: bool = overwrite_option(),
    compilation_cache: Optional[str] = compilation_cache_option(),
):
    """Generate images with the EMA weights of a checkpoint and write them as PNGs.

    For few steps, --sampler dpmpp-2m --spacing logsnr is recommended: at 10 steps it is closer to the
    converged images than the default DDIM at 20 (README: Samplers).
    """
    require_positive(num=num, steps=steps, batch_size=batch_size)
    check_sampler_options(sampler, spacing, eta)
    source = checkpoint_source(workdir, checkpoint)
    from ddim.images import prepare_output_dir

    names = [f"{i:04d}.png" for i in range(num)] + (["grid.png"] if grid else [])
    names += ["trajectory.gif"] if trajectory else []
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
        tip = sampler_tip(steps, sampler, spacing)
        if tip:
            typer.echo(tip, err=True)
        progress = Progress(num, 0, description="sample")
        done = 0

        def on_batch(count: int) -> None:
            nonlocal done
            done += count
            progress.update(done, "")

        try:
            if trajectory:
                frames = pipe.trajectory(
                    num, steps=steps, seed=seed, eta=eta, sampler=sampler, spacing=spacing, batch_size=batch_size,
                    on_batch=on_batch,
                )
                images = frames[-1]
            else:
                images = pipe.generate(
                    num, steps=steps, seed=seed, eta=eta, batch_size=batch_size, on_batch=on_batch,
                    sampler=sampler, spacing=spacing,
                )
        finally:
            progress.close()
        save_images(images, out, grid=grid, overwrite=overwrite)
        if trajectory:
            from ddim.images import make_grid, save_gif

            # Hold the final frame a little longer so the result can be seen.
            grids = [make_grid(frame) for frame in frames] + [make_grid(frames[-1])] * 4
            save_gif(grids, out / "trajectory.gif", duration_ms=250, overwrite=True)
    elapsed = time.perf_counter() - started
    extras = [name for name, wanted in (("grid.png", grid), ("trajectory.gif", trajectory)) if wanted]
    typer.echo(f"wrote {num} images{''.join(' and ' + e for e in extras)} to {out} in {elapsed:.1f}s")
