"""The training loop: set a run up (data, state, resume), then step until done.

``train(config, workdir)`` is the whole job; ``ddim train`` is a thin wrapper.
The loop only trains: logging, checkpointing, validation, sample grids and KID
are periodic actions (:mod:`ddim.train.actions`) that it calls after every
step. Interrupting it (Ctrl-C, SIGTERM, a crash) saves a checkpoint; running
it again continues from the latest checkpoint exactly as if it had never
stopped: the step's noise comes from ``fold_in(key, step)`` and the data order
from ``(seed, epoch)`` (see :mod:`ddim.data`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import jax

from ddim import data as data_lib
from ddim import onednn, parallel
from ddim.checkpoint import Checkpointer, model_config_mismatch
from ddim.config import Config
from ddim.environment import training_record
from ddim.errors import UserError, environment_error
from ddim.model import DiffusionModel
from ddim.summary import Progress, Reporter, plural, say_stderr, summary_writer
from ddim.train import init as init_lib
from ddim.train import state as state_lib
from ddim.train.actions import MetricsBuffer, PeriodicAction, StepInfo, TrainingError, default_actions
from ddim.train.state import TrainState
from ddim.train.stop import StopRequest
from ddim.workdir import Workdir, WorkdirLock, lock_for_training
from ddim.workdir.records import append_record

# Train steps dispatched but not yet finished: 2 keeps the device fed (the next step is
# already queued when one ends) while Ctrl-C and the progress bar lag by at most two steps.
MAX_STEPS_AHEAD = 2


@dataclass
class TrainResult:
    """What a call of :func:`train` did."""

    state: TrainState
    start_step: int
    final_step: int
    interrupted: bool
    last_metrics: dict[str, float]


def train(config: Config, workdir: str | Path, log=None, kid_extractor_factory=None) -> TrainResult:
    """Train (or resume training) ``config`` in ``workdir``; see the module docstring.

    ``log`` receives progress lines (default: the progress display);
    ``kid_extractor_factory(image_size)`` replaces InceptionV3 for the KID
    monitor (tests inject a small random network; the CLI never does).
    """
    onednn.prepare_native_code()  # before the first trace (the CLI's setup did it already)
    run = TrainingRun.prepare(config, workdir, log)
    if run.start_step >= run.total_steps:
        run.say(f"already trained for {run.start_step} steps (of {run.total_steps}); nothing to do")
        run.close()
        return TrainResult(run.state, run.start_step, run.start_step, False, {})
    if run.is_writer:  # what this stretch of training runs on, its convolutions' kernels among it
        with contextlib.suppress(OSError):  # a record is not worth the run
            append_record(Workdir(run.workdir).train_file,
                          training_record(run.config, run.start_step, run.total_steps))
    actions, state, info, stopped, action_seconds = [], run.state, None, False, 0.0
    try:
        actions = default_actions(run, kid_extractor_factory)
        step_fn, _ = state_lib.compiled_steps(run.config, run.mesh, source=run.source)
        batches = run.train_batches()
        started = time.perf_counter()
        with StopRequest(run.mesh) as stop:
            for step in range(run.start_step + 1, run.total_steps + 1):
                state, step_metrics = step_fn(state, next(batches), run.train_rng)
                run.metrics.append(step_metrics)
                run.metrics.bound_dispatch(MAX_STEPS_AHEAD)
                stopped = stop.agreed(step)  # the same step on every process
                train_seconds = time.perf_counter() - started - action_seconds
                info = StepInfo(step, run.total_steps, run.steps_per_epoch, state, train_seconds, stopped)
                action_seconds += run.run_actions(actions, info)
                if stopped:
                    run.say(f"stopped at step {step}; checkpoint saved, run the same command to resume")
                    break
        run.finish(actions, info, None)  # waits for the last save, which can fail too
    except BaseException as error:
        run.finish(actions, info, error)
        explained = run.explain(error, info)
        if explained is None:
            raise
        raise explained from None
    return TrainResult(state, run.start_step, info.step, stopped, run.metrics.last_mean)


class RunOutputs:
    """What a run reports and saves through, and how it ends: its ``checkpointer``, ``reporter``, ``progress`` and
    work directory ``lock`` (attributes of the run). :class:`TrainingRun` and distillation's run share it."""

    def run_actions(self, actions: list[PeriodicAction], info: StepInfo) -> float:
        """Run the due actions and report what they say; returns the seconds they took."""
        started = time.perf_counter()
        for action in actions:
            if action.due(info):
                self.reporter.write(info.step, action.run(info))
        return time.perf_counter() - started

    def close(self) -> None:
        """Wait for the last save (raising if it failed), close the outputs, release the work directory."""
        try:
            self.checkpointer.close()
        finally:
            self.reporter.close()
            self.progress.close()
            if self.lock is not None:
                self.lock.release()


