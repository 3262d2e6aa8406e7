"""The :class:`Checkpointer`: orbax checkpoints that carry their own config, so a checkpoint alone rebuilds the model.

Layout: ``<workdir>/checkpoints/<step>/{state,config}``; ``state`` is the train
state as a plain nested dict (params, optimiser state, batch statistics, EMA
weights, step) and ``config`` the resolved :class:`ddim.config.Config` as JSON.
Orbax writes each step to a temporary directory and renames it when complete,
so an interrupted save never damages an earlier checkpoint.

Storage still fails in other ways (a crash of the disk, a partial copy, a full
file system), so every restore is verified: :meth:`Checkpointer.restore` checks
the files of the newest checkpoint (:mod:`ddim.checkpoint.verify`), restores
it, and when either fails falls back to the previous one with a one-line
warning. Damaged checkpoints are renamed ``<step>.damaged`` (never deleted),
which orbax does not list, so they never count as the latest again. A save
that fails (:class:`CheckpointSaveError`) says why in one line and leaves no
temporary directory behind.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import ddim.checkpoint.verify as verify  # the module itself, not the package facade
from ddim.checkpoint.errors import CheckpointError, CheckpointSaveError, DamagedCheckpoint
from ddim.checkpoint.quiet import orbax
from ddim.config import Config, ConfigError, TrainConfig, from_dict
from ddim.errors import environment_error, first_line

T = TypeVar("T")


class Checkpointer:
    """Save and restore train states (and their config) under ``<workdir>/checkpoints``.

    Retention is orbax's: the ``keep`` most recent steps, or, with
    ``best_metric``, the ``keep`` steps whose saved metric of that name is best
    (lowest with ``best_mode="min"``); see :meth:`save`'s ``metrics``. With
    ``keep_every``, every step that is a multiple of it is kept as well.
    ``create=False`` opens existing checkpoints read-only (sampling, eval).
    """

    def __init__(
        self,
        directory: str | Path,
        keep: int = 3,
        create: bool = True,
        best_metric: str | None = None,
        best_mode: str = "min",
        keep_every: int = 0,
    ):
        ocp = orbax()
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
            max_to_keep=keep, keep_period=keep_every or None, create=create, cleanup_tmp_directories=create,
            **best,
        )
        try:
            self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "config"))
        except OSError as error:
            raise CheckpointError(f"cannot open {self.directory}: {environment_error(error) or first_line(error)}") from None

    @classmethod
    def of_run(cls, directory: str | Path, train: TrainConfig) -> "Checkpointer":
        """The writer of a training or distillation run: ``train.keep_checkpoints`` most recent steps, and every
        multiple of ``train.keep_checkpoints_every``."""
        return cls(directory, keep=train.keep_checkpoints, keep_every=train.keep_checkpoints_every)

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
        ocp = orbax()
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
        ocp = orbax()
        try:
            if target is None:
                target = self._single_device_target(step)  # None if unreadable: the restore says why
            return self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))).state
        except Exception as error:  # orbax/tensorstore raise many types for damaged files
            raise self._read_error(step, error) from None

    def _single_device_target(self, step: int) -> dict[str, Any] | None:
        import jax

        ocp = orbax()
        metadata = ocp.StandardCheckpointer().metadata(self.directory / str(step) / "state").item_metadata
        if metadata is None:
            return None
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device), metadata.tree)

    def restore_config(self, step: int) -> Config:
        ocp = orbax()
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
        return verify.read_error(self.directory / str(step), error)

    def problem(self, step: int) -> str | None:
        """What is wrong with the files of ``step``, found without reading its arrays; None if nothing
        (see :func:`ddim.checkpoint.verify.problem`; :meth:`restore` reads the arrays next)."""
        return verify.problem(self.directory / str(step))

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
                f"they were kept as <step>{verify.DAMAGED_SUFFIX} where they could be moved"
            )
        return None

    def _restore_verified(self, step: int, restore: Callable[[int], T]) -> T:
        reason, result = self.problem(step), None
        if reason is None:
            try:
                result = restore(step)
            except DamagedCheckpoint as error:
                reason = error.reason
        reason = verify.agreed_problem(reason)
        if reason is not None:
            raise DamagedCheckpoint(self.directory / str(step), reason)
        return result

    def set_aside(self, step: int, reason: str) -> Path | None:
        """Rename a damaged ``step`` to ``<step>.damaged`` (with a note of why); returns the new path.

        Returns None, leaving it where it is, when the directory is read-only or
        a training run owns it (a trainer sets its own damaged checkpoints aside).
        In a multi-process run process 0 renames and the others wait for it.
        """
        target = verify.set_aside(self.directory, step, reason, self.read_only)
        self.manager.reload()
        return target


def _warn_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
