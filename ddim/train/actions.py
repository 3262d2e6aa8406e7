"""Everything the training loop does besides training: small periodic actions with one interface.

In the spirit of clu's ``periodic_actions`` (as scenic and big_vision use
them): after every step the loop hands each action a :class:`StepInfo`; the
action says whether it is due (:meth:`PeriodicAction.due`, usually an
:class:`Every` trigger), does its job (:meth:`PeriodicAction.run`) and returns
what it has to report (a :class:`ddim.summary.Report`: scalars, images, a log
line), which the loop hands to the reporter. When the loop ends, normally or
by an error, every action's :meth:`PeriodicAction.finish` runs.

Adding a periodic job means writing one class here and adding it to
:func:`default_actions`; the loop does not change.

Order matters: :class:`SaveCheckpoint` runs after :class:`LogTrainMetrics`
and both pass through :class:`MetricsBuffer`, the loop's one host sync, which
refuses non-finite losses, so a checkpoint is never written after a NaN.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import jax
import numpy as np

from ddim import parallel
from ddim.checkpoint import CheckpointError, Checkpointer
from ddim.config import Config
from ddim.errors import UserError
from ddim.images import make_grid, save_png
from ddim.model import DiffusionModel
from ddim.summary import Progress, Report, format_metrics
from ddim.train import state as state_lib
from ddim.train.state import TrainState
from ddim.workdir.layout import Workdir


class TrainingError(UserError, RuntimeError):
    """Training cannot go on (non-finite loss, incompatible checkpoint, ...)."""


@dataclass
class StepInfo:
    """What an action may know about the loop after a step."""

    step: int
    """Optimiser steps done (the state's step)."""
    total_steps: int
    """Steps the run trains for."""
    steps_per_epoch: int
    state: TrainState
    """The state after ``step`` steps (device arrays; may still be computing)."""
    train_seconds: float = 0.0
    """Seconds the loop has spent training (not in actions) since it started."""
    stopping: bool = False
    """A stop was requested (Ctrl-C, SIGTERM): this is the last step of this process."""

    @property
    def epoch(self) -> int:
        """Epochs completed."""
        return self.step // self.steps_per_epoch

    @property
    def epoch_end(self) -> bool:
        return self.step % self.steps_per_epoch == 0

    @property
    def last(self) -> bool:
        return self.step == self.total_steps


@dataclass(frozen=True)
class Every:
    """A trigger: every ``steps`` steps, at the end of every ``epochs`` epochs, at the last step, on a stop.

    ``0`` turns a period off; ``Every()`` fires only at the end of the run.
    """

    steps: int = 0
    epochs: int = 0
    at_end: bool = True
    on_stop: bool = False

    def __call__(self, info: StepInfo) -> bool:
        return bool(
            (self.steps and info.step % self.steps == 0)
            or (self.epochs and info.epoch_end and info.epoch % self.epochs == 0)
            or (self.at_end and info.last)
            or (self.on_stop and info.stopping)
        )


class PeriodicAction:
    """One periodic job of the training loop: when to run, what to do, what to report."""

    when: Every = Every()

    def due(self, info: StepInfo) -> bool:
        return self.when(info)

    def run(self, info: StepInfo) -> Report | None:
        raise NotImplementedError

    def finish(self, info: StepInfo | None, error: BaseException | None) -> None:
        """Called once when the loop ends (``error`` is what ended it, if anything)."""


class MetricsBuffer:
    """Per-step training metrics on their way from the device to the log.

    The loop appends each step's (device) metrics; :meth:`fetch` brings the
    pending ones to the host in one transfer and raises :class:`TrainingError`
    on a non-finite loss; :meth:`take_mean` hands the fetched ones to the log.
    """

    def __init__(self):
        self.pending: list[dict[str, Any]] = []
        self.fetched: list[dict[str, float]] = []
        self.last_mean: dict[str, float] = {}
        """What :meth:`take_mean` returned last."""
        self.waited_seconds = 0.0
        """Seconds :meth:`fetch` has waited for the device to finish steps, in all: training time, though the
        actions that fetch spend it (and the loop counts actions' time out of ``StepInfo.train_seconds``)."""

    def append(self, metrics: dict[str, Any]) -> None:
        self.pending.append(metrics)

    def bound_dispatch(self, max_ahead: int) -> None:
        """Wait (without a transfer) until at most ``max_ahead`` appended steps are unfinished.

        JAX dispatches asynchronously: unchecked, Python runs up to ``log_every``
        steps ahead of the device, so Ctrl-C would take minutes to be seen and
        the progress bar would lie. Waiting for the step before last keeps the
        device busy with one queued step; the steps before the pending ones
        were finished by the last fetch.
        """
        if len(self.pending) > max_ahead:
            jax.block_until_ready(self.pending[-max_ahead - 1])

    def fetch(self, step: int) -> None:
        """Transfer the pending metrics of the steps up to ``step``; fail on a non-finite loss."""
        if not self.pending:
            return
        started = time.perf_counter()
        values = parallel.to_host(self.pending)  # waits for the steps to finish
        self.waited_seconds += time.perf_counter() - started
        self.pending.clear()
        for offset, metrics in enumerate(values):
            if not all(np.isfinite(v) for v in metrics.values()):
                bad = step - len(values) + offset + 1
                raise TrainingError(f"non-finite loss at step {bad}: {format_metrics(metrics)}")
        self.fetched.extend({name: float(value) for name, value in m.items()} for m in values)

    def take_mean(self, step: int) -> dict[str, float]:
        """The mean of every metric since the last call (fetching what is pending first)."""
        self.fetch(step)
        values, self.fetched = self.fetched, []
        if values:
            self.last_mean = {name: float(np.mean([m[name] for m in values])) for name in values[0]}
        return self.last_mean if values else {}


class LogTrainMetrics(PeriodicAction):
    """Training losses, throughput and EMA decay: progress bar, TensorBoard and (now and then) a log line.

    The throughput is the images trained between two reports (``config.step_batch_size`` a step) over the
    seconds they took: the loop's training time, with the waits for the device that the metrics fetches spent
    in actions counted back in. The first step of a process (compiling, the input pipeline starting) has a
    report of its own, its seconds, so that no rate includes it.
    """

    def __init__(self, config: Config, metrics: MetricsBuffer, progress: Progress,
                 ema_decay: Callable[[int], float] | None = None):
        t = config.train
        self.when = Every(steps=t.log_every, epochs=1, at_end=True, on_stop=True)
        self.config, self.metrics, self.progress = config, metrics, progress
        # The decay the step just taken averaged with: training's, unless the run averages otherwise (a
        # distillation phase warms its own up from the phase's start).
        self.ema_decay = ema_decay or (lambda step: float(state_lib.ema_decay_at(step - 1, t.ema_decay, t.ema_warmup)))
        self._last_step, self._last_seconds = None, 0.0

    def due(self, info: StepInfo) -> bool:
        return self._last_step is None or self.when(info)  # the first step of this process, to time the rest from

    def run(self, info: StepInfo) -> Report:
        t = self.config.train
        means = self.metrics.take_mean(info.step)  # the steps up to info.step are finished now
        seconds = info.train_seconds + self.metrics.waited_seconds
        first = self._last_step is None
        if first:
            status, rate = f"{format_metrics(means)} (first step {seconds:.1f} s, compiling included)", None
        else:
            images = (info.step - self._last_step) * self.config.step_batch_size
            rate = images / max(seconds - self._last_seconds, 1e-9)
            status = f"{format_metrics(means)} {rate:.1f} img/s"
        self._last_step, self._last_seconds = info.step, seconds
        self.progress.update(info.step, status)
        decay = self.ema_decay(info.step)
        scalars = {f"train/{name}": value for name, value in means.items()}
        scalars.update({"train/first_step_seconds": seconds} if first else {"train/images_per_second": rate})
        scalars["train/ema_decay"] = decay
        # On a terminal the bar shows every update; keep the scrollback to one line per 10 updates.
        show = first or not self.progress.interactive or info.step % (t.log_every * 10) == 0 or info.last
        return Report(scalars, message=f"step {info.step}/{info.total_steps} {status}" if show else None)


class SaveCheckpoint(PeriodicAction):
    """Checkpoints every ``train.checkpoint_every`` steps, at epoch ends, at the end and on a stop.

    Only states whose losses were checked finite are saved; a crash saves the
    newest such state too (:meth:`finish`). Saves run in the background; the
    step after one has finished learns how it ended, so a failed save (a full
    disk) stops the run within a step, not at the next save.
    """

    def __init__(self, config: Config, checkpointer: Checkpointer, metrics: MetricsBuffer):
        self.when = Every(steps=config.train.checkpoint_every, epochs=1, at_end=True, on_stop=True)
        self.config, self.checkpointer, self.metrics = config, checkpointer, metrics

    def due(self, info: StepInfo) -> bool:
        return self.when(info) or self.checkpointer.save_finished()

    def run(self, info: StepInfo) -> None:
        if not self.when(info):
            self.checkpointer.wait()  # the background save has ended: raises if it failed
            return
        self.metrics.fetch(info.step)  # the NaN guard: raises before anything is written
        self.save(info)

    def save(self, info: StepInfo) -> None:
        if self.checkpointer.latest_step() != info.step:
            self.checkpointer.save(info.step, state_lib.state_to_dict(info.state), self.config)

    def finish(self, info: StepInfo | None, error: BaseException | None) -> None:
        if error is None or isinstance(error, (TrainingError, CheckpointError)) or info is None:
            return  # nothing to add; or the state is not to be saved; or saving is what failed
        if isinstance(error, KeyboardInterrupt) and jax.process_count() > 1:
            return  # one process aborting cannot save: the others would not join it
        # A crash or a second Ctrl-C: keep the newest state if it is intact and its losses are finite.
        try:
            if not any(getattr(x, "is_deleted", lambda: False)() for x in jax.tree.leaves(info.state)):
                self.metrics.fetch(info.step)
                self.save(info)
        except Exception:  # nothing better to keep than the last periodic checkpoint
            pass


class ValidationLoss(PeriodicAction):
    """Mean validation losses of the EMA model, with a fixed key per batch."""

    def __init__(self, config: Config, batches: Callable[[], Iterable[dict[str, jax.Array]]], rng, mesh):
        self.when = Every(epochs=config.train.eval_every, at_end=True)
        self.config, self.batches, self.rng, self.mesh = config, batches, rng, mesh

    def run(self, info: StepInfo) -> Report:
        started = time.perf_counter()
        _, eval_fn = state_lib.compiled_steps(self.config, self.mesh)
        results = [
            eval_fn(info.state, batch, jax.random.fold_in(self.rng, i)) for i, batch in enumerate(self.batches())
        ]
        if not results:
            return Report()
        results = parallel.to_host(results)
        means = {name: float(np.mean([r[name] for r in results])) for name in results[0]}
        return Report(
            {f"val/{name}": value for name, value in means.items()},
            message=f"epoch {info.epoch} (step {info.step}): val {format_metrics(means)} "
            f"({time.perf_counter() - started:.1f}s)",
        )


class SampleGrid(PeriodicAction):
    """A grid of EMA samples from a fixed key (so grids are comparable over training).

    Written as ``<workdir>/samples/step_NNNNNNN.png`` and to TensorBoard.
    """

    def __init__(self, config: Config, model: DiffusionModel, rng, workdir: Path, is_writer: bool, spec=None):
        from ddim.spec import SamplingSpec

        self.when = Every(epochs=config.train.eval_every, at_end=True)
        self.config, self.model, self.workdir, self.is_writer = config, model, workdir, is_writer
        # A distilled student samples with its own steps and sampler.
        self.spec = spec or SamplingSpec(steps=config.train.sample_steps)
        self.seed = int(jax.random.randint(rng, (), 0, 2**31 - 1))

    def run(self, info: StepInfo) -> Report:
        from ddim.sampling import generate_images

        t = self.config.train
        started = time.perf_counter()
        images = generate_images(
            self.model, state_lib.ema_variables(info.state), t.grid_rows * t.grid_cols, self.spec, seed=self.seed,
        )
        grid = make_grid(images, rows=t.grid_rows, cols=t.grid_cols)
        if not self.is_writer:  # it took part in the computation; process 0 writes
            return Report()
        grid_dir = Workdir(self.workdir).samples
        grid_dir.mkdir(exist_ok=True)
        path = save_png(grid, grid_dir / f"step_{info.step:07d}.png")
        return Report(images={"samples": grid}, message=f"grid {path} ({time.perf_counter() - started:.1f}s)")


class KidMonitor(PeriodicAction):
    """A cheap KID estimate at every evaluation, and the best-KID checkpoint in ``<workdir>/best``.

    KID is computed as the Keras example monitors it (InceptionV3 at 75x75,
    ``train.kid_images`` images of ``train.kid_steps`` DDIM steps, against the
    validation images). ``best/`` is an orbax checkpoint directory that keeps
    one step, the one with the lowest saved ``kid`` metric; a resumed run
    compares against it.
    """

    def __init__(self, config: Config, workdir: Path, model: DiffusionModel, extractor, real_features: np.ndarray):
        self.when = Every(epochs=config.train.eval_every, at_end=True)
        self.config, self.model, self.extractor, self.real = config, model, extractor, real_features
        self.best_checkpoints = None
        if config.train.keep_best:
            self.best_checkpoints = Checkpointer(Workdir(workdir).best, keep=1, best_metric="kid")
        self.best = self._best_so_far()

    def _best_so_far(self) -> float:
        if self.best_checkpoints is not None:
            step = self.best_checkpoints.best_step()
            metrics = self.best_checkpoints.metrics(step) if step is not None else None
            if metrics and "kid" in metrics:
                return float(metrics["kid"])
        return float("inf")

    @classmethod
    def create(cls, config: Config, workdir: Path, model, say, extractor_factory=None, val_images=None):
        """The monitor, or None (with a warning) when KID is off or InceptionV3 weights are missing."""
        t = config.train
        if not (t.kid_images and t.eval_every):
            return None
        from ddim import data as data_lib
        from ddim import evaluation

        try:
            if extractor_factory is not None:
                extractor = extractor_factory(evaluation.KID_IMAGE_SIZE)
            else:
                extractor = evaluation.kid_feature_extractor(t.inception_weights or None, batch_size=t.batch_size)
            cache_dir = Workdir(workdir).eval_cache
            cache_dir.mkdir(parents=True, exist_ok=True)
            (real,) = evaluation.real_features(config, "val", None, [extractor], cache_dir, images=val_images,
                                               data_cache=data_lib.cache_root(config, workdir))
        except (evaluation.EvaluationError, data_lib.DataError) as error:
            say(f"warning: KID monitoring is off: {error}")
            return None
        return cls(config, workdir, model, extractor, real)

    def run(self, info: StepInfo) -> Report:
        from ddim import evaluation

        t = self.config.train
        mean, std = evaluation.cheap_kid(
            self.model, state_lib.ema_variables(info.state), self.real, self.extractor,
            num_images=t.kid_images, steps=t.kid_steps, seed=t.seed, batch_size=t.batch_size,
        )
        best = self.best_checkpoints is not None and mean < self.best
        if best:
            self.best = mean
            self.best_checkpoints.save(
                info.step, state_lib.state_to_dict(info.state), self.config, metrics={"kid": mean, "kid_std": std}
            )
        return Report(
            {"val/kid": mean, "val/kid_std": std},
            message=f"step {info.step}: KID {mean:.4g} ± {std:.2g}{' (best so far, saved to best/)' if best else ''}",
        )

    def finish(self, info: StepInfo | None, error: BaseException | None) -> None:
        if self.best_checkpoints is not None:
            self.best_checkpoints.close()


def default_actions(run, kid_extractor_factory=None) -> list[PeriodicAction]:
    """The actions of ``ddim train``, in the order they run after a step.

    ``run`` is the :class:`ddim.train.loop.TrainingRun` being trained;
    ``kid_extractor_factory(image_size)`` replaces InceptionV3 for the KID
    monitor (tests inject a small random network; the CLI never does).
    """
    config = run.config
    actions: list[PeriodicAction] = [
        LogTrainMetrics(config, run.metrics, run.progress),
        SaveCheckpoint(config, run.checkpointer, run.metrics),
    ]
    if config.train.eval_every:
        if run.val_images is not None:
            actions.append(ValidationLoss(config, run.val_batches, run.eval_rng, run.mesh))
        actions.append(SampleGrid(config, run.model, run.grid_rng, run.workdir, run.is_writer))
        kid = KidMonitor.create(config, run.workdir, run.model, run.say, kid_extractor_factory, run.val_images)
        if kid is not None:
            actions.append(kid)
    return actions
