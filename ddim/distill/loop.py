"""The distillation run: set it up (teacher, plan, data, resume), then train phase after phase.

``distill(teacher, workdir)`` is the whole job; ``ddim distill`` is a thin wrapper. The loop only trains; logging,
checkpoints and sample grids are the training loop's periodic actions (:mod:`ddim.train.actions`). A student work
directory holds::

    <workdir>/
      checkpoints/<step>/        the student in training (Ctrl-C saves; the same command resumes)
      students/<N>/checkpoints/  the student of every finished phase, N its step count (or ``consistency``, the one
                                 consistency student, or ``midtraining``, the mid-trained weights it starts from): a
                                 work directory of its own (ddim sample --workdir <workdir>/students/4)
      trajectories.npz           the teacher's banked trajectories: consistency mid-training's, the trajectory
                                 phase's (:mod:`ddim.distill.bank`)
      distill.jsonl              the teacher, and the optimiser steps and seconds of every stretch of training
                                 (and what it ran on: the backend, which kernels ran the convolutions)
      samples/, tensorboard/, data_cache/   as for ddim train

The global step counts on across phases (:mod:`ddim.distill.plan`), the data order is a function of
``(seed, epoch)`` and every step's noise of ``fold_in(key, step)``, so a resumed run trains as if it had not
stopped. Nothing changes under a phase's feet: a :class:`DistillationRun` is what is set up once, a
:class:`PhaseJob` what one phase trains with, and :meth:`DistillationRun.train_phase` takes a state and returns
the one it reached (:class:`PhaseEnd`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import jax
import numpy as np

from ddim import data as data_lib
from ddim import parallel
from ddim.checkpoint import Checkpointer, load_ema
from ddim.checkpoint.ema import check_fits_config
from ddim.config import Config
from ddim.distill import bank as bank_lib
from ddim.distill import plan as plan_lib
from ddim.distill.plan import CONSISTENCY, MIDTRAINING, TRAJECTORY, Phase
from ddim.distill.settings import check_settings, check_teacher_record, run_config, teacher_identity
from ddim.distill.step import StepSettings, compiled_step, create_student_state
from ddim.environment import run_fields
from ddim.errors import UserError
from ddim.model import DiffusionModel, init_variables
from ddim.spec import SamplingRules
from ddim.summary import Progress, Reporter, format_duration, say_stderr, summary_writer
from ddim.train import state as state_lib
from ddim.train.actions import LogTrainMetrics, MetricsBuffer, SampleGrid, SaveCheckpoint, StepInfo, TrainingError
from ddim.train.steps import RunOutputs, run_steps
from ddim.train.state import TrainState
from ddim.workdir import Workdir, WorkdirLock, lock_for_training
from ddim.workdir.records import append_record


@dataclass
class DistillResult:
    """What a call of :func:`distill` did."""

    start_step: int
    final_step: int
    interrupted: bool
    students: dict[int, Path] = field(default_factory=dict)
    """The finished students by step count (all there are in the work directory; a consistency student under
    every count it samples with)."""
    last_metrics: dict[str, float] = field(default_factory=dict)


def distill(teacher: str | Path, workdir: str | Path, config_file: str | Path | None = None, overrides=(),
            log: Callable[[str], None] | None = None) -> DistillResult:
    """Distil ``teacher`` (a work directory, checkpoint or ``"pretrained:NAME"``) into ``workdir``, or resume.

    ``config_file`` and ``overrides`` set the ``[distill]`` section (:func:`run_config`; ``distill.method`` picks
    progressive or consistency distillation); ``log`` receives the progress lines (default: the progress
    display). Raises :class:`ddim.errors.UserError` subclasses, one line each, for a bad teacher, bad settings or
    a work directory started otherwise.
    """
    workdir = Path(workdir)
    check_settings(config_file, overrides)
    lock = lock_for_training(workdir, warn=log)
    try:
        run, resumed = DistillationRun.prepare(teacher, workdir, config_file, overrides, log, lock)
    except BaseException:
        lock.release()
        raise
    with run.closing():
        return run.train(resumed)


class Resumed(NamedTuple):
    """Where a run starts: the state of its newest checkpoint (None for a new run) and its global step."""

    state: TrainState | None
    step: int


@dataclass(frozen=True)
class PhaseJob:
    """What one phase trains with, fixed for its length: the phase, the student's config and model, its teacher
    (replicated), the compiled step and its global batches from a step on."""

    phase: Phase
    config: Config
    """The config stored with the student's checkpoints."""
    student: DiffusionModel
    teacher_variables: Any
    step_fn: Callable
    batches: Callable[[int], Iterator[Any]]


