"""Orbax checkpoints that carry their own config, so a checkpoint alone rebuilds the model.

Layout: ``<workdir>/checkpoints/<step>/{state,config}``; ``state`` is the train
state as a plain nested dict (params, optimiser state, batch statistics, EMA
weights, step) and ``config`` the resolved :class:`ddim.config.Config` as JSON.
Orbax writes each step to a temporary directory and renames it when complete,
so an interrupted save never damages an earlier checkpoint.

Storage still fails in other ways (a crash of the disk, a partial copy, a full
file system), so every restore is verified: :meth:`Checkpointer.restore` checks
the files of the newest checkpoint (:meth:`Checkpointer.problem`), restores it,
and when either fails falls back to the previous one with a one-line warning.
Damaged checkpoints are renamed ``<step>.damaged`` (never deleted), which orbax
does not list, so they never count as the latest again. A save that fails
(:class:`CheckpointSaveError`) says why in one line and leaves no temporary
directory behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from ddim.config import Config, ConfigError, from_dict
from ddim.errors import UserError, debug, environment_error, first_line, os_error_code

CHECKPOINT_DIR = "checkpoints"
DAMAGED_SUFFIX = ".damaged"

T = TypeVar("T")


class CheckpointError(UserError, RuntimeError):
    """No usable checkpoint where one was expected (the message says where and why)."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose files are missing, truncated or garbled."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"checkpoint {path} is damaged: {reason}")
        self.path, self.reason = path, reason


class CheckpointSaveError(CheckpointError):
    """A save failed (full disk, lost permission, ...); older checkpoints are untouched."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def _ocp():
    import orbax.checkpoint as ocp

    _quiet_library_noise()
    return ocp


class _OrbaxLogFilter(logging.Filter):
    """Drops orbax's warning and error logs (tracebacks of a failed save or restore, notes on damaged
    files): what matters is raised as an error or printed as a one-line warning by this module."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING or f"{os.sep}orbax{os.sep}" not in record.pathname


class _OrbaxTaskFilter(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" for orbax's writes of a save that failed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and "orbax" in record.getMessage())


def _quiet_unraisable(previous):
    # When one read or write of a batch fails, orbax's event loop closes while TensorStore still
    # completes the others; each completion then reports "Event loop is closed" (or, at exit,
    # "Python is likely shutting down"), dozens of tracebacks that add nothing to the error raised.
    def hook(unraisable):
        text = str(unraisable.exc_value)
        if isinstance(unraisable.exc_value, (RuntimeError, ImportError)) and (
            "Event loop is closed" in text or "likely shutting down" in text
        ):
            return
        previous(unraisable)

    return hook


@dataclasses.dataclass
class _Quiet:
    installed: bool = False


_QUIET = _Quiet()


def _quiet_library_noise() -> None:
    """Once per process, unless ``DDIM_DEBUG`` is set: see the two helpers above."""
    if _QUIET.installed or debug():
        return
    _QUIET.installed = True
    logging.getLogger("absl").addFilter(_OrbaxLogFilter())
    logging.getLogger("asyncio").addFilter(_OrbaxTaskFilter())
    sys.unraisablehook = _quiet_unraisable(sys.unraisablehook)


def checkpoint_dir(workdir: str | Path) -> Path:
    return Path(workdir).absolute() / CHECKPOINT_DIR


# Errors that say the storage cannot be read right now, not that the checkpoint is damaged:
# moving a checkpoint aside for them would hide a good checkpoint behind a passing fault.
_NOT_DAMAGE = {errno.EACCES, errno.EPERM, errno.EIO, errno.ENOMEM, errno.EMFILE, errno.ENFILE}


def _damage_reason(error: BaseException) -> str | None:
    """Why an orbax/TensorStore restore failure means damaged files, naming the array where it can; else None."""
    chain, cause = [], error
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(e, json.JSONDecodeError) for e in chain):
        return "a metadata file is not valid JSON"
    text = " | ".join(str(e) for e in chain)
    item = re.search(r"Item \"(\w+)\" was not found", text)
    if item:
        return f"its {item.group(1)!r} item is missing"
    array = re.search(r'"([^"/]+)(?:/[^"]*)?" in OCDBT', text)
    where = f" (array {array.group(1)})" if array else ""
    if "OUT_OF_RANGE" in text or "byte range" in text.lower():
        return "a data file is truncated" + where
    if "DATA_LOSS" in text or "corrupt" in text.lower():
        return "a data file is corrupt" + where
    if "NOT_FOUND" in text or "does not exist" in text or "not found" in text.lower():
        return "a file is missing" + where
    return None  # not recognisably damage: reported as it is, and the checkpoint stays where it is