@dataclass
class TrainingRun(RunOutputs):
    """Everything a training run is made of, set up by :meth:`prepare` (resuming when it can)."""

    config: Config
    workdir: Path
    say: Callable[[str], None]
    progress: Progress
    reporter: Reporter
    mesh: Any
    model: DiffusionModel
    state: TrainState
    checkpointer: Checkpointer
    train_images: data_lib.ImageRows
    val_images: data_lib.ImageRows | None
    steps_per_epoch: int
    total_steps: int
    start_step: int
    train_rng: Any
    eval_rng: Any
    grid_rng: Any
    is_writer: bool
    metrics: MetricsBuffer = field(default_factory=MetricsBuffer)
    data: data_lib.Data | None = None
    source: init_lib.SourceTargets | None = None
    """The source model a run learns from (``init.targets = "source"``), else None."""
    lock: WorkdirLock | None = None
    finished: bool = False

    @classmethod
    def prepare(cls, config: Config, workdir: str | Path, log=None) -> "TrainingRun":
        """Lock the work directory (one trainer each), load the data, build or resume the state."""
        workdir = Path(workdir)
        lock = lock_for_training(workdir, warn=log)
        try:
            run = cls._prepare(config, workdir, log)
        except BaseException:
            lock.release()
            raise
        run.lock = lock
        return run

    @classmethod
    def _prepare(cls, config: Config, workdir: Path, log) -> "TrainingRun":
        t = config.train
        early_say = log or say_stderr
        # Every process reads the cache (one of them builds it, under a lock); only process 0 reports.
        is_writer = jax.process_index() == 0
        data = data_lib.load(config, workdir, ("train", "val") if t.eval_every else ("train",),
                             log=early_say if is_writer else (lambda message: None), show_progress=is_writer)
        config = with_data_classes(config, data)
        train_images, val_images = data.train, data.val
        if val_images is not None and not len(val_images):
            val_images = None
        steps_per_epoch = data_lib.steps_per_epoch(config, len(train_images))
        total_steps = data_lib.total_steps(config, steps_per_epoch)

        mesh = parallel.data_mesh()
        parallel.check_batch_size(t.batch_size, mesh)
        init_rng, train_rng, eval_rng, grid_rng = jax.random.split(jax.random.key(t.seed), 4)
        state = state_lib.create_train_state(config, init_rng, mesh, total_steps)
        checkpointer = Checkpointer.of_run(Workdir(workdir).checkpoints, t)
        try:  # the newest intact checkpoint; damaged newer ones are set aside with a warning
            resumed = checkpointer.restore(lambda step: _resume(checkpointer, step, config, state), warn=log)
        except BaseException:
            checkpointer.close()
            raise
        latest, init_note, loaded_source = None, None, None
        if resumed is not None:
            latest, state = resumed
            if config.init.source:  # the run's own checkpoints win
                init_note = (f"{workdir} already has checkpoints: resuming from step {int(state.step)}; "
                             f"--init {config.init.source} is not read")
            # The run's record of its source stays, whatever the config resuming it says.
            config = dataclasses.replace(config, init=checkpointer.restore_config(latest).init)
        else:
            if config.init.source:
                config, state, loaded_source = _start_from_source(config, state, mesh)
                init_note = init_lib.describe(config)
            if t.normalizer_batches and (not config.init.source or config.init.normalizer == "adapt"):
                # Like Keras' Normalization.adapt(): start from the dataset's statistics, so even a short
                # run denormalises its samples correctly.
                first = data_lib.first_batches(train_images, config, t.normalizer_batches)
                stats = state_lib.image_statistics(first)
                state = parallel.replicate(state_lib.set_normalizer_stats(state, *stats), mesh)
        start_step = int(state.step)
        source = None
        if config.init.targets == "source":
            try:  # on resume the source is read again, and must be the one the run started from
                checked = loaded_source is None
                loaded_source = loaded_source or init_lib.load_source(config.init.source)
                source = init_lib.teacher_source(config, loaded_source, mesh, check_digest=checked)
            except BaseException:
                checkpointer.close()
                raise

        progress = Progress(total_steps, start_step, description=config.name)
        say = log or progress.log
        if is_writer:
            previous = data_lib.previous_fingerprint(workdir)
            if latest is not None and previous is not None and previous != data.fingerprint:
                say(f"warning: the data changed since this run last trained ({data.describe()}); training "
                    "goes on, but not with the batches an uninterrupted run would have seen")
            data.write_report(workdir)
        say(
            f"data: {data.describe()} · image {config.model.image_size}x{config.model.image_size} · devices: "
            f"{jax.device_count()} {jax.default_backend()}, mesh {tuple(mesh.devices.shape)}, global batch "
            f"{t.batch_size}"
        )
        writer = summary_writer(Workdir(workdir).tensorboard, say) if is_writer and start_step < total_steps else None
        resuming = f"; resuming from step {start_step}" if latest is not None else ""
        say(f"{config.name}: {plural(steps_per_epoch, 'step/epoch')}, {plural(total_steps, 'step')}, workdir "
            f"{workdir}{resuming}")
        if init_note and is_writer:
            say(init_note)
        copying = data_lib.copying_warning(config, len(train_images), total_steps)
        if copying and is_writer and start_step < total_steps:
            say(copying)
        return cls(
            config, workdir, say, progress, Reporter(writer, say), mesh, DiffusionModel(config.model), state,
            checkpointer, train_images, val_images, steps_per_epoch, total_steps, start_step, train_rng, eval_rng,
            grid_rng, is_writer, data=data, source=source,
        )

    def train_batches(self) -> Iterator[dict[str, jax.Array]]:
        """Global training batches (``{"image", "label"}``) from ``start_step`` on, each process feeding its
        own rows."""
        rows = parallel.process_slice(self.config.train.batch_size)
        for batch in data_lib.train_batches(self.train_images, self.config, self.start_step, self.steps_per_epoch,
                                            rows):
            yield parallel.global_batch(batch, self.mesh)

    def val_batches(self) -> Iterator[dict[str, jax.Array]]:
        """The validation split as global batches (``{"image", "label"}``), in fixed order."""
        rows = parallel.process_slice(self.config.train.batch_size)
        for batch in data_lib.eval_batches(self.val_images, self.config, rows):
            yield parallel.global_batch(batch, self.mesh)

    def finish(self, actions: list[PeriodicAction], info: StepInfo | None, error: BaseException | None) -> None:
        """End the run once: every action's ``finish`` (a crash save among them), then close the outputs."""
        if self.finished:
            return
        self.finished = True
        failures = []
        for action in actions:
            try:
                action.finish(info, error)
            except Exception as failure:
                failures.append(failure)
        try:
            self.close()
        except Exception as failure:
            failures.append(failure)
        if failures and error is None:  # with an error, that error is what the user needs to see
            raise failures[0]

    def explain(self, error: BaseException, info: StepInfo | None) -> TrainingError | None:
        """What ended the run, and what is kept, in one line: for errors a user can act on, else None."""
        if isinstance(error, UserError):
            what = str(error)
        elif environment_error(error) is not None:  # a full disk, a lost permission, ... outside checkpointing
            what = environment_error(error, path_from_message=True)
            what += f" (at step {info.step})" if info is not None else ""
        else:
            return None
        return TrainingError(f"{what}; {self.last_checkpoint()}")

    def last_checkpoint(self) -> str:
        """A sentence naming the newest checkpoint on disk (call after :meth:`close`)."""
        try:
            self.checkpointer.reload()
        except Exception:  # the listing is only for the message
            pass
        last = self.checkpointer.latest_step()
        where = f"the last good checkpoint is step {last}" if last is not None else "no checkpoint was saved"
        return f"{where} in {self.checkpointer.directory}"


