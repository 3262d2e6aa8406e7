"""``ddim env``: a thin wrapper over :func:`ddim.environment.report`."""

from __future__ import annotations

import typer

from ddim.cli.app import app

ENV_HELP = """What a bug report needs: versions, the CPU, JAX's devices, the native code in use, the caches.

The versions of ddim, Python and its libraries; the CPU and its cores; JAX's backend and devices.
Whether oneDNN's convolutions and the allocator layer run, and why not; the caches' locations and sizes.
The DDIM_*, TFDS_DATA_DIR and XLA_FLAGS variables set. See docs/troubleshooting.md#what-to-put-in-a-bug-report.
"""


@app.command("env", help=ENV_HELP)
def env(as_json: bool = typer.Option(False, "--json", help="One JSON object instead of the text.")):
    """What a bug report needs (``ENV_HELP``)."""
    import json

    from ddim import environment

    values = environment.report()
    typer.echo(json.dumps(values, indent=1) if as_json else environment.format_report(values))
