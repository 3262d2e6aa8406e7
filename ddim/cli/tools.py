"""DDIM's own tools on the command line: ``ddim invert/reconstruct/interpolate/edit/inpaint``.

Thin wrappers over the verbs of :class:`ddim.sampling.Pipeline`. Each checks
its arguments and input files before loading the model, never overwrites a
file without ``--overwrite``, and turns bad input into one ``error:`` line.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from pathlib import Path
from typing import Iterator, List, Optional

import typer

from ddim.cli.app import (
    DEFAULT_STEPS,
    app,
    batch_size_option,
    checkpoint_option,
    checkpoint_source,
    class_option,
    compilation_cache_option,
    describe_source,
    eta_option,
    fail,
    guidance_option,
    overwrite_option,
    PLAIN,
    STUDENT_STEPS,
    pretrained_option,
    require_positive,
    SPACING_HELP,
    sampler_option,
    sampling_changes,
    sampling_spec,
    setup_runtime,
    spacing_option,
    steps_option,
    user_errors,
    workdir_option,
)

STEPS_HELP = "Sampling steps; inversion and generation share the time grid."
PLAIN_DDIM = " (Interpolation inverts and decodes with plain deterministic DDIM, not a model's sampling defaults.)"
INVERSION_CLASS_HELP = ("Class-conditional checkpoints: the class to invert with (and to decode with), a name or id "
                        "for every image, or repeated, one per image (default: the null class, no class).")
INTERPOLATION_CLASS_HELP = ("Class-conditional checkpoints: the class of the whole path, or give it twice, a start "
                            "and an end class, to move from one to the other (default: the null class, no class). "
                            "An image end is inverted with its end's class.")


def _check_inputs(paths: List[Path], what: str = "image") -> None:
    """One ``error:`` line for the first input that is missing or not a file (before the model loads)."""
    for path in paths:
        if not path.exists():
            fail(f"{what} {path} does not exist")
        if not path.is_file():
            fail(f"{what} {path} is not a file")


def _output_names(paths: List[Path]) -> List[str]:
    """``<stem>.png`` per input; two inputs with the same stem would overwrite each other."""
    names = [f"{path.stem}.png" for path in paths]
    seen = {}
    for path, name in zip(paths, names):
        if name in seen:
            fail(f"{seen[name]} and {path} would both be written as {name}; rename one of them")
        seen[name] = path
    return names


@contextlib.contextmanager
def _notices() -> Iterator[None]:
    """Show the pipeline's warnings (e.g. an image resized to the model's size) as ``note:`` lines."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            yield
        finally:
            for warning in caught:
                if issubclass(warning.category, UserWarning):
                    typer.echo(f"note: {warning.message}", err=True)


def _load(workdir: Optional[Path], checkpoint: Optional[Path], pretrained: Optional[str],
          compilation_cache: Optional[str]):
    source = checkpoint_source(workdir, checkpoint, pretrained)
    setup_runtime(compilation_cache)
    from ddim.sampling import load

    pipe = load(source)
    typer.echo(describe_source(pipe), err=True)
    return pipe


def _read(pipe, paths: List[Path]):
    from ddim.images import read_image

    return [read_image(path, pipe.config.model.channels) for path in paths]


def _check_out_file(out: Path, overwrite: bool) -> None:
    from ddim.images import OutputError

    if out.is_dir():
        raise OutputError(f"--out {out} is a directory; give a file name such as latents.npz")
    if out.exists() and not overwrite:
        raise OutputError(f"{out} already exists; use --overwrite or another --out")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"cannot create directory {out.parent}: {error.strerror or error}") from None
    if not os.access(out.parent, os.W_OK):
        raise OutputError(f"directory {out.parent} is not writable")


