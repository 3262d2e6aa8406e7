"""Which models are bundled: the directories beside this module that hold a ``model.json``.

``ddim.load("pretrained:NAME")`` and ``--pretrained NAME`` name one; the default
(:mod:`ddim.pretrained.default`: the fastest good model of the largest size, by the records' figures) is what
``ddim sample`` falls back to when there is no run under ``runs/``.
``$DDIM_PRETRAINED_DIR`` replaces the package's own directory (models kept
elsewhere; the tests). JAX-free: the CLI lists models without loading any.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ddim.pretrained.bundle import MANIFEST, Manifest, read_manifest
from ddim.pretrained.bundle_record import BundleRecord
from ddim.pretrained.default import DefaultChoice, choose_default
from ddim.pretrained.errors import PretrainedError

PREFIX = "pretrained:"
ENV = "DDIM_PRETRAINED_DIR"
PACKAGE_ROOT = Path(__file__).parent
"""Where the package's own bundled models lie (``ddim/pretrained/<name>/``)."""
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
"""A model's name: it is a directory and follows ``pretrained:``."""


def bundled_root() -> Path:
    """The directory of bundled models: ``$DDIM_PRETRAINED_DIR``, else the package's own."""
    override = os.environ.get(ENV, "").strip()
    return Path(override).expanduser() if override else PACKAGE_ROOT


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise PretrainedError(f"{name!r} is not a model name (lower-case letters, digits, '-', '_' and '.', "
                              "starting with a letter or digit)")
    return name


def available(root: str | os.PathLike | None = None) -> list[Manifest]:
    """The bundled models in ``root`` (default :func:`bundled_root`): the default first, then by name."""
    root = Path(root) if root is not None else bundled_root()
    try:
        directories = sorted(p for p in root.iterdir() if p.is_dir() and (p / MANIFEST).is_file())
    except FileNotFoundError:
        return []
    models = [read_manifest(directory) for directory in directories if NAME.fullmatch(directory.name)]
    choice = choose_default(models)
    return sorted(models, key=lambda model: model is not choice.manifest) if choice else models  # stable


def find(name: str, root: str | os.PathLike | None = None) -> Manifest:
    """The bundled model ``name``; an unknown name is one line listing the models there are."""
    root = Path(root) if root is not None else bundled_root()
    check_name(name)
    if not (root / name / MANIFEST).is_file():
        names = [manifest.name for manifest in available(root)]
        there = f"available: {', '.join(names)}" if names else "none is bundled with this installation"
        raise PretrainedError(f"no bundled model named {name!r} ({there})")
    return read_manifest(root / name)


def default_model(root: str | os.PathLike | None = None) -> Manifest | None:
    """The model used when none is named (:func:`ddim.pretrained.default.choose_default`), or None when none is
    bundled."""
    choice = default_choice(root)
    return choice.manifest if choice else None


def default_choice(root: str | os.PathLike | None = None) -> DefaultChoice | None:
    """The model used when none is named and why, or None when none is bundled."""
    return choose_default(available(root))


def best_guidance(name: str | None) -> float | None:
    """The best measured guidance scale of the bundled model ``name``: its record's default scale (a
    class-conditional model whose record names defaults), else None (a run of your own; a model nobody measured)."""
    if name is None or not NAME.fullmatch(name) or not (bundled_root() / name / MANIFEST).is_file():
        return None
    manifest = find(name)
    return BundleRecord.from_dict(manifest.record).best_guidance(manifest.config.model.class_conditional)


def few_steps_measured(image_size: int) -> bool:
    """Whether the few-step comparison of samplers behind ``ddim sample``'s tip (:data:`ddim.spec.FEW_STEPS_BEST`)
    was measured at ``image_size``: on a record of the package's own models (:data:`ddim.spec.FEW_STEPS_MEASURED_ON`)
    of that size, so the tip reaches the model measured, and models of its size, and no other."""
    from ddim.spec import FEW_STEPS_MEASURED_ON

    return any(find(name, PACKAGE_ROOT).config.model.image_size == image_size for name in FEW_STEPS_MEASURED_ON
               if (PACKAGE_ROOT / name / MANIFEST).is_file())


def __getattr__(attribute: str):
    """``BEST_GUIDANCE``: the bundled models' best measured guidance scales by name, read from their records (the
    one place they are kept)."""
    if attribute == "BEST_GUIDANCE":
        return {manifest.name: scale for manifest in available()
                if (scale := best_guidance(manifest.name)) is not None}
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def pretrained_name(source: Any) -> str | None:
    """``NAME`` when ``source`` is the string ``"pretrained:NAME"``, else None (a path)."""
    if isinstance(source, str) and source.startswith(PREFIX):
        return source[len(PREFIX):]
    return None


def source_of(name: str) -> str:
    """The source string of a bundled model, as :func:`ddim.load` takes it."""
    return PREFIX + name


def load_pretrained(name: str, root: str | os.PathLike | None = None, check: bool = True):
    """The config and variables of the bundled model ``name``, checked, as a
    :class:`ddim.checkpoint.LoadedCheckpoint` (its step is the training step, its path the bundle).

    Raises :class:`PretrainedError` for an unknown name or weights that do not
    match their SHA-256, and, with ``check``, :class:`ddim.checkpoint.CheckpointError`
    for weights that do not fit the config (without it the caller's first trace
    checks them: :func:`ddim.checkpoint.ema.weights_fit`).
    """
    import jax

    from ddim.checkpoint.ema import LoadedCheckpoint, check_fits_config
    from ddim.pretrained.bundle import read_variables

    manifest = find(name, root)
    # One transfer of the whole tree: jnp.asarray per leaf compiles a small program for each of its shapes.
    variables = jax.device_put(read_variables(manifest))
    if check:
        check_fits_config(manifest.config, variables, manifest.directory)
    record = BundleRecord.from_dict(manifest.record)
    return LoadedCheckpoint(manifest.config, variables, record.steps, manifest.directory,
                            record.sampling_spec(manifest.name))


def load_source(source: str | os.PathLike, step: int | None = None, warn=None, check: bool = True):
    """The config and EMA variables of ``source``: ``"pretrained:NAME"`` (a bundled model, :func:`load_pretrained`)
    or a work directory, its ``checkpoints`` folder or a step directory (:func:`ddim.checkpoint.load_ema`), as a
    :class:`ddim.checkpoint.LoadedCheckpoint`. What ``ddim.load`` and ``ddim train --init`` read. ``check``: the
    weights' shapes are checked against the config here (without it, by the caller's first trace)."""
    from ddim.checkpoint.ema import load_ema
    from ddim.errors import InputError

    name = pretrained_name(source)
    if name is None:
        return load_ema(source, step, warn, check)
    if step is not None:
        raise InputError(f"a bundled model has one step; leave out step (got {step}) with {source!r}")
    return load_pretrained(name, check=check)
