"""The ``ddim`` command line: thin Typer wrappers over importable functions.

Only the standard library and Typer are imported at module level, so
``ddim --help`` is instant; JAX, Flax and TensorFlow load inside commands.
Expected failures (bad config, missing checkpoint, unusable output directory,
...) print one ``error:`` line on stderr and exit with status 1 (2 for bad
arguments), never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="DDIM image generation on JAX: train on Oxford Flowers 102, sample, evaluate.",
)

DEFAULT_RUNS_DIR = Path("runs")


def fail(message: str, code: int = 1):
    """Print one error line and exit (no traceback)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _expected_errors() -> tuple[type[BaseException], ...]:
    from ddim.checkpoint import CheckpointError
    from ddim.config import ConfigError
    from ddim.data import DataError
    from ddim.images import OutputError
    from ddim.parallel import ParallelError

    errors: list[type[BaseException]] = [ConfigError, CheckpointError, DataError, OutputError, ParallelError]
    try:
        from ddim.train import TrainingError

        errors.append(TrainingError)
    except ImportError:  # pragma: no cover
        pass
    from ddim.evaluation import EvaluationError

    errors.append(EvaluationError)
    return tuple(errors)


def _require_positive(**values: int) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1 (got {value})", code=2)


def _setup_runtime(compilation_cache: Optional[str]) -> None:
    """XLA flags and the persistent compilation cache; must run before JAX starts."""
    from ddim import runtime

    runtime.configure_xla_flags()
    runtime.enable_compilation_cache(compilation_cache)


CACHE_HELP = "JAX compilation cache directory ('off' to disable; default ~/.cache/ddim/jax or $DDIM_COMPILATION_CACHE)."


@app.command()
def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML config (default: the flowers64 reference setup)."),
    workdir: Optional[Path] = typer.Option(None, "--workdir", "-w", help="Work directory (default: runs/<config name>)."),
    overrides: List[str] = typer.Option([], "--set", "-s", help="Override a config value: section.key=value (repeatable)."),
    compilation_cache: Optional[str] = typer.Option(None, "--compilation-cache", help=CACHE_HELP),
    coordinator: Optional[str] = typer.Option(
        None, "--coordinator", help="Multi-host: address host:port of process 0 (or set DDIM_DISTRIBUTED=1)."
    ),
    num_processes: Optional[int] = typer.Option(None, "--num-processes", help="Multi-host: number of processes."),
    process_id: Optional[int] = typer.Option(None, "--process-id", help="Multi-host: index of this process."),
):
    """Train (or resume training) a DDIM; Ctrl-C saves a checkpoint, running again resumes."""
    from ddim.config import ConfigError, load_config

    try:
        cfg = load_config(config, overrides)
    except ConfigError as error:
        fail(str(error))
    _setup_runtime(compilation_cache)
    from ddim.parallel import initialize_distributed
    from ddim.train import train as run_training

    workdir = workdir or DEFAULT_RUNS_DIR / cfg.name
    try:
        initialize_distributed(coordinator, num_processes, process_id)
        result = run_training(cfg, workdir)
    except _expected_errors() as error:
        fail(str(error))
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130)
    if result.interrupted:
        raise typer.Exit(130)
    typer.echo(f"trained to step {result.final_step}; checkpoints in {Path(workdir) / 'checkpoints'}")


def _default_checkpoint_source() -> Path:
    """The work directory under runs/ with the most recently written checkpoint."""
    candidates = [p.parent for p in DEFAULT_RUNS_DIR.glob("*/checkpoints") if p.is_dir()]
    if not candidates:
        fail(f"no checkpoints found under {DEFAULT_RUNS_DIR}/ (train first, or pass --workdir or --checkpoint)")
    return max(candidates, key=lambda p: (p / "checkpoints").stat().st_mtime)


