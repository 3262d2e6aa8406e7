"""The one step loop: training and every distillation method step, report, save and stop through it.

:func:`run_steps` trains a stretch of steps with a step function, hands every step's :class:`StepInfo` to the
run's periodic actions (:mod:`ddim.train.actions`: logging, checkpoints, grids, ...) and ends at the stretch's
end, on a stop request (Ctrl-C, SIGTERM: the step every process agrees on) or on an error. However it ends,
every action's ``finish`` runs once (on an error: a crash save of the newest intact state), so a caller never
handles the actions itself. :class:`RunOutputs` is what a run reports and saves through, and how its errors become
one line for the user (:meth:`RunOutputs.closing`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ddim.errors import UserError, environment_error
from ddim.train.actions import MetricsBuffer, PeriodicAction, StepInfo, TrainingError
from ddim.train.state import TrainState
from ddim.train.stop import StopRequest

# Train steps dispatched but not yet finished: 2 keeps the device fed (the next step is
# already queued when one ends) while Ctrl-C and the progress bar lag by at most two steps.
MAX_STEPS_AHEAD = 2


@dataclass(frozen=True)
class Stretch:
    """What :func:`run_steps` reached: the state, the last step's info (None if no step ran), whether a stop
    ended it, and the seconds it took."""

    state: TrainState
    info: StepInfo | None
    stopped: bool
    seconds: float

    @property
    def step(self) -> int | None:
        return None if self.info is None else self.info.step


class RunOutputs:
    """What a run reports and saves through, and how it ends: its ``checkpointer``, ``reporter``, ``progress``,
    ``say`` and work directory ``lock`` (attributes of the run). Training and distillation runs share it."""

    def run_actions(self, actions: list[PeriodicAction], info: StepInfo) -> float:
        """Run the due actions and report what they say; returns the seconds they took."""
        started = time.perf_counter()
        for action in actions:
            if action.due(info):
                self.reporter.write(info.step, action.run(info))
        return time.perf_counter() - started

    def close(self) -> None:
        """Wait for the last save (raising if it failed), close the outputs, release the work directory; once."""
        if getattr(self, "closed", False):
            return
        object.__setattr__(self, "closed", True)  # a frozen dataclass run too
        try:
            self.checkpointer.close()
        finally:
            self.reporter.close()
            self.progress.close()
            if self.lock is not None:
                self.lock.release()

    @contextlib.contextmanager
    def closing(self) -> Iterator[None]:
        """Close the run after the block; an error that ended it, or the closing (the last save can fail too),
        leaves as the one line of :meth:`explain` where there is one."""
        try:
            yield
            self.close()
        except BaseException as error:
            with contextlib.suppress(Exception):  # the error that ended the run is the one to report
                self.close()
            explained = self.explain(error)
            if explained is None:
                raise
            raise explained from None

    @property
    def reached_step(self) -> int | None:
        """The last step :func:`run_steps` finished dispatching in this process (None before the first)."""
        return getattr(self, "_reached_step", None)

    def explain(self, error: BaseException) -> TrainingError | None:
        """What ended the run, and what is kept, in one line: for errors a user can act on, else None (call
        after :meth:`close`)."""
        step = self.reached_step
        if isinstance(error, UserError):
            what = str(error)
        elif environment_error(error) is not None:  # a full disk, a lost permission, ... outside checkpointing
            what = environment_error(error, path_from_message=True)
            what += f" (at step {step})" if step is not None else ""
        else:
            return None
        return TrainingError(f"{what}; {self.last_checkpoint()}")

    def last_checkpoint(self) -> str:
        """A sentence naming the newest checkpoint on disk."""
        try:
            self.checkpointer.reload()
        except Exception:  # the listing is only for the message
            pass
        last = self.checkpointer.latest_step()
        where = f"the last good checkpoint is step {last}" if last is not None else "no checkpoint was saved"
        return f"{where} in {self.checkpointer.directory}"


def finish_actions(actions: list[PeriodicAction], info: StepInfo | None, error: BaseException | None) -> None:
    """Every action's ``finish``, each once; the first failure is raised when nothing else ended the stretch
    (with an error, that error is what the user needs to see)."""
    failures = []
    for action in actions:
        try:
            action.finish(info, error)
        except Exception as failure:
            failures.append(failure)
    if failures and error is None:
        raise failures[0]


def run_steps(outputs: RunOutputs, step_fn: Callable[[TrainState, Any], tuple[TrainState, dict]],
              state: TrainState, batches: Iterator[Any], *, start_step: int, end_step: int, total_steps: int,
              steps_per_epoch: int, actions: list[PeriodicAction], metrics: MetricsBuffer, mesh) -> Stretch:
    """Train from ``start_step`` (the state's step) up to ``end_step``: ``step_fn(state, batch)`` on each of
    ``batches``, then the due ``actions``; a stop request ends it at the step every process agrees on.

    ``total_steps`` is the whole run's length (what the progress and the end-of-run triggers count to). The
    actions finish however the stretch ends; then the newest save is waited for, so a failed save raises here.
    """
    started, action_seconds, info, stopped, error = time.perf_counter(), 0.0, None, False, None
    try:
        with StopRequest(mesh) as stop:
            for step in range(start_step + 1, end_step + 1):
                state, step_metrics = step_fn(state, next(batches))
                object.__setattr__(outputs, "_reached_step", step)  # for errors' and records' lines (frozen runs too)
                metrics.append(step_metrics)
                metrics.bound_dispatch(MAX_STEPS_AHEAD)
                stopped = stop.agreed(step)  # the same step on every process
                train_seconds = time.perf_counter() - started - action_seconds
                info = StepInfo(step, total_steps, steps_per_epoch, state, train_seconds, stopped)
                action_seconds += outputs.run_actions(actions, info)
                if stopped:
                    outputs.say(f"stopped at step {step}; checkpoint saved, run the same command to resume")
                    break
    except BaseException as raised:
        error = raised
        raise
    finally:
        finish_actions(actions, info, error)  # a crash save on an error
    outputs.checkpointer.wait()
    return Stretch(state, info, stopped, time.perf_counter() - started)
