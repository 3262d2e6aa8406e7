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
from ddim.config.distill import DistillConfig


@app.command()
def distill(
    workdir: Optional[Path] = typer.Option(None, "--workdir", "-w", help="The teacher's work directory (its newest "
                                           "intact checkpoint)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="The teacher as a checkpoint step "
                                              "directory (overrides --workdir)."),
    pretrained: Optional[str] = typer.Option(None, "--pretrained", help="The teacher as a model bundled with ddim, "
                                             "by name (`ddim pretrained` lists them)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="The students' work directory (default: "
                                       "runs/<teacher>-distilled, or runs/<teacher>-consistency); the same command "
                                       "resumes it."),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="A packaged config's name (`ddim configs`) or "
                                         "a TOML file with a \\[distill] section (default: the documented defaults)."),
    method: Optional[str] = typer.Option(None, "--method", "-m", help="progressive: halving rounds, one student per "
                                         "step count; consistency: one student that samples in 1, 2 or 4 steps. "
                                         "Default: --config's distill.method, else "
                                         f"{DistillConfig.method}."),
    data: Optional[Path] = typer.Option(None, "--data", "-d", help=DATA_HELP + " Default: the teacher's data."),
    overrides: List[str] = typer.Option([], "--set", "-s", help="Override a value: distill.key=value, or any "
                                        "section of the teacher's config (repeatable)."),
    compilation_cache: Optional[str] = compilation_cache_option(),
):
    """Distil a diffusion model into students of 1 to N steps: progressive distillation (Salimans & Ho 2022), the
    guidance scale folded into the student first for a class-conditional teacher (Meng et al. 2023), or
    consistency distillation (Song et al. 2023) into one student, the guidance scale an input of both.

    Every halving round writes its student to <out>/students/<steps>/, consistency distillation its one student to
    <out>/students/consistency/: work directories that ddim sample, eval and serve take. Ctrl-C saves a
    checkpoint; running the same command again resumes.
    """
    given = [name for name, value in (("--workdir", workdir), ("--checkpoint", checkpoint),
                                      ("--pretrained", pretrained)) if value is not None]
    if not given or "--pretrained" in given and len(given) > 1:
        fail("name one teacher: --workdir, --checkpoint or --pretrained", code=2)
    from ddim.config import ConfigError, named
    from ddim.config.distill import METHODS

    if method is not None and method not in METHODS:
        fail(f"--method must be one of {', '.join(METHODS)} (got {method!r})", code=2)

    with user_errors():
        if pretrained is not None:
            from ddim.pretrained.registry import find, source_of

            teacher = source_of(find(pretrained).name)
        else:
            teacher = checkpoint or workdir
        # A missing or broken file fails before the teacher loads.
        given = named.read(config)[0].get("distill") if config is not None else None
        given = given if isinstance(given, dict) else {}
        if out is None:
            from ddim.workdir import Workdir

            suffix = "consistency" if (method or given.get("method")) == "consistency" else "distilled"
            out = DEFAULT_RUNS_DIR / f"{pretrained or Workdir.of_checkpoint(teacher).root.name}-{suffix}"
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out} is a file, not a directory")
    setup_runtime(compilation_cache)
    from ddim.distill import distill as run_distillation

    try:
        with user_errors():
            changes = [*overrides, f'distill.method="{method}"'] if method is not None else overrides
            result = run_distillation(teacher, out, config, with_data(changes, data))
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130)
    if result.interrupted:
        raise typer.Exit(130)
    students = ", ".join(f"{steps} step{'s' if steps > 1 else ''}: {path}"
                         for steps, path in sorted(result.students.items(), reverse=True))
    typer.echo(f"distilled to step {result.final_step}; students ({students})")
