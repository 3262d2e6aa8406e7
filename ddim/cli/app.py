"""The Typer application and what its commands share: one-line errors, common options, runtime setup.

Only the standard library, Typer and :mod:`ddim.spec` are imported here, so
``ddim --help`` is instant; JAX, Flax and TensorFlow load inside commands.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from pathlib import Path
from typing import Iterator, Optional

import typer
from typer.core import TyperGroup

from ddim.spec import (DEFAULT_STEPS, FEW_STEPS, FEW_STEPS_BEST, SAMPLERS, SPACINGS, SamplingSpec,
                       SpecError)


# Click's base exception, from wherever this Typer takes Click (a copy of its own in recent versions).
ClickException = next(cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "ClickException")


def usage_error_line(error: Exception) -> str:
    """A Click error (unknown option, missing or bad value, unknown command) as one ``error:`` line, with the
    command's ``--help`` as a hint where Click knows the command."""
    message = " ".join(error.format_message().split()).rstrip(".")
    if message[:1].isupper() and message[1:2].islower():  # Click's sentences ("No such option: --x") in our case
        message = message[0].lower() + message[1:]
    ctx = getattr(error, "ctx", None)
    if ctx is not None and ctx.command.get_help_option(ctx) is not None:
        message += f" ({ctx.command_path} {ctx.help_option_names[0]})"
    return f"error: {message}"


