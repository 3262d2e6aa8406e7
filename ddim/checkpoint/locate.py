"""From a path a user gives to an open checkpoint folder, and whether a checkpoint fits a run's model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ddim.checkpoint.checkpointer import Checkpointer
from ddim.checkpoint.errors import CheckpointError
from ddim.checkpoint.verify import is_set_aside
from ddim.config import Config
from ddim.workdir.layout import Workdir


def checkpoint_dir(workdir: str | Path) -> Path:
    """The checkpoints folder of ``workdir`` (kept for callers; it is ``Workdir(workdir).checkpoints``)."""
    return Workdir(workdir).checkpoints


def locate(workdir: str | Path | None = None, checkpoint: str | Path | None = None) -> tuple[Checkpointer, int | None]:
    """Open a checkpoint directory: ``(checkpointer, step)``, ``step`` None unless a step directory is named.

    ``checkpoint`` is a step directory, a work directory or its ``checkpoints``
    folder; without it, ``workdir``. With ``step`` None, use
    :meth:`Checkpointer.restore`, which takes the newest intact checkpoint.
    Raises :class:`CheckpointError` with a one-line reason when there is none.
    """
    if checkpoint is not None:
        path = Path(checkpoint).absolute()
        if not path.exists():
            raise CheckpointError(f"checkpoint not found: {path} does not exist")
        if path.name.isdigit() and path.parent.is_dir() and not Workdir(path).checkpoints.is_dir():
            return Checkpointer(path.parent, create=False), int(path.name)
        if is_set_aside(path):
            raise CheckpointError(f"checkpoint {path} was set aside as damaged (see its DAMAGED.txt)")
        if Workdir(path).checkpoints.is_dir():
            path = Workdir(path).checkpoints
        return _open(path), None
    if workdir is None:
        raise CheckpointError("give a work directory or a checkpoint path")
    return _open(Workdir(workdir).checkpoints), None


def _open(directory: Path) -> Checkpointer:
    if not directory.is_dir():
        raise CheckpointError(f"no checkpoints in {directory} (train first: ddim train --workdir ...)")
    checkpointer = Checkpointer(directory, create=False)
    if checkpointer.latest_step() is None:
        raise CheckpointError(f"no checkpoints in {directory} (train first: ddim train --workdir ...)")
    return checkpointer


def model_config_mismatch(saved: Config, current: Config) -> str | None:
    """Describe the first model-config difference between a checkpoint and a run, or None.

    The compute dtype is not compared: parameters are float32 either way. Nor is the class embedding of two
    unconditional models, which have none (a config may set it for when it trains by class).
    """
    saved_model, current_model = dataclasses.asdict(saved.model), dataclasses.asdict(current.model)
    unconditional = not saved_model.get("class_conditional") and not current_model["class_conditional"]
    for key, value in current_model.items():
        if key == "dtype" or (key == "class_embedding" and unconditional):
            continue
        if saved_model.get(key) != value:
            return f"model.{key} is {value!r} but the checkpoint was trained with {saved_model.get(key)!r}"
    return None