class PhaseEnd(NamedTuple):
    """What training a phase returns: the state it reached, at which global step, whether it was stopped there,
    and the mean of its last logged metrics."""

    state: TrainState
    step: int
    stopped: bool
    metrics: dict[str, float]


class BankingProgress:
    """``on_batch`` of :func:`ddim.distill.bank.solve`: a line at every tenth of the bank solved until the whole,
    with the time spent and an estimate of the time left (solving takes an hour or more at 64x64 on a CPU);
    ``seconds``, the solving time of the whole bank."""

    def __init__(self, size: int, say: Callable[[str], None]):
        self.size, self.say = size, say
        self.first, self.seconds, self.said = None, 0.0, 0

    def __call__(self, done: int, seconds: float) -> None:
        self.seconds, tenth = seconds, done * 10 // self.size
        if self.first is None:  # the rows read from earlier parts: the estimate counts only the rows solved here
            self.first, self.said = (done, seconds), tenth
            if done:
                self.say(f"banking resumed: {done} of {self.size} trajectories were solved before")
            return
        if tenth <= self.said or done == self.size:  # the whole bank has its own line
            return
        self.said = tenth
        rows, spent = done - self.first[0], seconds - self.first[1]
        left = f", about {format_duration((self.size - done) * spent / rows)} left" if rows else ""
        self.say(f"banked {done} of {self.size} trajectories in {format_duration(seconds)}{left}")