def with_data_classes(config: Config, data) -> Config:
    """A class-conditional ``config`` with the data's classes filled in (count, names, training frequencies).

    They are stored in every checkpoint, so sampling knows the classes without
    the data. An unconditional config comes back unchanged.
    """
    if not config.model.class_conditional:
        return config
    if not data.num_classes and config.init.source:
        # A class-conditional source fine-tuned on images without classes trains through its null class alone.
        model = dataclasses.replace(config.model, num_classes=0, class_names=(), class_counts=())
        return dataclasses.replace(config, model=model)
    if not data.num_classes:
        raise UserError(f"model.class_conditional needs labelled data, and {data.describe()} has no classes "
                        "(an image folder gives its first-level subfolders as classes)")
    counts = data.train_class_counts
    model = dataclasses.replace(config.model, num_classes=data.num_classes, class_names=tuple(data.class_names),
                                class_counts=tuple(int(c) for c in counts))
    return dataclasses.replace(config, model=model)


def _start_from_source(config: Config, state: TrainState, mesh) -> tuple[Config, TrainState, Any]:
    """A fine-tune's first state (:mod:`ddim.train.init`): the source's EMA weights as parameters and averages,
    a fresh optimiser at step 0; ``config`` with the source's step and weights' digest; and the loaded source."""
    loaded = init_lib.load_source(config.init.source)
    init_lib.check_fits_source(config, loaded.config)
    config = init_lib.with_source_record(config, loaded)
    fresh = {"params": state.params, "batch_stats": state.batch_stats}
    variables = init_lib.initial_variables(config, loaded, fresh)
    return config, parallel.replicate(state_lib.with_variables(state, variables), mesh), loaded


def _resume(checkpointer: Checkpointer, step: int, config: Config, template: TrainState) -> TrainState:
    """Restore ``step`` into ``template`` if it was saved by the same model (a damaged one raises)."""
    mismatch = model_config_mismatch(checkpointer.restore_config(step), config)
    if mismatch:
        raise TrainingError(f"cannot resume from {checkpointer.directory}: {mismatch}; use another --workdir")
    return state_lib.restore_train_state(checkpointer, step, template)
