"""``ddim pretrained``: list the models bundled with ddim (the default), or ``export`` a checkpoint as one.

Thin wrappers over :mod:`ddim.pretrained` (JAX loads only to export).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ddim.cli.app import app, user_errors

pretrained_app = typer.Typer(
    no_args_is_help=False,
    help="Models bundled with ddim: list them (the default) or export a checkpoint as one.",
)
app.add_typer(pretrained_app, name="pretrained")


def details_option():
    return typer.Option(False, "--details", help="Each model's facts instead of the table: how it was trained, "
                        "its default setting and every figure measured of it, with the command behind each.")


def markdown_option():
    return typer.Option(False, "--markdown", help="The details as Markdown too (the table is Markdown already): "
                        "what the user guide's 'Bundled models' page shows (docs/models.md#the-models).")


@pretrained_app.callback(invoke_without_command=True)
def pretrained(ctx: typer.Context, details: bool = details_option(), as_markdown: bool = markdown_option()):
    """Models bundled with ddim: list them (the default), or export a checkpoint as one.

    Use one with --pretrained NAME (sample, eval, serve, the tools) or ddim.load("pretrained:NAME").
    """
    if ctx.invoked_subcommand is None:
        list_models(as_json=False, details=details, as_markdown=as_markdown)


@pretrained_app.command("list")
def list_models(as_json: bool = typer.Option(False, "--json", help="One JSON object per model: name, "
                                             "directory, sha256, bytes, parameters, record."),
                details: bool = details_option(), as_markdown: bool = markdown_option()):
    """List the bundled models: a row each, at its default setting (the first is the default model).

    The row has the model's FID, class accuracy, speed and size; --details has how each was trained and every
    figure measured of it.
    """
    from ddim.pretrained import available, bundled_root, describe
    from ddim.pretrained.render import details_markdown, models_table

    with user_errors():
        models = available()
    if as_json:
        for model in models:
            typer.echo(json.dumps({"name": model.name, "directory": str(model.directory), "sha256": model.sha256,
                                   "bytes": model.bytes, "parameters": model.parameters, "record": model.record}))
        return
    if not models:
        typer.echo(f"no bundled models in {bundled_root()} (export one: ddim pretrained export --checkpoint RUN "
                   "--name NAME)")
        return
    if not details:
        typer.echo(models_table(models), nl=False)
    elif as_markdown:
        typer.echo(details_markdown(models), nl=False)
    else:
        for number, model in enumerate(models):
            lines = describe(model)
            if number == 0:
                lines[0] += " (default)"
            typer.echo("\n".join(lines))


@pretrained_app.command("export")
def export(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="A work directory (its newest intact checkpoint) "
                                    "or a checkpoint step directory."),
    name: str = typer.Option(..., "--name", help="The model's name: its directory and pretrained:NAME."),
    fid: Optional[float] = typer.Option(None, "--fid", help="The FID measured of this checkpoint (needs "
                                        "--fid-protocol); default: read from the work directory's eval.jsonl."),
    fid_protocol: Optional[str] = typer.Option(None, "--fid-protocol", help="How --fid was measured (samples, "
                                               "steps, sampler, real images, network)."),
    eval_file: Optional[Path] = typer.Option(None, "--eval-file", help="The eval.jsonl to take the FID from "
                                             "(default: the work directory's)."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="What it was trained on, e.g. '1x NVIDIA "
                                           "H100' (recorded as given; not recorded otherwise)."),
    recipe: Optional[str] = typer.Option(None, "--recipe", help="How it was trained, e.g. the train command "
                                         "line (recorded as given)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory of bundled models to write NAME/ into "
                                       "(default: the package's ddim/pretrained/, or $DDIM_PRETRAINED_DIR)."),
    real_data: Optional[Path] = typer.Option(None, "--real-data", help="A config whose data section the bundle keeps "
                                             "instead of the checkpoint's: what ddim eval scores it against (for a "
                                             "model trained on a copy of a dataset, the dataset itself; classes "
                                             "are matched by name)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing bundle of that name."),
    weights_dtype: str = typer.Option("float32", "--weights-dtype", help="How the weights are stored: 'float32' "
                                      "(exact) or 'float16' (half the bytes, read back as float32; check that "
                                      "the FID is unchanged)."),
):
    """Bundle a checkpoint's EMA weights, config and training record as a model shipped with ddim."""
    from ddim.config import load_config
    from ddim.pretrained import describe, export_checkpoint

    with user_errors():
        data = load_config(real_data).data if real_data is not None else None
        manifest = export_checkpoint(
            checkpoint, name, root=out, fid=fid, fid_protocol=fid_protocol, eval_file=eval_file,
            hardware=hardware, recipe=recipe, real_data=data, overwrite=overwrite,
            warn=lambda line: typer.echo(line, err=True), weights_dtype=weights_dtype,
        )
    if manifest.record.get("fid") is None:
        typer.echo(f"warning: no FID recorded: none measured at step {manifest.record['steps']} (run ddim eval on "
                   "the checkpoint first, or pass --fid with --fid-protocol)", err=True)
    typer.echo("\n".join(describe(manifest)))
    typer.echo(f"wrote {manifest.directory}")