@app.command()
def sample(
    workdir: Optional[Path] = typer.Option(None, "--workdir", "-w", help="Work directory whose latest checkpoint to use."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="A checkpoint step directory (overrides --workdir)."),
    out: Path = typer.Option(Path("samples"), "--out", "-o", help="Output directory for NNNN.png and grid.png."),
    num: int = typer.Option(16, "--num", "-n", help="Number of images."),
    steps: int = typer.Option(20, "--steps", help="DDIM steps."),
    seed: int = typer.Option(0, "--seed", help="Random seed (same seed, checkpoint and steps: same pixels)."),
    eta: float = typer.Option(0.0, "--eta", help="DDIM eta: 0 deterministic, 1 DDPM-like (DDIM eq. 16)."),
    batch_size: int = typer.Option(64, "--batch-size", "-b", help="Images generated at once (bounds memory)."),
    grid: bool = typer.Option(True, "--grid/--no-grid", help="Also write grid.png."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing files in --out."),
    compilation_cache: Optional[str] = typer.Option(None, "--compilation-cache", help=CACHE_HELP),
):
    """Generate images with the EMA weights of a checkpoint and write them as PNGs."""
    _require_positive(num=num, steps=steps, batch_size=batch_size)
    if eta < 0:
        fail(f"--eta must be >= 0 (got {eta})", code=2)
    source = checkpoint or workdir or _default_checkpoint_source()
    from ddim.images import prepare_output_dir

    names = [f"{i:04d}.png" for i in range(num)] + (["grid.png"] if grid else [])
    try:
        prepare_output_dir(out, names, overwrite)
    except _expected_errors() as error:
        fail(str(error))
    _setup_runtime(compilation_cache)
    import time

    from ddim.images import save_images
    from ddim.sampling import load
    from ddim.summary import Progress

    started = time.perf_counter()
    try:
        pipe = load(source)
        typer.echo(f"checkpoint {pipe.path} (step {pipe.step}, config {pipe.config.name})", err=True)
        progress = Progress(num, 0, description="sample")
        done = 0

        def on_batch(count: int) -> None:
            nonlocal done
            done += count
            progress.update(done, "")

        try:
            images = pipe.generate(num, steps=steps, seed=seed, eta=eta, batch_size=batch_size, on_batch=on_batch)
        finally:
            progress.close()
        save_images(images, out, grid=grid, overwrite=overwrite)
    except _expected_errors() as error:
        fail(str(error))
    elapsed = time.perf_counter() - started
    typer.echo(f"wrote {num} images{' and grid.png' if grid else ''} to {out} in {elapsed:.1f}s")


@app.command("eval")
def eval_command(
    workdir: Optional[Path] = typer.Option(None, "--workdir", "-w", help="Work directory whose latest checkpoint to score (eval.jsonl and eval_cache/ go there)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="A checkpoint step directory (overrides --workdir)."),
    num: int = typer.Option(5000, "--num", "-n", help="Number of generated images."),
    steps: int = typer.Option(20, "--steps", help="DDIM steps."),
    eta: float = typer.Option(0.0, "--eta", help="DDIM eta: 0 deterministic, 1 DDPM-like (DDIM eq. 16)."),
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
    _require_positive(steps=steps, batch_size=batch_size)
    for name, value in (("num", num), ("real-num", real_num)):
        if value is not None and value < 2:
            fail(f"--{name} must be >= 2 for KID and FID (got {value})", code=2)
    if eta < 0:
        fail(f"--eta must be >= 0 (got {eta})", code=2)
    if split not in ("val", "train"):
        fail(f"--split must be 'val' or 'train' (got {split!r})", code=2)
    source = checkpoint or workdir or _default_checkpoint_source()
    _setup_runtime(compilation_cache)
    from ddim.evaluation import evaluate_checkpoint, format_table

    try:
        result = evaluate_checkpoint(
            source,
            num=num,
            steps=steps,
            eta=eta,
            seed=seed,
            batch_size=batch_size,
            real_num=real_num,
            split=split,
            weights=inception_weights,
        )
    except _expected_errors() as error:
        fail(str(error))
    typer.echo(format_table(result))
    typer.echo(f"appended to {result['eval_file']}")


def main() -> None:  # pragma: no cover - console script entry point
    from ddim import runtime

    runtime.restart_with_fast_allocator()  # before JAX loads; see ddim/runtime.py
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
