"""``ddim distill``: a thin wrapper over :func:`ddim.distill.distill`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ddim.cli.app import (
    DATA_HELP,
    DEFAULT_RUNS_DIR,
    app,
    compilation_cache_option,
    fail,
    setup_runtime,
    user_errors,
    with_data,
)


@app.command()
def distill(
    workdir: Optional[Path] = typer.Option(None, "--workdir", "-w", help="The teacher's work directory (its newest "
                                           "intact checkpoint)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="The teacher as a checkpoint step "
                                              "directory (overrides --workdir)."),
    pretrained: Optional[str] = typer.Option(None, "--pretrained", help="The teacher as a model bundled with ddim, "
                                             "by name (`ddim pretrained` lists them)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="The students' work directory (default: "
                                       "runs/<teacher>-distilled); the same command resumes it."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="A TOML file with a \\[distill] section "
                                          "(e.g. configs/distill32.toml; default: the documented defaults)."),
    data: Optional[Path] = typer.Option(None, "--data", "-d", help=DATA_HELP + " Default: the teacher's data."),
    overrides: List[str] = typer.Option([], "--set", "-s", help="Override a value: distill.key=value, or any "
                                        "section of the teacher's config (repeatable)."),
    compilation_cache: Optional[str] = compilation_cache_option(),
):
    """Distil a diffusion model into students of 1 to N steps: progressive distillation (Salimans & Ho 2022), the
    guidance scale folded into the student first for a class-conditional teacher (Meng et al. 2023).

    Every halving round writes its student to <out>/students/<steps>/, a work directory that ddim sample, eval and
    serve take. Ctrl-C saves a checkpoint; running the same command again resumes.
    """
    given = [name for name, value in (("--workdir", workdir), ("--checkpoint", checkpoint),
                                      ("--pretrained", pretrained)) if value is not None]
    if not given or "--pretrained" in given and len(given) > 1:
        fail("name one teacher: --workdir, --checkpoint or --pretrained", code=2)
    from ddim.config import ConfigError, read_toml

    with user_errors():
        if pretrained is not None:
            from ddim.pretrained.registry import find, source_of

            teacher = source_of(find(pretrained).name)
        else:
            teacher = checkpoint or workdir
        if config is not None:
            read_toml(config)  # a missing or broken file fails before the teacher loads
        if out is None:
            from ddim.workdir import Workdir

            out = DEFAULT_RUNS_DIR / f"{pretrained or Workdir.of_checkpoint(teacher).root.name}-distilled"
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out} is a file, not a directory")
    setup_runtime(compilation_cache)
    from ddim.distill import distill as run_distillation

    try:
        with user_errors():
            result = run_distillation(teacher, out, config, with_data(overrides, data))
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130)
    if result.interrupted:
        raise typer.Exit(130)
    students = ", ".join(f"{steps} step{'s' if steps > 1 else ''}: {path}"
                         for steps, path in sorted(result.students.items(), reverse=True))
    typer.echo(f"distilled to step {result.final_step}; students ({students})")
