"""The EMA weights that sampling uses, read from a checkpoint without the training code.

:func:`load_ema` is everything between a path and a sampling pipeline: locate
the checkpoint, restore its config and state (skipping damaged checkpoints),
take the EMA variables and check them against the model the config describes.

Checking the weights' shapes takes a trace of the whole network. Sampling traces
it anyway, and Flax's ``apply`` checks every weight it reads against the shape
its initialiser gives (``ScopeParamShapeError``; ``ScopeParamNotFoundError`` for
a missing one), so a pipeline loads with ``check=False`` and turns those errors
into the same :class:`CheckpointError` when its first program is traced
(:func:`weights_fit`): one trace instead of two.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, NamedTuple

from ddim.checkpoint.checkpointer import Checkpointer
from ddim.checkpoint.errors import CheckpointError
from ddim.checkpoint.locate import locate
from ddim.config import Config


class LoadedCheckpoint(NamedTuple):
    """What sampling needs of a checkpoint: its config, EMA variables, step and step directory, and for a bundled
    model the sampling defaults its record names (a :class:`ddim.spec.SamplingSpec`; None: the plain ones)."""

    config: Config
    variables: dict[str, Any]
    step: int
    path: Path
    defaults: Any = None


def ema_variables(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The variables sampling uses, taken from a restored state dict: the EMA weights and their
    BatchNorm statistics. Raises ``KeyError`` when the state has none."""
    return {"params": state_dict["ema_params"], "batch_stats": state_dict["ema_batch_stats"]}


def load_ema(path: str | Path, step: int | None = None, warn: Callable[[str], None] | None = None,
             check: bool = True) -> LoadedCheckpoint:
    """The config and EMA variables of a work directory, its ``checkpoints`` folder or a step directory.

    Without a step (none given, no step directory named) the newest intact
    checkpoint is used: a damaged newer one is skipped with a one-line warning
    through ``warn`` (default: stderr) and set aside when no training run owns
    the directory. Raises :class:`CheckpointError`, also for a damaged named
    step and, with ``check``, for weights that do not fit the stored config
    (without it, the caller's first trace checks them: :func:`weights_fit`).
    """
    import jax  # here, not at the top: `import ddim.checkpoint` stays free of JAX
    import jax.numpy as jnp

    checkpointer, named = locate(checkpoint=path)
    config, state, step = _restore_newest(checkpointer, step if step is not None else named, warn)
    where = checkpointer.directory / str(step)
    try:
        variables = jax.tree.map(jnp.asarray, ema_variables(state))
    except (KeyError, TypeError) as error:
        raise CheckpointError(f"checkpoint {where} has no EMA weights ({error})") from None
    if check:
        check_fits_config(config, variables, where)
    return LoadedCheckpoint(config, variables, step, where)


def _restore_newest(
    checkpointer: Checkpointer, step: int | None, warn: Callable[[str], None] | None
) -> tuple[Config, dict[str, Any], int]:
    """Config, state dict and step of ``step`` (or of the newest intact checkpoint); closes ``checkpointer``."""
    try:
        found = checkpointer.restore(
            lambda s: (checkpointer.restore_config(s), checkpointer.restore_state(s)), step=step, warn=warn
        )
    finally:
        checkpointer.close()
    if found is None:
        raise CheckpointError(f"no checkpoints in {checkpointer.directory} (train first: ddim train --workdir ...)")
    step, (config, state) = found
    return config, state, step


def check_fits_config(config: Config, variables: dict[str, Any], where: Path) -> None:
    """The weights must fit the model their stored config describes (shapes and structure); else
    :class:`CheckpointError` naming ``where``."""
    import jax

    from ddim.model import DiffusionModel, init_variables  # Flax: loaded only when weights are checked

    model = DiffusionModel(config.model)
    expected = jax.eval_shape(lambda: init_variables(model, jax.random.key(0)))
    if jax.tree.map(lambda x: x.shape, variables) != jax.tree.map(lambda x: x.shape, expected):
        raise _does_not_fit(config, where)


def _does_not_fit(config: Config, where: Path | None) -> CheckpointError:
    return CheckpointError(f"checkpoint {where} does not match its config "
                           f"({config.name}: widths {config.model.widths}, image size {config.model.image_size})")


@contextlib.contextmanager
def weights_fit(config: Config, where: Path | None):
    """Run code that traces the network with weights loaded without ``check``: Flax's errors for a weight of
    another shape, or one missing, become the :class:`CheckpointError` of :func:`check_fits_config`."""
    from flax import errors

    try:
        yield
    except (errors.ScopeParamShapeError, errors.ScopeParamNotFoundError, errors.ScopeCollectionNotFound):
        raise _does_not_fit(config, where) from None
