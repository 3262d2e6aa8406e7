"""Orbax checkpoints that carry their own config, so a checkpoint alone rebuilds the model.

Layout: ``<workdir>/checkpoints/<step>/{state,config}``; ``state`` is the train
state as a plain nested dict (params, optimiser state, batch statistics, EMA
weights, step) and ``config`` the resolved :class:`ddim.config.Config` as JSON.
Orbax writes each step to a temporary directory and renames it when complete,
so an interrupted save never damages an earlier checkpoint.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ddim.errors import UserError
from ddim.config import Config, ConfigError, from_dict

CHECKPOINT_DIR = "checkpoints"


class CheckpointError(UserError, RuntimeError):
    """No usable checkpoint where one was expected (the message says where and why)."""


def _ocp():
    import orbax.checkpoint as ocp

    return ocp


def _first_line(error: BaseException) -> str:
    """Library errors can span many lines; the CLI promises one."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def checkpoint_dir(workdir: str | Path) -> Path:
    return Path(workdir).absolute() / CHECKPOINT_DIR


class Checkpointer:
    """Save and restore train states (and their config) under ``<workdir>/checkpoints``.

    Retention is orbax's: the ``keep`` most recent steps, or, with
    ``best_metric``, the ``keep`` steps whose saved metric of that name is best
    (lowest with ``best_mode="min"``); see :meth:`save`'s ``metrics``.
    """

    def __init__(
        self,
        directory: str | Path,
        keep: int = 3,
        create: bool = True,
        best_metric: str | None = None,
        best_mode: str = "min",
    ):
        ocp = _ocp()
        self.directory = Path(directory).absolute()
        self.best_metric = best_metric
        best = {}
        if best_metric is not None:
            best = dict(
                best_fn=lambda metrics: float(metrics[best_metric]),
                best_mode=best_mode,
                keep_checkpoints_without_metrics=False,
            )
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=create, **best)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "config"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def best_step(self) -> int | None:
        """The step with the best metric (with ``best_metric``), else the latest step."""
        return self.manager.best_step()

    def metrics(self, step: int) -> dict[str, float] | None:
        """The metrics saved with ``step`` (None when it has none)."""
        return self.manager.metrics(step)

    def save(self, step: int, state_dict: dict[str, Any], config: Config, metrics: dict[str, float] | None = None) -> None:
        """Save asynchronously; call :meth:`wait` (or :meth:`close`) before relying on it.

        ``metrics`` are stored with the step; with ``best_metric`` they decide retention.
        """
        ocp = _ocp()
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state_dict), config=ocp.args.JsonSave(config.to_dict())
            ),
            metrics=metrics,
            force=True,
        )

    def restore_state(self, step: int, target: dict[str, Any] | None = None) -> dict[str, Any]:
        """The saved state dict; with ``target`` (abstract arrays) restored to its shapes and shardings."""
        ocp = _ocp()
        args = ocp.args.StandardRestore(target) if target is not None else ocp.args.StandardRestore()
        try:
            return self.manager.restore(step, args=ocp.args.Composite(state=args)).state
        except Exception as error:  # orbax/tensorstore raise many types for damaged files
            raise CheckpointError(f"cannot restore checkpoint {self.directory / str(step)}: {_first_line(error)}") from None

    def restore_config(self, step: int) -> Config:
        ocp = _ocp()
        try:
            values = self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config
        except Exception as error:  # a missing or damaged JSON item
            raise CheckpointError(f"checkpoint {self.directory / str(step)} has no readable config: {_first_line(error)}") from None
        try:
            return from_dict(values)
        except ConfigError as error:
            raise CheckpointError(f"checkpoint {self.directory / str(step)} has an invalid config: {_first_line(error)}") from None

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def locate(workdir: str | Path | None = None, checkpoint: str | Path | None = None) -> tuple[Checkpointer, int]:
    """Find a checkpoint: a step directory (``checkpoint``), or the latest one of a work directory.

    ``checkpoint`` may also be a work directory or its ``checkpoints`` folder.
    Raises :class:`CheckpointError` with a one-line reason when there is none.
    """
    if checkpoint is not None:
        path = Path(checkpoint).absolute()
        if not path.exists():
            raise CheckpointError(f"checkpoint not found: {path} does not exist")
        if path.name.isdigit() and (path / "state").exists():
            return Checkpointer(path.parent, create=False), int(path.name)
        if (path / CHECKPOINT_DIR).is_dir():
            path = path / CHECKPOINT_DIR
        return _latest(path)
    if workdir is None:
        raise CheckpointError("give a work directory or a checkpoint path")
    return _latest(checkpoint_dir(workdir))


def _latest(directory: Path) -> tuple[Checkpointer, int]:
    if not directory.is_dir():
        raise CheckpointError(f"no checkpoints in {directory} (train first: ddim train --workdir ...)")
    checkpointer = Checkpointer(directory, create=False)
    step = checkpointer.latest_step()
    if step is None:
        raise CheckpointError(f"no checkpoints in {directory} (train first: ddim train --workdir ...)")
    return checkpointer, step


def model_config_mismatch(saved: Config, current: Config) -> str | None:
    """Describe the first model-config difference between a checkpoint and a run, or None.

    The compute dtype is not compared: parameters are float32 either way.
    """
    saved_model, current_model = dataclasses.asdict(saved.model), dataclasses.asdict(current.model)
    for key, value in current_model.items():
        if key == "dtype":
            continue
        if saved_model.get(key) != value:
            return f"model.{key} is {value!r} but the checkpoint was trained with {saved_model.get(key)!r}"
    return None