@app.command()
def invert(
    images: List[Path] = typer.Argument(..., help="Image files to encode."),
    out: Path = typer.Option(Path("latents.npz"), "--out", "-o", help="Output .npz file (latents, files, steps, spacing)."),
    workdir: Optional[Path] = workdir_option(),
    checkpoint: Optional[Path] = checkpoint_option(),
    pretrained: Optional[str] = pretrained_option(),
    steps: int = typer.Option(DEFAULT_STEPS, "--steps", help=STEPS_HELP),
    spacing: str = typer.Option("uniform", "--spacing", help=SPACING_HELP),
    classes: List[str] = class_option(INVERSION_CLASS_HELP),
    batch_size: int = batch_size_option(),
    overwrite: bool = overwrite_option("Replace an existing --out file."),
    compilation_cache: Optional[str] = compilation_cache_option(),
):
    """Encode images to the latents DDIM regenerates them from (deterministic DDIM inversion, DDIM eq. 13).

    `ddim sample`-style generation from these latents with the same --steps, --spacing and class reconstructs
    the images; `ddim interpolate --from IMAGE` and the Python API use them. A class-conditional checkpoint
    also stores each image's class id in the .npz (`classes`, -1 for the null class).
    """
    require_positive(steps=steps, batch_size=batch_size)
    spec = sampling_spec(steps, spacing=spacing)
    _check_inputs(images)
    with user_errors():
        _check_out_file(out, overwrite)
        pipe = _load(workdir, checkpoint, pretrained, compilation_cache)
        import numpy as np

        ids = pipe.class_ids(classes, len(images)) if classes else None
        with _notices():
            latents = pipe.invert(_read(pipe, images), batch_size=batch_size, spec=spec, classes=ids)
        extra = {"classes": np.full(len(images), -1, np.int32) if ids is None else ids} if pipe.classes else {}
        tmp = out.with_name(f".{out.name}.tmp.npz")
        np.savez(
            tmp, latents=latents, files=np.array([str(p) for p in images]), steps=steps, spacing=spacing,
            checkpoint=str(pipe.path), step=pipe.step if pipe.step is not None else -1, **extra,
        )
        os.replace(tmp, out)
    typer.echo(f"wrote {len(images)} latents ({steps} steps, {spacing} spacing) to {out}")


@app.command()
def reconstruct(
    images: List[Path] = typer.Argument(..., help="Image files to encode and decode."),
    out: Path = typer.Option(Path("reconstructions"), "--out", "-o", help="Output directory (<name>.png, comparison.png)."),
    workdir: Optional[Path] = workdir_option(),
    checkpoint: Optional[Path] = checkpoint_option(),
    pretrained: Optional[str] = pretrained_option(),
    steps: int = typer.Option(DEFAULT_STEPS, "--steps", help=STEPS_HELP),
    spacing: str = typer.Option("uniform", "--spacing", help=SPACING_HELP),
    classes: List[str] = class_option(INVERSION_CLASS_HELP),
    batch_size: int = batch_size_option(),
    overwrite: bool = overwrite_option(),
    compilation_cache: Optional[str] = compilation_cache_option(),
):
    """Invert images and generate them back; prints each image's error and the mean.

    The error is the mean squared error per pixel and channel on [0, 1] values (the DDIM paper's Table 2
    measure). comparison.png shows the inputs (top row) over their reconstructions.
    """
    require_positive(steps=steps, batch_size=batch_size)
    spec = sampling_spec(steps, spacing=spacing)
    _check_inputs(images)
    names = _output_names(images)
    from ddim.images import prepare_output_dir

    with user_errors():
        prepare_output_dir(out, names + ["comparison.png"], overwrite)
        pipe = _load(workdir, checkpoint, pretrained, compilation_cache)
        import numpy as np

        from ddim.images import make_grid, save_png

        with _notices():
            result = pipe.reconstruct(_read(pipe, images), batch_size=batch_size, spec=spec, classes=classes or None)
        for image, name in zip(result.images, names):
            save_png(image, out / name)
        save_png(make_grid(np.concatenate([result.inputs, result.images]), rows=2), out / "comparison.png")
    for path, error in zip(images, result.errors):
        typer.echo(f"{path}: mean squared error {error:.5f}")
    typer.echo(f"mean squared error {result.errors.mean():.5f} over {len(images)} image(s), {steps} steps; wrote {out}")


