"""``ddim train``: a thin wrapper over :func:`ddim.train.train`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from ddim.cli.app import (
    DATA_HELP,
    app,
    compilation_cache_option,
    default_workdir,
    setup_runtime,
    user_errors,
    with_data,
    workdir_option,
)


@app.command()
def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="A packaged config's name (`ddim configs` lists them) or a TOML file (default: flowers64, the reference setup; with --init, the fine-tune settings for the source's size)."),
    workdir: Optional[Path] = workdir_option("Work directory (default: runs/<config name>, with an image folder runs/<config name>-<folder name>)."),
    data: Optional[Path] = typer.Option(None, "--data", "-d", help=DATA_HELP),
    overrides: List[str] = typer.Option([], "--set", "-s", help="Override a config value: section.key=value (repeatable)."),
    init: Optional[str] = typer.Option(
        None, "--init", help="Fine-tune: start from a trained model (pretrained:NAME, a run directory or a checkpoint "
        "step directory) instead of random weights; its network and loss come from it (docs/finetuning.md)."),
    compilation_cache: Optional[str] = compilation_cache_option(),
    coordinator: Optional[str] = typer.Option(
        None, "--coordinator", help="Multi-host: address host:port of process 0 (or set DDIM_DISTRIBUTED=1)."
    ),
    num_processes: Optional[int] = typer.Option(None, "--num-processes", help="Multi-host: number of processes."),
    process_id: Optional[int] = typer.Option(None, "--process-id", help="Multi-host: index of this process."),
):
    """Train (or resume training) a DDIM, from random weights or a trained model (--init); Ctrl-C saves a
    checkpoint, running the same command again resumes."""
    from ddim.train.init import load_run_config
    from ddim.workdir import check_free

    with user_errors():
        cfg = load_run_config(config, with_data(overrides, data), init)
        workdir = workdir or default_workdir(cfg)
        single = coordinator is None and process_id is None and not os.environ.get("DDIM_DISTRIBUTED")
        if single:  # the processes of a multi-host run share one lock, taken later by process 0
            check_free(workdir)  # before the slow start-up: a second trainer stops at once
    setup_runtime(compilation_cache)
    from ddim.parallel import initialize_distributed
    from ddim.train import train as run_training

    try:
        with user_errors():
            initialize_distributed(coordinator, num_processes, process_id)
            result = run_training(cfg, workdir)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130)
    if result.interrupted:
        raise typer.Exit(130)
    typer.echo(f"trained to step {result.final_step}; checkpoints in {Path(workdir) / 'checkpoints'}")
