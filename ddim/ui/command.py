"""The ``ddim`` command that does what a page did, printed under its result (it reproduces the pixels)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Collection

from ddim.spec import SamplingSpec


def cli_command(checkpoint: Path | None, verb: str, *arguments: str, spec: SamplingSpec | None = None,
                spec_fields: Collection[str] = (), pretrained: str | None = None, **options) -> str:
    """``ddim <verb> <arguments> --checkpoint ... --<option> <value> ...`` then the spec's ``spec_fields``.

    A bundled model is named as ``--pretrained NAME`` instead of its checkpoint's
    path, which lies inside the installed package and differs between machines.
    Uploads are named as the user named them. Only the spec fields the page set
    are written (the interpolate and reconstruct commands take no ``--sampler``).
    An option whose value is a list is repeated (``--class a --class b``); one
    that is None is left out.
    """
    source = ["--pretrained", pretrained] if pretrained else ["--checkpoint", str(checkpoint)]
    parts = ["ddim", verb, *arguments, *source]
    for name, value in options.items():
        for item in value if isinstance(value, (list, tuple)) else [] if value is None else [value]:
            parts += [f"--{name.replace('_', '-')}", str(item)]
    if spec is not None:
        parts += spec_options(spec, spec_fields)
    return shlex.join(parts)


def spec_options(spec: SamplingSpec, fields: Collection[str]) -> list[str]:
    """``spec``'s command-line options for ``fields``, defaults included (a field that is None is left out)."""
    options = spec.cli_options(skip_defaults=False)
    pairs = zip(options[::2], options[1::2])
    return [part for option, value in pairs if option.removeprefix("--") in fields for part in (option, value)]


def class_argument(classes, class_id: int) -> str:
    """What ``--class`` says for class ``class_id`` of ``classes`` (a :class:`~ddim.sampling.classes.ClassSpace`).

    Its name, unless the command line would read that name as another class (the
    command line folds case, so of two names equal but for case it reads the last): then its id.
    """
    name = classes.names[class_id]
    try:
        return name if classes.class_id(name) == class_id else str(class_id)
    except ValueError:
        return str(class_id)
