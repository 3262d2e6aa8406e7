"""``ddim eval``: a thin wrapper over :func:`ddim.evaluation.evaluate_checkpoint`."""

from __future__ import annotations

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
    fail,
    require_positive,
    setup_runtime,
    user_errors,
)


@app.command("eval")
def eval_command(
    workdir: Optional[Path] = typer.Option(None, "--workdir", "-w", help="Work directory whose latest checkpoint to score (eval.jsonl and eval_cache/ go there)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="A checkpoint step directory (overrides --workdir)."),
    num: int = typer.Option(5000, "--num", "-n", help="Number of generated images."),
    steps: int = typer.Option(20, "--steps", help="Sampling steps (network calls per image)."),
    eta: float = typer.Option(0.0, "--eta", help="DDIM eta: 0 deterministic, 1 DDPM-like (DDIM eq. 16)."),
    sampler: str = typer.Option("ddim", "--sampler", help=SAMPLER_HELP),
    spacing: str = typer.Option("uniform", "--spacing", help=SPACING_HELP),
    seed: int = typer.Option(0, "--seed", help="Random seed of the generated images and of the KID subsets."),
    batch_size: int = typer.Option(64, "--batch-size", "-b", help="Images generated (and featurised) at once; bounds memory."),
    real_num: Optional[int] = typer.Option(None, "--real-num", help="Use at most this many real images (a fixed random subset; default: the whole split)."),
    split: str = typer.Option("val", "--split", help="Real images: 'val' (data.val_split, default) or 'train' (data.train_split)."),
    inception_weights: Optional[Path] = typer.Option(
        None,
        "--inception-weights",
        help="Keras' InceptionV3 'notop' .h5 weights file (default: $DDIM_INCEPTION_WEIGHTS, then "
        "~/.keras/models/, then a Keras download).",
    ),
    compilation_cache: Optional[str] = typer.Option(None, "--compilation-cache", help=CACHE_HELP),
):
    """Score a checkpoint's samples: KID (InceptionV3 at 75px) and FID (299px) against real images.

    Prints a table and appends one JSON line to <workdir>/eval.jsonl.
    """
    require_positive(steps=steps, batch_size=batch_size)
    for name, value in (("num", num), ("real-num", real_num)):
        if value is not None and value < 2:
            fail(f"--{name} must be >= 2 for KID and FID (got {value})", code=2)
    check_sampler_options(sampler, spacing, eta)
    if split not in ("val", "train"):
        fail(f"--split must be 'val' or 'train' (got {split!r})", code=2)
    source = checkpoint_source(workdir, checkpoint)
    setup_runtime(compilation_cache)
    from ddim.evaluation import evaluate_checkpoint, format_table

    with user_errors():
        result = evaluate_checkpoint(
            source,
            num=num,
            steps=steps,
            eta=eta,
            sampler=sampler,
            spacing=spacing,
            seed=seed,
            batch_size=batch_size,
            real_num=real_num,
            split=split,
            weights=inception_weights,
        )
    typer.echo(format_table(result))
    typer.echo(f"appended to {result['eval_file']}")