def _endpoint(value: str, option: str) -> tuple[Optional[int], Optional[Path]]:
    """``--from``/``--to``: a seed (an integer) or an image file."""
    try:
        return int(value), None
    except ValueError:
        pass
    path = Path(value)
    if not path.is_file():
        fail(f"{option} {value!r} is neither a seed (an integer) nor an image file", code=2)
    return None, path


@app.command()
def interpolate(
    start: str = typer.Option(..., "--from", help="A seed (integer) or an image file (it is inverted)."),
    end: str = typer.Option(..., "--to", help="A seed (integer) or an image file (it is inverted)."),
    frames: int = typer.Option(16, "--frames", help="Frames, both ends included (>= 2)."),
    out: Path = typer.Option(Path("interpolation"), "--out", "-o", help="Output directory (NNNN.png, interpolation.gif)."),
    workdir: Optional[Path] = workdir_option(),
    checkpoint: Optional[Path] = checkpoint_option(),
    pretrained: Optional[str] = pretrained_option(),
    steps: Optional[int] = steps_option(STEPS_HELP, f"Default: {PLAIN.steps} ({STUDENT_STEPS}).{PLAIN_DDIM}"),
    spacing: str = typer.Option(PLAIN.spacing, "--spacing", help=SPACING_HELP),
    classes: List[str] = class_option(INTERPOLATION_CLASS_HELP),
    guidance: Optional[float] = guidance_option(f"Default: 1.{PLAIN_DDIM}"),
    batch_size: int = batch_size_option(),
    duration: int = typer.Option(120, "--frame-ms", help="Milliseconds per GIF frame."),
    overwrite: bool = overwrite_option(),
    compilation_cache: Optional[str] = compilation_cache_option(),
):
    """Morph between two seeds or images: spherical interpolation of their latents, decoded with DDIM.

    A class-conditional checkpoint takes --class once (the class of every frame) or twice (a start and an end
    class: the frames move from one to the other; --from and --to may then be the same seed), and --guidance.
    """
    require_positive(steps=steps, batch_size=batch_size, frame_ms=duration)
    if frames < 2:
        fail(f"--frames must be >= 2 (got {frames})", code=2)
    if len(classes) > 2:
        fail(f"--class: give one class for the whole path, or two (a start and an end class), not {len(classes)}",
             code=2)
    changes = sampling_changes(steps, spacing=spacing, guidance=guidance)
    ends = [_endpoint(start, "--from"), _endpoint(end, "--to")]
    from ddim.images import prepare_output_dir

    names = [f"{i:04d}.png" for i in range(frames)]
    with user_errors():
        prepare_output_dir(out, names + ["interpolation.gif"], overwrite)
        pipe = _load(workdir, checkpoint, pretrained, compilation_cache)
        from ddim.images import save_gif, save_png
        from ddim.sampling.pipeline import inversion_spec

        spec = inversion_spec(None, rules=pipe.rules, **changes)

        # Checked before any inversion; an image end is inverted with the class its frame is decoded with.
        end_classes = pipe.class_space.ends(classes or None, spec) or (None, None)
        latents = []
        with _notices():
            for (seed, path), end_class in zip(ends, end_classes):
                if seed is not None:
                    latents.append(pipe.latents(1, seed=seed)[0])
                else:
                    latents.append(pipe.invert(_read(pipe, [path]), spec=spec, classes=end_class)[0])
            images = pipe.interpolate(latents[0], latents[1], frames=frames, batch_size=batch_size, spec=spec,
                                      classes=end_classes if classes else None)
        for image, name in zip(images, names):
            save_png(image, out / name)
        save_gif(images, out / "interpolation.gif", duration_ms=duration, overwrite=True)
    typer.echo(f"wrote {frames} frames and interpolation.gif to {out}")


def _sampling_options(steps: Optional[int], batch_size: int, sampler: Optional[str], spacing: Optional[str],
                      eta: Optional[float], guidance=None) -> dict:
    require_positive(steps=steps, batch_size=batch_size)
    return sampling_changes(steps, sampler, spacing, eta, guidance)


