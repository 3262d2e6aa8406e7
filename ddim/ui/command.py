"""The ``ddim`` command that does what a page did, printed under its result (it reproduces the pixels)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Collection

from ddim.spec import SamplingSpec


def cli_command(checkpoint: Path | None, verb: str, *arguments: str, spec: SamplingSpec | None = None,
                spec_fields: Collection[str] = (), **options) -> str:
    """``ddim <verb> <arguments> --checkpoint ... --<option> <value> ...`` then the spec's ``spec_fields``.

    Uploads are named as the user named them. Only the spec fields the page set
    are written (the interpolate and reconstruct commands take no ``--sampler``).
    """
    parts = ["ddim", verb, *arguments, "--checkpoint", str(checkpoint)]
    for name, value in options.items():
        parts += [f"--{name.replace('_', '-')}", str(value)]
    if spec is not None:
        parts += spec_options(spec, spec_fields)
    return shlex.join(parts)


def spec_options(spec: SamplingSpec, fields: Collection[str]) -> list[str]:
    """``spec``'s command-line options for ``fields``, defaults included (a field that is None is left out)."""
    options = spec.cli_options(skip_defaults=False)
    pairs = zip(options[::2], options[1::2])
    return [part for option, value in pairs if option.removeprefix("--") in fields for part in (option, value)]