class OneLineErrorGroup(TyperGroup):
    """The ``ddim`` group: Click's usage errors print one ``error:`` line (status 2, 1 for other Click errors)
    instead of Typer's boxed panels; help (``--help``, or no arguments) prints as Typer formats it."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:  # a caller that handles Click's exceptions itself
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except ClickException as error:
            if type(error).__name__ != "NoArgsIsHelpError":  # (whose help is printed already)
                typer.echo(usage_error_line(error), err=True)
            sys.exit(error.exit_code)
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)  # a typer.Exit's status, else success


app = typer.Typer(
    cls=OneLineErrorGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="DDIM image generation on JAX: train on Oxford Flowers 102 or your own images, sample, evaluate.",
)

DEFAULT_RUNS_DIR = Path("runs")

CACHE_HELP = "JAX compilation cache folder or 'off' (default: $DDIM_COMPILATION_CACHE or ~/.cache/ddim/jax)."


@app.callback()
def main_options(
    debug: bool = typer.Option(
        False, "--debug", help="Show tracebacks (and library error logs) with errors; same as DDIM_DEBUG=1."
    ),
):
    """DDIM image generation on JAX: train on Oxford Flowers 102 or your own images, sample, evaluate."""
    if debug:
        from ddim.errors import DEBUG_ENV

        os.environ[DEBUG_ENV] = "1"


def fail(message: str, code: int = 1):
    """Print one error line and exit (no traceback)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn errors a user can act on into one ``error:`` line and exit status 1.

    Those are :class:`ddim.errors.UserError` (bad input, and faults that a layer
    below explained), and ``OSError`` from the environment (a full disk, a
    missing permission) that reached the command unexplained. Anything else is
    a bug and keeps its traceback; ``--debug``/``DDIM_DEBUG=1`` shows the
    traceback of every error.
    """
    from ddim.errors import UserError, debug, environment_error

    try:
        yield
    except UserError as error:
        if debug():
            traceback.print_exc()
        fail(getattr(error, "cli_message", None) or str(error))  # a SpecError names the command's option
    except OSError as error:
        phrase = environment_error(error)
        if phrase is None or debug():
            raise
        fail(phrase)


def require_positive(**values: Optional[int]) -> None:
    """Exit with status 2 and one line naming the first option whose value is below 1."""
    for name, value in values.items():
        if value is not None and value < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1 (got {value})", code=2)


# The registry of names is ddim.spec's (JAX-free, so `ddim --help` stays instant).
SAMPLER_NAMES = tuple(SAMPLERS)
SPACING_NAMES = tuple(SPACINGS)
# Short enough for a help column of about 40 characters at 80 columns (the options table leaves no more): what
# each name means, which to use and why are in docs/sampling.md, which a command's description links whole.
SAMPLING_GUIDE = "docs/sampling.md#which-sampler-how-many-steps"
SAMPLER_HELP = f"Solver: {', '.join(SAMPLER_NAMES[:-1])} or {SAMPLER_NAMES[-1]} (docs/sampling.md)."
TIP_BELOW_STEPS = 50  # where the grids were compared; with many steps every grid converges
SPACING_HELP = f"Time grid: {', '.join(SPACING_NAMES[:-1])} or {SPACING_NAMES[-1]}."


def sampler_tip(steps: int, sampler: str, spacing: str, image_size: int) -> str | None:
    """One sentence when few steps are asked of a sampler and grid that did worse there than dpmpp-2m on the
    log-SNR grid (the best FID at 5 and 10 steps on flowers32-noise; docs/sampling.md), else None. Only for a model
    of the image size it was measured at (:func:`ddim.pretrained.registry.few_steps_measured`): at another size the
    comparison was never made. From 20 steps on the choice is within 1 FID on the bundled models: no tip."""
    from ddim.pretrained.registry import few_steps_measured

    if steps > FEW_STEPS or (sampler, spacing) == FEW_STEPS_BEST or not few_steps_measured(image_size):
        return None
    return (f"tip: at {FEW_STEPS} steps or fewer, --sampler {FEW_STEPS_BEST[0]} --spacing {FEW_STEPS_BEST[1]} "
            "gives better images (docs/sampling.md)")


def guidance_tip(pretrained: str | None, class_conditional: bool, guidance: Optional[float]) -> str | None:
    """One sentence when a bundled class-conditional model is asked for another guidance scale than its best
    measured one (its record's default scale, :func:`ddim.pretrained.registry.best_guidance`), else None."""
    from ddim.pretrained.registry import best_guidance

    best = best_guidance(pretrained) if class_conditional and guidance is not None else None
    if best is None or guidance == best:
        return None
    return f"tip: {pretrained} scored its best FID at --guidance {best:g}, its default (docs/models.md)"


def sampling_spec(steps: int = DEFAULT_STEPS, sampler: str = "ddim", spacing: str = "uniform", eta: float = 0.0,
                  guidance: Optional[float] = None) -> SamplingSpec:
    """The command's :class:`SamplingSpec`; a bad value exits with status 2 and one line naming its option."""
    try:
        return SamplingSpec(steps=steps, sampler=sampler, spacing=spacing, eta=eta, guidance=guidance)
    except SpecError as error:
        fail(error.cli_message, code=2)


def sampling_changes(steps: Optional[int] = None, sampler: Optional[str] = None, spacing: Optional[str] = None,
                     eta: Optional[float] = None, guidance: Optional[float] = None, clip: bool = False) -> dict:
    """The sampling options given on the command line (the rest come from the model: :func:`model_spec`), each
    checked on its own first: a bad value exits with status 2 and one line naming its option."""
    changes = {name: value for name, value in (("steps", steps), ("sampler", sampler), ("spacing", spacing),
                                               ("eta", eta), ("guidance", guidance), ("clip", clip or None))
               if value is not None}
    try:
        SamplingSpec(**changes)
    except SpecError as error:
        fail(error.cli_message, code=2)
    return changes


def model_spec(pipe, changes: dict) -> SamplingSpec:
    """The model's default spec (``pipe.defaults``) with the options given changed, checked against what the model
    takes (a distilled student its own step count); raises :class:`SpecError` (one line, naming the option)."""
    return pipe.rules.resolve(None, **changes)


@contextlib.contextmanager
def progress_bar(total: int, description: str) -> Iterator:
    """A progress bar on stderr for ``total`` items; yields ``on_batch(n)``, to call after each ``n`` done."""
    from ddim.summary import Progress

    progress, done = Progress(total, 0, description=description), 0

    def on_batch(count: int) -> None:
        nonlocal done
        done += count
        progress.update(done, "")

    try:
        yield on_batch
    finally:
        progress.close()


def setup_runtime(compilation_cache: Optional[str]) -> None:
    """The persistent compilation cache and the native code (oneDNN's convolutions, built before the first
    trace; a note line for what runs slower without a compiler); must run before JAX compiles anything.

    (The XLA flags were set when ``ddim`` was imported.)
    """
    from ddim import compilation, onednn

    compilation.enable_compilation_cache(compilation_cache)
    onednn.prepare_native_code()


DATA_HELP = "Folder of your own training images (a shortcut for --set data.image_dir=PATH)."


# The options several commands share, defined once (each call gives a command its own option object).
def workdir_option(help: str = "A run's work directory: its latest checkpoint."):
    return typer.Option(None, "--workdir", "-w", help=help)


def checkpoint_option():
    return typer.Option(None, "--checkpoint", help="A checkpoint step directory (overrides --workdir).")


def pretrained_option():
    return typer.Option(None, "--pretrained", help="A bundled model by name (`ddim pretrained` lists them).")


PLAIN = SamplingSpec()  # what a model with no measured best setting samples with
MODEL_DEFAULT = "Default: the model's own, else {}."
MODEL_OWN = ("Sampling options left out take the model's own setting: a bundled model's best measured one "
             f"(`ddim pretrained`), a distilled student's own steps and sampler; else {PLAIN.steps} {PLAIN.sampler} "
             f"steps on the {PLAIN.spacing} grid, no guidance.")
"""What :data:`MODEL_DEFAULT` means, said once in the description of a command that samples."""


STUDENT_STEPS = "a distilled student: its own step count, its only one"


def steps_option(help: str = "Sampling steps (one network pass each, two with guidance unless distilled).",
                 default: str = MODEL_DEFAULT.format(PLAIN.steps)):
    return typer.Option(None, "--steps", help=f"{help} {default}")


def sampler_option():
    return typer.Option(None, "--sampler", help=f"{SAMPLER_HELP} " + MODEL_DEFAULT.format(PLAIN.sampler))


def spacing_option():
    return typer.Option(None, "--spacing", help=f"{SPACING_HELP} " + MODEL_DEFAULT.format(PLAIN.spacing))


def clip_option():
    return typer.Option(False, "--clip", help="Clip each step's image prediction to the pixel range "
                        "(DDPM's clip_denoised).")


def eta_option():
    return typer.Option(None, "--eta", help="DDIM eta: 0 deterministic (the default), 1 DDPM-like.")


CLASS_HELP = "Class name or id; repeated: one per image (default: drawn as in the data)."


def class_option(help: str = CLASS_HELP):
    return typer.Option([], "--class", metavar="NAME", help=help)


GUIDANCE_HELP = "Guidance: 1 none, 0 unconditional, above 1 more like the class."


def guidance_option(default: str = MODEL_DEFAULT.format("1")):
    return typer.Option(None, "--guidance", help=f"{GUIDANCE_HELP} {default}")


def describe_classes(pipe) -> str:
    """``ddim sample --list-classes``: a header line naming the columns, then one line per class (id, training
    images where the checkpoint has the counts, name); or why there are none."""
    if not pipe.classes:
        return "this checkpoint is not class-conditional (trained without model.class_conditional)"
    counts = pipe.class_space.counts
    if not counts:
        return "\n".join([f"{'id':>4}  name", *(f"{i:4d}  {name}" for i, name in enumerate(pipe.classes))])
    header = "training images"
    return "\n".join([f"{'id':>4}  {header}  name", *(f"{i:4d}  {count:>{len(header)}}  {name}"
                                                        for i, (name, count) in enumerate(zip(pipe.classes, counts)))])


def batch_size_option(help: str = "Images at once (bounds memory)."):
    return typer.Option(64, "--batch-size", "-b", help=help)


def overwrite_option(help: str = "Replace existing files in --out."):
    return typer.Option(False, "--overwrite", help=help)


def compilation_cache_option():
    return typer.Option(None, "--compilation-cache", help=CACHE_HELP)


def with_data(overrides: list[str], data: Optional[Path]) -> list[str]:
    """``--data PATH`` as the override ``data.image_dir=PATH`` (quoted as a TOML string)."""
    if data is None:
        return list(overrides)
    import json

    return [*overrides, f"data.image_dir={json.dumps(str(data))}"]


def default_workdir(config) -> Path:
    """``runs/<config name>``, or ``runs/<config name>-<folder name>`` when training on an image folder
    (two folders trained with one config do not share a work directory)."""
    if config.data.image_dir:
        folder = Path(config.data.image_dir).expanduser().absolute().name or "images"
        return DEFAULT_RUNS_DIR / f"{config.name}-{folder}"
    return DEFAULT_RUNS_DIR / config.name


def default_checkpoint_source() -> Path | str:
    """The work directory under runs/ with the most recently written checkpoint; with none, the default
    bundled model (``"pretrained:NAME"``, said in one stderr line)."""
    from ddim.workdir.layout import CHECKPOINTS, Workdir

    candidates = [p.parent for p in DEFAULT_RUNS_DIR.glob(f"*/{CHECKPOINTS}") if p.is_dir()]
    if candidates:
        return max(candidates, key=lambda p: Workdir(p).checkpoints.stat().st_mtime)
    from ddim.pretrained.registry import default_choice, source_of

    with user_errors():
        choice = default_choice()
    if choice is None:
        fail(f"no checkpoints found under {DEFAULT_RUNS_DIR}/ (train first, or pass --workdir or --checkpoint)")
    typer.echo(f"no checkpoints under {DEFAULT_RUNS_DIR}/: using the bundled model {choice.manifest.name} "
               f"({choice.reason}; --pretrained, --workdir or --checkpoint picks another)", err=True)
    return source_of(choice.manifest.name)


def checkpoint_source(workdir: Optional[Path], checkpoint: Optional[Path],
                      pretrained: Optional[str] = None) -> Path | str:
    """What ``--checkpoint``/``--workdir`` name, or ``--pretrained`` (``"pretrained:NAME"``, checked to exist),
    else the newest run under runs/ (else the default bundled model)."""
    if pretrained is not None:
        if workdir is not None or checkpoint is not None:
            fail("--pretrained names a bundled model: leave out --workdir and --checkpoint", code=2)
        from ddim.pretrained.registry import find, source_of

        with user_errors():
            return source_of(find(pretrained).name)
    return checkpoint or workdir or default_checkpoint_source()


def pretrained_workdir(source: Path | str) -> Optional[Path]:
    """Where ``ddim eval`` of a bundled model writes: ``runs/pretrained-NAME``, never into the package.
    None for a run (its own work directory)."""
    from ddim.pretrained.registry import pretrained_name

    name = pretrained_name(source)
    return DEFAULT_RUNS_DIR / f"pretrained-{name}" if name is not None else None


def describe_source(pipe) -> str:
    """The stderr line that says which weights a command uses."""
    if getattr(pipe, "pretrained", None):
        return f"bundled model {pipe.pretrained} (step {pipe.step}, config {pipe.config.name}; {pipe.path})"
    return f"checkpoint {pipe.path} (step {pipe.step}, config {pipe.config.name})"