@app.command()
def edit(
    images: List[Path] = typer.Argument(..., help="Image files to edit."),
    strength: float = typer.Option(0.6, "--strength", help="How far to noise the input, in (0, 1]: ~0.3 keeps the "
                                   "composition, ~0.7 only colours and layout, 1 ignores it."),
    out: Path = typer.Option(Path("edits"), "--out", "-o", help="Output directory (<name>.png)."),
    workdir: Optional[Path] = workdir_option(),
    checkpoint: Optional[Path] = checkpoint_option(),
    pretrained: Optional[str] = pretrained_option(),
    steps: Optional[int] = steps_option("Network calls from --strength down to a clean image."),
    seed: int = typer.Option(0, "--seed", help="Random seed of the added noise."),
    sampler: Optional[str] = sampler_option(),
    spacing: Optional[str] = spacing_option(),
    eta: Optional[float] = eta_option(),
    classes: List[str] = class_option(),
    guidance: Optional[float] = guidance_option(),
    batch_size: int = batch_size_option(),
    overwrite: bool = overwrite_option(),
    compilation_cache: Optional[str] = compilation_cache_option(),
):
    """Image-to-image (SDEdit): noise each image to --strength and denoise it into the model's world."""
    changes = _sampling_options(steps, batch_size, sampler, spacing, eta, guidance)
    if not 0.0 < strength <= 1.0:
        fail(f"--strength must be in (0, 1] (got {strength})", code=2)
    _check_inputs(images)
    names = _output_names(images)
    from ddim.images import prepare_output_dir

    with user_errors():
        prepare_output_dir(out, names, overwrite)
        pipe = _load(workdir, checkpoint, pretrained, compilation_cache)
        from ddim.images import save_png

        started = time.perf_counter()
        with _notices():
            edited = pipe.edit(_read(pipe, images), strength=strength, seed=seed, batch_size=batch_size,
                               classes=classes or None, **changes)
        for image, name in zip(edited, names):
            save_png(image, out / name)
    typer.echo(f"wrote {len(images)} edited image(s) to {out} in {time.perf_counter() - started:.1f}s")


@app.command()
def inpaint(
    images: List[Path] = typer.Argument(..., help="Image files to complete."),
    mask: Path = typer.Option(..., "--mask", "-m", help="Mask image of the same size: white = the region to fill."),
    out: Path = typer.Option(Path("inpainted"), "--out", "-o", help="Output directory (<name>.png)."),
    workdir: Optional[Path] = workdir_option(),
    checkpoint: Optional[Path] = checkpoint_option(),
    pretrained: Optional[str] = pretrained_option(),
    steps: Optional[int] = steps_option(),
    seed: int = typer.Option(0, "--seed", help="Random seed of the filled region."),
    sampler: Optional[str] = sampler_option(),
    spacing: Optional[str] = spacing_option(),
    eta: Optional[float] = eta_option(),
    classes: List[str] = class_option(),
    guidance: Optional[float] = guidance_option(),
    batch_size: int = batch_size_option(),
    overwrite: bool = overwrite_option(),
    compilation_cache: Optional[str] = compilation_cache_option(),
):
    """Fill the white region of --mask in each image consistently with the rest (the rest is kept)."""
    changes = _sampling_options(steps, batch_size, sampler, spacing, eta, guidance)
    _check_inputs(images)
    _check_inputs([mask], "mask")
    names = _output_names(images)
    from ddim.images import prepare_output_dir, read_mask

    with user_errors():
        mask_pixels = read_mask(mask)
        prepare_output_dir(out, names, overwrite)
        pipe = _load(workdir, checkpoint, pretrained, compilation_cache)
        from ddim.images import save_png

        with _notices():
            filled = pipe.inpaint(_read(pipe, images), mask_pixels, seed=seed, batch_size=batch_size,
                                  classes=classes or None, **changes)
        for image, name in zip(filled, names):
            save_png(image, out / name)
    typer.echo(f"wrote {len(images)} inpainted image(s) to {out}")
