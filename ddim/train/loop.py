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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import jax

from ddim import data as data_lib
from ddim import onednn, parallel
from ddim.checkpoint import Checkpointer, model_config_mismatch
from ddim.config import Config
from ddim.environment import training_record
from ddim.errors import UserError
from ddim.model import DiffusionModel
from ddim.summary import Progress, Reporter, plural, say_stderr, summary_writer
from ddim.train import init as init_lib
from ddim.train import state as state_lib
from ddim.train.actions import MetricsBuffer, TrainingError, default_actions
from ddim.train.state import TrainState
from ddim.train.steps import RunOutputs, run_steps
from ddim.workdir import Workdir, WorkdirLock, lock_for_training
from ddim.workdir.records import append_record

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
    with run.closing():
        actions = default_actions(run, kid_extractor_factory)
        train_step, _ = state_lib.compiled_steps(run.config, run.mesh, source=run.source)
        stretch = run_steps(run, lambda state, batch: train_step(state, batch, run.train_rng), run.state,
                            run.train_batches(), start_step=run.start_step, end_step=run.total_steps,
                            total_steps=run.total_steps, steps_per_epoch=run.steps_per_epoch, actions=actions,
                            metrics=run.metrics, mesh=run.mesh)
    return TrainResult(stretch.state, run.start_step, stretch.step, stretch.stopped, run.metrics.last_mean)


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
    order: data_lib.BatchOrder
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
        """The named steps of a run's set-up, in order: data, schedule, state (resumed, or fine-tuned from a
        source, or new with the data's normaliser), the source's targets, reporting."""
        t = config.train
        # Every process reads the cache (one of them builds it, under a lock); only process 0 reports.
        is_writer = jax.process_index() == 0
        config, data = _load_data(config, workdir, log or say_stderr, is_writer)
        order = data_lib.batch_order(config.data, len(data.train), t.batch_size, t.seed)
        steps_per_epoch = order.steps_per_epoch(len(data.train))
        total_steps = data_lib.total_steps(t, steps_per_epoch)
        mesh = parallel.data_mesh()
        parallel.check_batch_size(t.batch_size, mesh)
        init_rng, train_rng, eval_rng, grid_rng = jax.random.split(jax.random.key(t.seed), 4)
        state = state_lib.create_train_state(config, init_rng, mesh, total_steps)
        checkpointer = Checkpointer.of_run(Workdir(workdir).checkpoints, t)
        try:
            start = _first_state(config, workdir, state, mesh, checkpointer, data, order, log)
            source = _source_targets(start.config, start.loaded_source, mesh)
        except BaseException:
            checkpointer.close()
            raise
        config, state = start.config, start.state
        start_step = int(state.step)
        progress = Progress(total_steps, start_step, description=config.name)
        say = log or progress.log
        if is_writer:
            _report_setup(config, workdir, data, start, steps_per_epoch, total_steps, mesh, say)
        writer = summary_writer(Workdir(workdir).tensorboard, say) if is_writer and start_step < total_steps else None
        return cls(
            config, workdir, say, progress, Reporter(writer, say), mesh, DiffusionModel(config.model), state,
            checkpointer, data.train, data.val, order, steps_per_epoch, total_steps, start_step, train_rng, eval_rng,
            grid_rng, is_writer, data=data, source=source,
        )

    def train_batches(self) -> Iterator[dict[str, jax.Array]]:
        """Global training batches (``{"image", "label"}``) from ``start_step`` on, each process feeding its
        own rows."""
        rows = parallel.process_slice(self.config.train.batch_size)
        for batch in data_lib.train_batches(self.train_images, self.order, self.start_step, rows):
            yield parallel.global_batch(batch, self.mesh)

    def val_batches(self) -> Iterator[dict[str, jax.Array]]:
        """The validation split as global batches (``{"image", "label"}``), in fixed order."""
        t = self.config.train
        rows = parallel.process_slice(t.batch_size)
        for batch in data_lib.eval_batches(self.val_images, t.batch_size, t.eval_batches, rows):
            yield parallel.global_batch(batch, self.mesh)