@dataclass(frozen=True)
class DistillationRun(RunOutputs):
    """A distillation run set up by :meth:`prepare`: its teacher, plan, data and outputs, the same in every phase."""

    config: Config
    workdir: Path
    teacher_name: str
    """The teacher as the students' configs and ``distill.jsonl`` name it (:func:`teacher_identity`)."""
    teacher_step: int | None
    teacher_model: DiffusionModel
    teacher_variables: dict[str, Any]
    phases: tuple[Phase, ...]
    train_images: Any
    order: data_lib.BatchOrder
    """The students' batches: ``distill.batch_size`` images a step in ``distill.seed``'s order."""
    steps_per_epoch: int
    label_table: Callable
    mesh: Any
    checkpointer: Checkpointer
    progress: Progress
    reporter: Reporter
    say: Callable[[str], None]
    rng: Any
    grid_rng: Any
    lock: WorkdirLock | None = None

    @classmethod
    def prepare(cls, teacher_source, workdir: Path, config_file, overrides, log,
                lock: WorkdirLock | None = None) -> tuple["DistillationRun", Resumed]:
        """Load the teacher and the data, plan the phases, resume the newest checkpoint; ``(run, resumed)``."""
        from ddim.sampling import load

        early_say = log or say_stderr
        teacher = load(teacher_source)
        check_fits_config(teacher.config, teacher.variables, teacher.path)  # load() leaves it to the first trace
        config = run_config(teacher.config, config_file, overrides)
        plan_lib.check_teacher(teacher.config.model, f"the teacher {teacher_source}", config)
        phases = tuple(plan_lib.plan(teacher.config.model, config))
        name = teacher_identity(teacher_source)
        check_teacher_record(workdir, name, teacher.step)
        d = config.distill
        if teacher.config.model.prediction != d.prediction:
            early_say(f"warning: the teacher predicts {teacher.config.model.prediction} and the students "
                      f"{d.prediction}: the first student starts from weights made for another target; a "
                      f"{d.prediction} teacher (ddim train --init) starts it as its teacher")
        data = data_lib.load(config, workdir, ("train",), log=early_say)
        space = teacher.class_space
        if space.conditional and not data.num_classes:
            raise UserError(f"the teacher is class-conditional, and {data.describe()} has no classes to distil it on")

        def label_table(labels):
            return space.ids_of_data_labels(labels, data.class_names) if space.conditional else labels

        mesh = parallel.data_mesh()
        parallel.check_batch_size(d.batch_size, mesh, "distill.batch_size")
        rng, grid_rng = jax.random.split(jax.random.key(d.seed))
        checkpointer = Checkpointer.of_run(Workdir(workdir).checkpoints, config.train)
        try:
            resumed = _resume(checkpointer, config, teacher.config.model, phases, mesh, log)
        except BaseException:
            checkpointer.close()
            raise
        total = phases[-1].end
        progress = Progress(total, resumed.step, description=config.name)
        say = log or progress.log
        writer = summary_writer(Workdir(workdir).tensorboard, say) if resumed.step < total else None
        say(f"distilling {teacher_source} (step {teacher.step}) into {workdir}: "
            + "; ".join(f"{p.describe()} ({p.optimizer_steps} steps)" for p in phases)
            + (f"; resuming from step {resumed.step}" if resumed.step else ""))
        # The students' batch size and seed (the train section stays the teacher's record).
        order = data_lib.batch_order(config.data, len(data.train), d.batch_size, d.seed)
        run = cls(config, workdir, name, teacher.step, DiffusionModel(teacher.config.model), teacher.variables, phases,
                  data.train, order, order.steps_per_epoch(len(data.train)), label_table, mesh, checkpointer, progress,
                  Reporter(writer, say), say, rng, grid_rng, lock)
        return run, resumed

    def batches(self, start_step: int) -> Iterator[dict[str, jax.Array]]:
        """Global batches from ``start_step`` on, labels as the teacher's class ids."""
        for batch in data_lib.train_batches(self.train_images, self.order, start_step):
            batch = dict(batch, label=self.label_table(batch["label"]))
            yield parallel.global_batch(batch, self.mesh)

    def bank_batches(self, draw: Callable[..., Iterator[dict[str, np.ndarray]]],
                     start_step: int) -> Iterator[dict[str, jax.Array]]:
        """Global batches of banked trajectory points from ``start_step`` on, as ``draw(seed, batch_size,
        start_step)`` draws them: :func:`ddim.distill.bank.batches` in mid-training,
        :func:`ddim.distill.bank.grid_batches` (the student's grid times) in the trajectory phase."""
        d = self.config.distill
        for batch in draw(d.seed, d.batch_size, start_step):
            yield parallel.global_batch(batch, self.mesh)

    def teacher_of(self, phase: Phase) -> tuple[DiffusionModel, dict[str, Any]]:
        """A round's teacher is the previous phase's student; every other phase's (consistency distillation's after
        mid-training, and the trajectory phase's, whose bank it solves, too) is the run's."""
        index = self.phases.index(phase)
        if index == 0 or phase.kind in (CONSISTENCY, MIDTRAINING, TRAJECTORY):
            return self.teacher_model, self.teacher_variables
        previous = load_ema(self.student_dir(self.phases[index - 1]))
        return DiffusionModel(previous.config.model), previous.variables

    def student_dir(self, phase: Phase) -> Path:
        """The work directory of ``phase``'s finished student."""
        return Workdir(self.workdir).student(phase.student_name)

    def student_config(self, phase: Phase) -> Config:
        return plan_lib.student_config(self.config, phase, self.teacher_name)

    def job(self, phase: Phase) -> PhaseJob:
        """Everything ``phase`` trains with (its teacher loaded, its step compiled)."""
        config = self.student_config(phase)
        student = DiffusionModel(config.model)
        teacher_model, teacher_variables = self.teacher_of(phase)
        step_fn = compiled_step(StepSettings.of(student, teacher_model, self.config, phase), self.mesh)
        batches = self.batches
        if phase.kind == MIDTRAINING:
            batches = functools.partial(self.bank_batches, functools.partial(bank_lib.batches,
                                                                             self.trajectory_bank(phase)))
        elif phase.kind == TRAJECTORY:
            batches = functools.partial(self.bank_batches, functools.partial(
                bank_lib.grid_batches, self.trajectory_bank(phase), student_steps=phase.student_steps))
        return PhaseJob(phase, config, student, parallel.replicate(teacher_variables, self.mesh), step_fn, batches)

    def first_state(self, job: PhaseJob) -> TrainState:
        """A phase's first state: its teacher's weights (after mid-training, the mid-trained student's; in the
        trajectory phase, the last round's student's), a fresh optimiser and weight average
        (:func:`create_student_state`)."""
        phase = job.phase
        index = self.phases.index(phase)
        weights = job.teacher_variables
        if phase.kind in (CONSISTENCY, TRAJECTORY) and index > 0:
            weights = load_ema(self.student_dir(self.phases[index - 1])).variables
        return create_student_state(job.student, weights, self.config, phase,
                                    jax.random.fold_in(self.rng, phase.start), self.mesh)

    def trajectory_bank(self, phase: Phase) -> bank_lib.Bank:
        """The banked trajectories of mid-training and of the trajectory phase: read from the work directory, or
        solved and stored there (when missing, or made with other settings; parts a stopped run solved are read
        again); the solving's seconds, the parts' included, count to ``phase`` in ``distill.jsonl``."""
        settings = bank_lib.BankSettings.of(self.config, self.teacher_name, self.teacher_step, self.teacher_model)
        path = Workdir(self.workdir).trajectories
        bank, why = bank_lib.load(path, settings)
        if bank is not None:
            self.say(f"read {settings.size} banked trajectories from {path}")
            return bank
        parts = Workdir(self.workdir).trajectory_parts
        self.say((f"{path} {why}; " if why else "") + f"banking {settings.size} trajectories of the teacher's "
                 f"{settings.grid_steps}-step guided DDIM path (Ctrl-C keeps the parts solved, in {parts})")

        def class_ids(indices):
            return self.label_table(data_lib.read_batch(self.train_images, indices)["label"])

        progress = BankingProgress(settings.size, self.say)
        bank = bank_lib.solve(self.teacher_model, self.teacher_variables, settings, class_ids, len(self.train_images),
                              parts, write_parts=jax.process_index() == 0, on_batch=progress)
        if jax.process_index() == 0:
            bank_lib.save(path, bank, settings, parts)
        seconds = progress.seconds
        append_record(Workdir(self.workdir).distill_file, {
            "phase": phase.kind, "student_steps": phase.student_steps, "from_step": phase.start,
            "to_step": phase.start, "seconds": round(seconds, 3), "banked_trajectories": settings.size,
            **run_fields(self.config.model.dtype)})
        self.say(f"banked {settings.size} trajectories in {seconds:.1f} s ({path})")
        return bank

    def train(self, resumed: Resumed) -> DistillResult:
        state, step = resumed
        stopped, last = False, {}
        for phase in self.phases:
            if step >= phase.end:
                self._ensure_exported(phase, state, step)
                continue
            job = self.job(phase)
            end = self.train_phase(job, self.first_state(job) if step == phase.start else state, step)
            state, step, stopped, last = end
            if stopped:
                break
            self._export(phase, state)
        if not stopped and resumed.step >= self.phases[-1].end:
            self.say(f"already distilled to {self.phases[-1].student_steps} steps (step {step}); nothing to do")
        return DistillResult(resumed.step, step, stopped, self.finished_students(), last)

    def finished_students(self) -> dict[int, Path]:
        """The students written so far, by every step count each samples with."""
        found = {}
        for phase in filter(lambda phase: phase.delivers_student, self.phases):
            path = self.student_dir(phase)
            if Workdir(path).checkpoints.is_dir():
                counts = SamplingRules.of(self.student_config(phase).model).step_counts
                found.update({count: path for count in counts})
        return found

    def train_phase(self, job: PhaseJob, state: TrainState, step: int) -> PhaseEnd:
        """Train ``job``'s phase from ``state`` at global ``step`` to its end or a stop; returns where it got."""
        phase, config, metrics = job.phase, job.config, MetricsBuffer()
        d = self.config.distill

        def ema_decay(step: int) -> float:  # as the step averages: warmed up from the phase's start
            return float(state_lib.ema_decay_at(step - 1 - phase.start, d.ema_decay, True))

        actions = [LogTrainMetrics(config, metrics, self.progress, ema_decay),
                   SaveCheckpoint(config, self.checkpointer, metrics)]
        if config.train.eval_every:
            spec = SamplingRules.of(config.model).defaults  # the student's own steps and sampler
            actions.append(SampleGrid(config, job.student, self.grid_rng, self.workdir, True, spec=spec))
        self.say(f"{phase.describe()}: steps {step + 1} to {phase.end}")
        started = time.perf_counter()

        def distill_step(state, batch):
            return job.step_fn(state, job.teacher_variables, batch, self.rng)

        try:
            stretch = run_steps(self, distill_step, state, job.batches(step), start_step=step, end_step=phase.end,
                                total_steps=phase.end, steps_per_epoch=self.steps_per_epoch, actions=actions,
                                metrics=metrics, mesh=self.mesh)
        finally:
            reached = self.reached_step
            if reached is not None and reached > step:  # this stretch of the phase, stopped or not
                append_record(Workdir(self.workdir).distill_file, {
                    "phase": phase.kind, "student_steps": phase.student_steps, "from_step": step,
                    "to_step": reached, "seconds": round(time.perf_counter() - started, 3),
                    "loss": metrics.last_mean.get("loss"), **run_fields(config.model.dtype)})
        return PhaseEnd(stretch.state, stretch.step or step, stretch.stopped, metrics.last_mean)

    def _export(self, phase: Phase, state: TrainState) -> Path:
        """Save ``state``, the end of ``phase``, as its student ``students/<N>`` (a checkpoint of its own)."""
        config = self.student_config(phase)
        target = self.student_dir(phase)
        checkpointer = Checkpointer(Workdir(target).checkpoints, keep=1)
        try:
            checkpointer.save(int(state.step), state_lib.state_to_dict(state), config)
        finally:
            checkpointer.close()
        steps = ", ".join(str(count) for count in SamplingRules.of(config.model).step_counts)
        if not phase.delivers_student:
            self.say(f"{phase.describe()} done: its student, where the next phase starts, is {target}")
            return target
        self.say(f"{phase.describe()} done: the student of {steps} step{'s' if steps != '1' else ''} is {target} "
                 f"(ddim sample --workdir {target})")
        return target

    def _ensure_exported(self, phase: Phase, state: TrainState | None, step: int) -> None:
        """A finished phase has its student; one missing (a stop between the last save and the export) is made
        from the resumed state when that is the phase's end."""
        if Workdir(self.student_dir(phase)).checkpoints.is_dir():
            return
        if step != phase.end or state is None:
            raise TrainingError(f"the {phase.student_name}-step student of this run is missing from "
                                f"{self.student_dir(phase)}; use another --workdir")
        self._export(phase, state)


