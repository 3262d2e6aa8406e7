"""``ddim data PATH``: check an image folder (and fill the cache training will use) without training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from ddim.cli.app import (
    app,
    default_workdir,
    fail,
    user_errors,
    with_data,
    workdir_option,
)


def _size_summary(sizes, image_size: int) -> str:
    import numpy as np

    if sizes is None or not len(sizes):
        return "-"
    shorter = sizes.min(axis=1)
    width, height = sizes[:, 0], sizes[:, 1]
    shapes = f"{int((width > height).sum()):,} landscape, {int((width < height).sum()):,} portrait, " \
             f"{int((width == height).sum()):,} square"
    quantiles = np.percentile(shorter, [0, 50, 100]).astype(int)
    upscaled = int((shorter < image_size).sum())
    return (f"shorter side {quantiles[0]} / {quantiles[1]} / {quantiles[2]} px (min / median / max); {shapes}"
            + (f"; {upscaled:,} upscaled to {image_size} px" if upscaled else ""))


def format_summary(data, config, report_path: Path | None) -> list[tuple[str, str]]:
    """The rows ``ddim data`` prints: counts, skipped by reason, classes, sizes, cache, report."""
    import numpy as np

    from ddim.data.decode import REASONS

    rows = [(data.kind, data.name)]
    train, val = len(data.train or ()), len(data.val or ())
    rows.append(("images", f"{data.candidates:,} files: {data.usable:,} usable ({train:,} train / {val:,} val, "
                           f"{data.val_fraction:.0%} by path hash), {len(data.skipped):,} skipped"))
    for reason, count in data.skipped_by_reason().items():
        rows.append(("  skipped", f"{count:,} {REASONS.get(reason, reason)}"))
    if data.ignored:
        listed = ", ".join(f"{ext} {count:,}" for ext, count in data.ignored.items())
        rows.append(("ignored", f"{sum(data.ignored.values()):,} files that are not images by extension ({listed})"))
    if data.class_names:
        labels = np.concatenate([split.labels for split in (data.train, data.val) if split is not None])
        counts = np.bincount(labels[labels >= 0], minlength=len(data.class_names))
        shown = ", ".join(f"{name} ({count:,})" for name, count in list(zip(data.class_names, counts))[:12])
        more = f", ... {len(data.class_names) - 12} more" if len(data.class_names) > 12 else ""
        unlabelled = int((labels < 0).sum())
        rows.append(("classes", f"{len(data.class_names)}: {shown}{more}"
                                + (f"; {unlabelled:,} images directly in the folder have none" if unlabelled else "")))
    else:
        rows.append(("classes", "none (no subfolders): unlabelled images"))
    rows.append(("sizes", _size_summary(data.sizes, config.model.image_size)))
    rows.append(("cache", f"{', '.join(data.cache_dirs)} ({config.model.image_size}x{config.model.image_size}, "
                          f"{(data.usable * config.model.image_size**2 * 3) / 2**20:,.1f} MB)"))
    if report_path is not None:
        rows.append(("report", str(report_path)))
    return rows


@app.command("data")
def data_command(
    path: Path = typer.Argument(..., help="The image folder to check."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="The config `ddim train` will use, a packaged name (`ddim configs`) or a TOML file: its data settings and image size (default: the flowers64 settings)."),
    init: Optional[str] = typer.Option(None, "--init", help="The model `ddim train --init` will fine-tune: its image size."),
    workdir: Optional[Path] = workdir_option("Work directory whose cache to fill (default: the one `ddim train --data PATH` would use)."),
    overrides: List[str] = typer.Option([], "--set", "-s", help="Override a config value: section.key=value (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of the summary."),
):
    """Check an image folder: usable and skipped files (by reason), classes, sizes; fills the data cache.

    Exits with status 1 when training would refuse the folder (no usable image, or more bad files than data.max_bad_fraction).
    """
    from ddim.train.init import load_run_config

    with user_errors():
        cfg = load_run_config(config, with_data(overrides, path), init)
    from ddim import data as data_lib

    workdir = workdir or default_workdir(cfg)
    with user_errors():
        data = data_lib.load(cfg, workdir, log=lambda message: typer.echo(message, err=True), check=False)
    report = data.report()
    report_path = Path(data.cache_dirs[0]) / "report.json" if data.cache_dirs else None
    if report_path is not None:
        try:
            report_path.write_text(json.dumps(report, indent=1) + "\n")
        except OSError:
            report_path = None
    if as_json:
        typer.echo(json.dumps(report, indent=1))
    else:
        rows = format_summary(data, cfg, report_path)
        width = max(len(name) for name, _ in rows)
        for name, value in rows:
            typer.echo(f"{name:<{width}}  {value}")
    problem = data.problem(cfg)
    if problem:
        fail(f"training would refuse this folder: {problem}")
    typer.echo(f"ok: `{train_command(path, config, init, overrides)}` can train on {len(data.train or ()):,} images",
               err=as_json)


def train_command(path: Path, config: Optional[Path], init: Optional[str], overrides: List[str]) -> str:
    """The ``ddim train`` command that trains on ``path`` with the settings ``ddim data`` was given."""
    import shlex

    words = ["ddim", "train", "--data", str(path)]
    words += ["--config", str(config)] if config is not None else []
    words += ["--init", init] if init is not None else []
    for override in overrides:
        words += ["--set", override]
    return shlex.join(words)