class FirstState(NamedTuple):
    """Where a run starts: its config (the source's record filled in, or the resumed run's), its state, the
    step it resumes from (None for a new run), a line on where the weights came from, and the loaded source of a
    new fine-tune."""

    config: Config
    state: TrainState
    resumed_step: int | None
    init_note: str | None
    loaded_source: Any


def _load_data(config: Config, workdir: Path, say, is_writer: bool) -> tuple[Config, data_lib.Data]:
    """The run's data (the validation split only when evaluations run), and ``config`` with its classes."""
    splits = ("train", "val") if config.train.eval_every else ("train",)
    data = data_lib.load(config, workdir, splits, log=say if is_writer else (lambda message: None),
                         show_progress=is_writer)
    if data.val is not None and not len(data.val):
        data = dataclasses.replace(data, val=None)
    return with_data_classes(config, data), data


def _first_state(config: Config, workdir: Path, state: TrainState, mesh, checkpointer: Checkpointer, data,
                 order: data_lib.BatchOrder, log) -> FirstState:
    """The newest intact checkpoint (damaged newer ones are set aside with a warning); else the fine-tune's
    source; else ``state``, its normaliser adapted to the data."""
    resumed = checkpointer.restore(lambda step: _resume(checkpointer, step, config, state), warn=log)
    if resumed is not None:
        latest, state = resumed
        note = None
        if config.init.source:  # the run's own checkpoints win
            note = (f"{workdir} already has checkpoints: resuming from step {int(state.step)}; "
                    f"--init {config.init.source} is not read")
        # The run's record of its source stays, whatever the config resuming it says.
        config = dataclasses.replace(config, init=checkpointer.restore_config(latest).init)
        return FirstState(config, state, latest, note, None)
    note, loaded = None, None
    if config.init.source:
        config, state, loaded = _start_from_source(config, state, mesh)
        note = init_lib.describe(config)
    t = config.train
    if t.normalizer_batches and (not config.init.source or config.init.normalizer == "adapt"):
        # Like Keras' Normalization.adapt(): start from the dataset's statistics, so even a short
        # run denormalises its samples correctly.
        stats = state_lib.image_statistics(data_lib.first_batches(data.train, order, t.normalizer_batches))
        state = parallel.replicate(state_lib.set_normalizer_stats(state, *stats), mesh)
    return FirstState(config, state, None, note, loaded)


def _source_targets(config: Config, loaded_source, mesh) -> init_lib.SourceTargets | None:
    """The source model whose predictions a run learns (``init.targets = "source"``), else None; on resume it is
    read again, and must be the one the run started from."""
    if config.init.targets != "source":
        return None
    checked = loaded_source is None
    loaded_source = loaded_source or init_lib.load_source(config.init.source)
    return init_lib.teacher_source(config, loaded_source, mesh, check_digest=checked)


def _report_setup(config: Config, workdir: Path, data, start: FirstState, steps_per_epoch: int,
                  total_steps: int, mesh, say) -> None:
    """What the run trains on and for how long, in a few lines, and the data report in the work directory."""
    previous = data_lib.previous_fingerprint(workdir)
    if start.resumed_step is not None and previous is not None and previous != data.fingerprint:
        say(f"warning: the data changed since this run last trained ({data.describe()}); training "
            "goes on, but not with the batches an uninterrupted run would have seen")
    data.write_report(workdir)
    say(f"data: {data.describe()} · image {config.model.image_size}x{config.model.image_size} · devices: "
        f"{jax.device_count()} {jax.default_backend()}, mesh {tuple(mesh.devices.shape)}, global batch "
        f"{config.train.batch_size}")
    resuming = f"; resuming from step {int(start.state.step)}" if start.resumed_step is not None else ""
    say(f"{config.name}: {plural(steps_per_epoch, 'step/epoch')}, {plural(total_steps, 'step')}, workdir "
        f"{workdir}{resuming}")
    if start.init_note:
        say(start.init_note)
    copying = data_lib.copying_warning(config, len(data.train), total_steps)
    if copying and int(start.state.step) < total_steps:
        say(copying)


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