TRAJECTORY_SETTINGS = ("trajectory_steps", "trajectory_learning_rate", "trajectory_rollout", "consistency_bank_size")
"""What only the trajectory phase of a progressive run reads: a run stopped or finished before that phase may add it,
or change it, and go on."""


def _resume(checkpointer: Checkpointer, config: Config, teacher, phases, mesh, warn) -> Resumed:
    """The state and step of the newest intact checkpoint, checked against this run's settings (those of a
    trajectory phase not begun yet may differ)."""
    rounds_end = phases[-1].start if phases[-1].kind == TRAJECTORY else phases[-1].end

    def restore(step: int):
        stored = checkpointer.restore_config(step)
        compared = stored.distill
        if config.distill.method == "progressive" and step <= rounds_end:
            compared = dataclasses.replace(compared, **{name: getattr(config.distill, name)
                                                        for name in TRAJECTORY_SETTINGS})
        if compared != config.distill:
            changed = next(f.name for f in dataclasses.fields(config.distill)
                           if getattr(compared, f.name) != getattr(config.distill, f.name))
            raise TrainingError(f"cannot resume {checkpointer.directory.parent}: distill.{changed} is "
                                f"{getattr(config.distill, changed)!r} but the run was started with "
                                f"{getattr(compared, changed)!r}; run the same command, or use another --workdir")
        phase = next(p for p in phases if p.start < step <= p.end)
        student = DiffusionModel(plan_lib.student_model(teacher, config, phase))
        # Any variables of the student's structure: the restore replaces their values.
        shapes = jax.eval_shape(lambda: init_variables(student, jax.random.key(0)))
        zeros = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), shapes)
        template = create_student_state(student, zeros, config, phase, jax.random.key(0), mesh)
        return state_lib.restore_train_state(checkpointer, step, template)

    found = checkpointer.restore(restore, warn=warn)
    return Resumed(None, 0) if found is None else Resumed(found[1], found[0])