def _process_count() -> int:
    import jax

    return jax.process_count()


class Checkpointer:
    """Save and restore train states (and their config) under ``<workdir>/checkpoints``.

    Retention is orbax's: the ``keep`` most recent steps, or, with
    ``best_metric``, the ``keep`` steps whose saved metric of that name is best
    (lowest with ``best_mode="min"``); see :meth:`save`'s ``metrics``.
    ``create=False`` opens existing checkpoints read-only (sampling, eval).
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
        self.read_only = not create
        self._pending: int | None = None
        self._broken = False
        self._failed_steps: set[int] = set()
        best = {}
        if best_metric is not None:
            best = dict(
                best_fn=lambda metrics: float(metrics[best_metric]),
                best_mode=best_mode,
                keep_checkpoints_without_metrics=False,
            )
        # A writer removes the temporary directories of saves cut short (kill -9, power loss) before
        # it saves again; orbax does that on process 0 only, as multi-host storage is shared.
        # Readers (create=False) leave them: they may belong to a save in progress.
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=create, cleanup_tmp_directories=create, **best
        )
        try:
            self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "config"))
        except OSError as error:
            raise CheckpointError(f"cannot open {self.directory}: {environment_error(error) or first_line(error)}") from None

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

    def reload(self) -> None:
        """Read the list of steps from storage again (another process may have changed it)."""
        self.manager.reload()

    # Saving --------------------------------------------------------------------------------------

    def save(self, step: int, state_dict: dict[str, Any], config: Config, metrics: dict[str, float] | None = None) -> None:
        """Save asynchronously; :meth:`wait` (or :meth:`close`) reports how it ended.

        ``metrics`` are stored with the step; with ``best_metric`` they decide retention.
        Raises :class:`CheckpointSaveError` when this save cannot start or the previous one failed.
        """
        ocp = _ocp()
        self.wait()  # the previous save first, so that its failure names its own step
        try:
            self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state_dict), config=ocp.args.JsonSave(config.to_dict())
                ),
                metrics=metrics,
                force=True,
            )
        except Exception as error:
            raise self._save_failed(step, error) from None
        self._pending = step

    def save_finished(self) -> bool:
        """Whether a save was started and has since ended (call :meth:`wait` to learn how)."""
        return self._pending is not None and not self.manager.is_saving_in_progress()

    def wait(self) -> None:
        """Wait for the pending save; raises :class:`CheckpointSaveError` if it failed."""
        step, self._pending = self._pending, None
        if step is None or self._broken:
            return
        try:
            self.manager.wait_until_finished()
        except Exception as error:
            raise self._save_failed(step, error) from None

    def _save_failed(self, step: int, error: BaseException) -> CheckpointSaveError:
        self._broken = True  # orbax keeps re-raising a failed background save; report it once
        self._remove_partial(step)
        reason = environment_error(error) or first_line(error)
        return CheckpointSaveError(f"{reason} while saving step {step} to {self.directory}", step)

    def _remove_partial(self, step: int) -> None:
        """Remove what a failed save of ``step`` left (orbax's temporary directory), on process 0.

        Orbax's other writer threads of that save run on for a moment after the
        first failure and would create the directory again: wait for them first.
        """
        import jax

        self._failed_steps.add(step)
        deadline = time.monotonic() + 30
        for thread in threading.enumerate():
            if type(thread).__module__.startswith("orbax.") and thread is not threading.current_thread():
                threading.Thread.join(thread, max(0.0, deadline - time.monotonic()))  # not orbax's raising join
        if jax.process_index() != 0:
            return
        for partial in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
            shutil.rmtree(partial, ignore_errors=True)

    def close(self) -> None:
        """Wait for the pending save (raising :class:`CheckpointSaveError` if it failed) and close."""
        try:
            self.wait()
        finally:
            # After a failed save orbax re-raises it from here too; it was reported already.
            with contextlib.suppress(Exception) if self._broken else contextlib.nullcontext():
                self.manager.close()
            for step in sorted(self._failed_steps):  # anything written since the failure was reported
                self._remove_partial(step)

    # Restoring -----------------------------------------------------------------------------------

    def restore_state(self, step: int, target: dict[str, Any] | None = None) -> dict[str, Any]:
        """The saved state dict; with ``target`` (abstract arrays) restored to its shapes and shardings.

        Without ``target`` every array lands on this process's first device, whatever
        devices saved it (a checkpoint of 8 GPUs or 2 hosts samples on one CPU).
        """
        ocp = _ocp()
        try:
            if target is None:
                target = self._single_device_target(step)  # None if unreadable: the restore says why
            return self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))).state
        except Exception as error:  # orbax/tensorstore raise many types for damaged files
            raise self._read_error(step, error) from None

    def _single_device_target(self, step: int) -> dict[str, Any] | None:
        import jax

        ocp = _ocp()
        metadata = ocp.StandardCheckpointer().metadata(self.directory / str(step) / "state").item_metadata
        if metadata is None:
            return None
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device), metadata.tree)

    def restore_config(self, step: int) -> Config:
        ocp = _ocp()
        try:
            values = self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config
        except Exception as error:  # a missing or damaged JSON item
            raise self._read_error(step, error) from None
        try:
            return from_dict(values)
        except ConfigError as error:
            raise CheckpointError(f"checkpoint {self.directory / str(step)} has an invalid config: {first_line(error)}") from None

    def _read_error(self, step: int, error: BaseException) -> CheckpointError:
        """Damage (files missing, truncated, garbled) or another failure, which must not move anything."""
        path = self.directory / str(step)
        if os_error_code(error) in _NOT_DAMAGE:
            return CheckpointError(f"cannot read checkpoint {path}: {environment_error(error)}")
        reason = _damage_reason(error)
        if reason is None:
            return CheckpointError(f"cannot restore checkpoint {path}: {first_line(error)}")
        return DamagedCheckpoint(path, reason)

    def problem(self, step: int) -> str | None:
        """What is wrong with the files of ``step``, found without reading its arrays; None if nothing.

        Catches an empty directory, a missing item or manifest, garbled JSON
        metadata and empty data files; truncated or garbled array data only
        shows when restoring (which :meth:`restore` does next).
        """
        path = self.directory / str(step)
        try:
            if not any(path.iterdir()):
                return "the directory is empty"
            for item in ("state", "config"):
                if not (path / item).is_dir():
                    return f"its {item!r} item is missing"
            for name in ("state/_METADATA", "state/manifest.ocdbt", "config/metadata"):
                if not (path / name).is_file():
                    return f"{name} is missing"
            json_files = [path / "_CHECKPOINT_METADATA", path / "state" / "_METADATA", path / "state" / "_sharding",
                          path / "config" / "metadata", *(path / "state" / "array_metadatas").glob("*")]
            for file in json_files:
                if file.is_file():
                    try:
                        json.loads(file.read_bytes())
                    except ValueError:
                        return f"{file.relative_to(path)} is not valid JSON"
            data = [*path.glob("state/**/manifest.ocdbt"), *path.glob("state/**/d/*")]
            for file in data:
                if file.is_file() and file.stat().st_size == 0:
                    return f"{file.relative_to(path)} is empty"
        except OSError as error:
            if os_error_code(error) in _NOT_DAMAGE:
                raise CheckpointError(f"cannot read checkpoint {path}: {environment_error(error)}") from None
            return environment_error(error) or first_line(error)
        return None

    def restore(
        self,
        restore: Callable[[int], T],
        step: int | None = None,
        warn: Callable[[str], None] | None = None,
        set_aside: bool = True,
    ) -> tuple[int, T] | None:
        """``(step, restore(step))`` for ``step``, or for the newest intact checkpoint; None if there is none.

        ``restore(step)`` reads what the caller needs and raises
        :class:`DamagedCheckpoint` (as :meth:`restore_state` and
        :meth:`restore_config` do) when the files are damaged; any other error
        propagates. A damaged ``step`` named by the caller is an error. Without
        one, each damaged checkpoint newer than the newest intact one is
        reported through ``warn`` in one line and, with ``set_aside``, renamed
        ``<step>.damaged``. If every checkpoint is damaged, raises
        :class:`CheckpointError`.
        """
        warn = warn or _warn_stderr
        if step is not None:
            return step, self._restore_verified(step, restore)
        damaged = []
        for candidate in sorted(self.all_steps(), reverse=True):
            try:
                return candidate, self._restore_verified(candidate, restore)
            except DamagedCheckpoint as error:
                moved = self.set_aside(candidate, error.reason) if set_aside else None
                where = f"; moved aside to {moved}" if moved else ""
                warn(f"warning: skipping damaged checkpoint {error.path} ({error.reason}){where}")
                damaged.append(candidate)
        if damaged:
            steps = ", ".join(map(str, damaged))
            raise CheckpointError(
                f"no intact checkpoint in {self.directory}: every one is damaged (steps {steps}); "
                f"they were kept as <step>{DAMAGED_SUFFIX} where they could be moved"
            )
        return None

    def _restore_verified(self, step: int, restore: Callable[[int], T]) -> T:
        reason, result = self.problem(step), None
        if reason is None:
            try:
                result = restore(step)
            except DamagedCheckpoint as error:
                reason = error.reason
        reason = _agreed_problem(reason)
        if reason is not None:
            raise DamagedCheckpoint(self.directory / str(step), reason)
        return result

    def set_aside(self, step: int, reason: str) -> Path | None:
        """Rename a damaged ``step`` to ``<step>.damaged`` (with a note of why); returns the new path.

        Returns None, leaving it where it is, when the directory is read-only or
        a training run owns it (a trainer sets its own damaged checkpoints aside).
        In a multi-process run process 0 renames and the others wait for it.
        """
        import jax

        source = self.directory / str(step)
        target = None
        if jax.process_index() == 0 and (not self.read_only or _no_live_trainer(self.directory)):
            target = self.directory / f"{step}{DAMAGED_SUFFIX}"
            suffix = 2
            while target.exists():
                target, suffix = self.directory / f"{step}{DAMAGED_SUFFIX}.{suffix}", suffix + 1
            try:
                source.rename(target)
            except OSError:
                target = None
            else:
                stamp = datetime.datetime.now().isoformat(sep=" ", timespec="seconds")
                with contextlib.suppress(OSError):
                    (target / "DAMAGED.txt").write_text(f"{stamp}: set aside by ddim: {reason}\n")
        if _process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"ddim_set_aside_{step}")
        self.manager.reload()
        return target


def _agreed_problem(reason: str | None) -> str | None:
    """In a multi-process run a checkpoint damaged for one process is damaged for all."""
    if _process_count() == 1:
        return reason
    import numpy as np
    from jax.experimental import multihost_utils

    votes = multihost_utils.process_allgather(np.int32(reason is not None))
    if reason is None and np.any(votes):
        return "another process could not read it"
    return reason


def _no_live_trainer(directory: Path) -> bool:
    """Whether nothing trains in the work directory of ``directory`` (its ``checkpoints`` folder)."""
    from ddim.workdir import live_holder

    workdir = directory.parent if directory.name == CHECKPOINT_DIR else directory
    return live_holder(workdir) is None


def _warn_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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
        if path.name.isdigit() and path.parent.is_dir() and not (path / CHECKPOINT_DIR).is_dir():
            return Checkpointer(path.parent, create=False), int(path.name)
        if path.name.endswith(DAMAGED_SUFFIX) or DAMAGED_SUFFIX + "." in path.name:
            raise CheckpointError(f"checkpoint {path} was set aside as damaged (see its DAMAGED.txt)")
        if (path / CHECKPOINT_DIR).is_dir():
            path = path / CHECKPOINT_DIR
        return _open(path), None
    if workdir is None:
        raise CheckpointError("give a work directory or a checkpoint path")
    return _open(checkpoint_dir(workdir)), None


def _open(directory: Path) -> Checkpointer:
    if not directory.is_dir():
        raise CheckpointError(f"no checkpoints in {directory} (train first: ddim train --workdir ...)")
    checkpointer = Checkpointer(directory, create=False)
    if checkpointer.latest_step() is None:
        raise CheckpointError(f"no checkpoints in {directory} (train first: ddim train --workdir ...)")
    return checkpointer


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
