"""``ddim sample``: a thin wrapper over :func:`ddim.sampling.outputs.sample_to_folder`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from ddim.cli.app import (
    MODEL_OWN,
    SAMPLING_GUIDE,
    app,
    batch_size_option,
    checkpoint_option,
    checkpoint_source,
    class_option,
    compilation_cache_option,
    describe_classes,
    describe_source,
    clip_option,
    eta_option,
    guidance_option,
    guidance_tip,
    overwrite_option,
    pretrained_option,
    progress_bar,
    require_positive,
    sampler_tip,
    sampler_option,
    model_spec,
    sampling_changes,
    setup_runtime,
    spacing_option,
    steps_option,
    user_errors,
    workdir_option,
)


SAMPLE_HELP = f"""Generate images with the EMA weights of a checkpoint and write them as PNGs.

A class-conditional model takes --class and --guidance; classes.json then says which class each image is.
{MODEL_OWN} Which sampler and how many steps: {SAMPLING_GUIDE}
"""


@app.command(help=SAMPLE_HELP)
def sample(
    workdir: Optional[Path] = workdir_option(),
    checkpoint: Optional[Path] = checkpoint_option(),
    pretrained: Optional[str] = pretrained_option(),
    out: Path = typer.Option(Path("samples"), "--out", "-o", help="Output folder."),
    num: int = typer.Option(16, "--num", "-n", help="Number of images."),
    steps: Optional[int] = steps_option(),
    seed: int = typer.Option(0, "--seed", help="Random seed; same seed, same pixels."),
    eta: Optional[float] = eta_option(),
    clip: bool = clip_option(),
    sampler: Optional[str] = sampler_option(),
    spacing: Optional[str] = spacing_option(),
    classes: List[str] = class_option(),
    guidance: Optional[float] = guidance_option(),
    list_classes: bool = typer.Option(False, "--list-classes", help="Print the model's classes and exit."),
    batch_size: int = batch_size_option(),
    no_grid: bool = typer.Option(False, "--no-grid", help="Leave out grid.png."),
    _grid: bool = typer.Option(False, "--grid", hidden=True, help="The default: write grid.png."),
    trajectory: bool = typer.Option(False, "--trajectory", help="Also write trajectory.gif (each step's prediction)."),
    overwrite: bool = overwrite_option(),
    compilation_cache: Optional[str] = compilation_cache_option(),
):
    """Generate images with the EMA weights of a checkpoint and write them as PNGs (``SAMPLE_HELP``)."""
    grid = not no_grid
    require_positive(num=num, steps=steps, batch_size=batch_size)
    changes = sampling_changes(steps, sampler, spacing, eta, guidance, clip)
    source = checkpoint_source(workdir, checkpoint, pretrained)
    from ddim.sampling.outputs import check_sample_folder

    if not list_classes:
        with user_errors():
            check_sample_folder(out, num, grid, trajectory, overwrite)
    setup_runtime(compilation_cache)
    from ddim.sampling import load
    from ddim.sampling.outputs import sample_to_folder

    started = time.perf_counter()
    with user_errors():
        pipe = load(source)
        typer.echo(describe_source(pipe), err=True)
        if list_classes:
            typer.echo(describe_classes(pipe))
            return
        spec = model_spec(pipe, changes)
        ids = pipe.class_ids(classes or None, num, seed) if pipe.classes or classes else None
        tips = [] if pipe.rules.distilled else [sampler_tip(spec.steps, spec.sampler, spec.spacing,
                                                            pipe.config.model.image_size)]
        for tip in tips + [guidance_tip(pipe.pretrained, bool(pipe.classes), guidance)]:
            if tip:
                typer.echo(tip, err=True)
        with progress_bar(num, "sample") as on_batch:
            extras = sample_to_folder(pipe, out, num, spec, seed=seed, batch_size=batch_size, grid=grid,
                                      trajectory=trajectory, overwrite=overwrite, on_batch=on_batch, classes=ids)
    elapsed = time.perf_counter() - started
    typer.echo(f"wrote {num} images{''.join(' and ' + e for e in extras)} to {out} in {elapsed:.1f}s")

