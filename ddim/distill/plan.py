"""What a distillation run does, worked out from its config and its teacher before anything is trained.

A run is a list of :class:`Phase`\\ s, each a span of optimiser steps with its own teacher and its own student.
Progressive distillation (``distill.method = "progressive"``):

- stage one (``"guidance"``), when the teacher is class-conditional or predicts another target than the
  student: the student learns the teacher's guided prediction with the guidance scale as an input (Meng et al.
  2023), at the times of the teacher's ``start_steps``-step grid; its student samples in ``start_steps`` steps;
- then one halving round (``"round"``) per factor 2 from ``start_steps`` down to ``end_steps`` (Salimans & Ho
  2022, Algorithm 2), each student starting from its teacher's weights;
- with ``distill.trajectory_steps``, a last phase (``"trajectory"``): the last round's student learns the run's
  teacher's own guided DDIM path, banked once (:mod:`ddim.distill.bank`), at its grid's times, instead of the two
  steps of its own teacher, a student itself: the exact path the chain started from, as Luhman & Luhman 2021 teach
  a student the teacher's ODE solutions. Its student is ``students/trajectory``.

Consistency distillation (``"consistency"``) is one phase whose student, started from the teacher's weights,
learns the consistency function of the teacher's guided probability-flow ODE, at continuous noise levels with a
gap that shrinks stage by stage (consistency tuning, Geng et al. 2024) or on its ``start_steps``-step grid (Song
et al. 2023, Algorithm 2), and samples in any of ``distill.student_steps`` steps. With
``distill.consistency_midtraining_steps``, consistency mid-training (``"midtraining"``, Hu et al. 2025) comes
first: the same student, started from the teacher's weights, learns to map the points of banked trajectories of
the teacher's guided ODE to their ends; its student (``students/midtraining``) is where the consistency phase
starts, which still distils the run's teacher and writes the run's one student.

The global step counts on across phases, so a checkpoint's step says which phase it belongs to and resuming is
exact. JAX-free, so the command line checks a plan before it loads anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ddim.config import Config, ConfigError, ModelConfig

GUIDANCE_STAGE = "guidance"
ROUND = "round"
CONSISTENCY = "consistency"
MIDTRAINING = "midtraining"
TRAJECTORY = "trajectory"


@dataclass(frozen=True)
class Phase:
    """One span of a distillation run: ``kind``, the student's (default) step count, its optimiser steps
    ``(start, end]``, and the grid whose times it trains at."""

    kind: str
    student_steps: int
    start: int
    end: int
    grid_steps: int
    """The steps of the uniform grid whose times are trained: the student's in a round, the teacher's
    ``start_steps`` in stage one, in consistency mid-training and in consistency distillation (the trajectory
    phase: the banked path's, at the student's times)."""

    @property
    def teacher_steps(self) -> int:
        """The step count of the teacher's grid the student learns from (twice the student's in a round)."""
        return 2 * self.student_steps if self.kind == ROUND else self.grid_steps

    @property
    def optimizer_steps(self) -> int:
        return self.end - self.start

    @property
    def student_name(self) -> str:
        """The student's folder under ``students/``: its step count, or ``consistency`` (one student, several
        counts), ``midtraining`` (the weights consistency distillation starts from) or ``trajectory`` (the last
        round's student tuned on the teacher's path)."""
        return self.kind if self.kind in (CONSISTENCY, MIDTRAINING, TRAJECTORY) else str(self.student_steps)

    @property
    def delivers_student(self) -> bool:
        """Whether the phase's student is one of the run's results; a mid-trained one is a starting point."""
        return self.kind != MIDTRAINING

    def describe(self) -> str:
        if self.kind == GUIDANCE_STAGE:
            return f"stage one: the teacher at {self.student_steps} steps, guidance in one pass per step"
        if self.kind == CONSISTENCY:
            return "consistency distillation"
        if self.kind == MIDTRAINING:
            return f"consistency mid-training on the teacher's {self.grid_steps}-step trajectories"
        if self.kind == TRAJECTORY:
            return f"the {self.student_steps}-step student on the teacher's {self.grid_steps}-step trajectories"
        return f"round {self.teacher_steps} -> {self.student_steps} step{'s' if self.student_steps > 1 else ''}"


def needs_guidance_stage(teacher: ModelConfig, config: Config) -> bool:
    """Whether stage one runs: a guidance scale to fold in (a progressive student takes it as an input already),
    or a prediction target to change."""
    return (teacher.class_conditional and not teacher.guidance_input) or teacher.prediction != config.distill.prediction


def check_teacher(teacher: ModelConfig, where: str, config: Config | None = None) -> None:
    """A teacher is a diffusion model (any step count), or in progressive distillation a progressive student,
    whose halving rounds go on from its step count (Salimans & Ho 2022: each round's teacher is the last round's
    student); else :class:`ConfigError`. ``config``: the run's, checked against such a student."""
    if not teacher.distilled_steps:
        return
    steps = teacher.distilled_steps
    if config is not None and config.distill.trajectory_steps:
        raise ConfigError(f"{where} is a distilled student ({steps} steps), and distill.trajectory_steps banks the "
                          "diffusion model's own path: distil from that model, or set distill.trajectory_steps=0")
    if teacher.distilled_sampler == CONSISTENCY or config is None or config.distill.method == CONSISTENCY:
        raise ConfigError(f"{where} is a distilled student ({steps} steps), not a diffusion model; distil from the "
                          "model it was distilled from, or resume its own work directory")
    d = config.distill
    if d.start_steps != steps:
        raise ConfigError(f"{where} is a progressive student of {steps} steps, and its rounds go on from there: set "
                          f"distill.start_steps={steps}")
    if d.prediction != teacher.prediction:
        raise ConfigError(f"{where} is a progressive student that predicts {teacher.prediction}, which its rounds "
                          f"keep: set distill.prediction=\"{teacher.prediction}\"")
    if teacher.guidance_input:
        low, high = teacher.guidance_range
        if not low <= d.guidance_min <= d.guidance_max <= high:
            raise ConfigError(f"{where} is a progressive student distilled for guidance {low:g} to {high:g}: "
                              "distill.guidance_min and distill.guidance_max must lie within them")


def plan(teacher: ModelConfig, config: Config) -> list[Phase]:
    """The phases of distilling ``teacher`` with ``config.distill`` (validated by :func:`ddim.config.validate`)."""
    d = config.distill
    if d.method == CONSISTENCY:
        steps, midtraining = max(d.student_steps), d.consistency_midtraining_steps
        phases = [Phase(MIDTRAINING, steps, 0, midtraining, d.start_steps)] if midtraining else []
        return [*phases, Phase(CONSISTENCY, steps, midtraining, midtraining + d.consistency_steps, d.start_steps)]
    phases, step = [], 0
    if needs_guidance_stage(teacher, config):
        if not d.first_stage_steps:
            raise ConfigError("distill.first_stage_steps is 0, but this teacher needs stage one (it is "
                              "class-conditional or predicts another target than distill.prediction)")
        phases.append(Phase(GUIDANCE_STAGE, d.start_steps, step, step + d.first_stage_steps, d.start_steps))
        step += d.first_stage_steps
    steps = d.start_steps // 2
    while steps >= d.end_steps:
        phases.append(Phase(ROUND, steps, step, step + d.round_steps, steps))
        step += d.round_steps
        steps //= 2
    if d.trajectory_steps:
        phases.append(Phase(TRAJECTORY, d.end_steps, step, step + d.trajectory_steps, d.start_steps))
    return phases


def student_model(teacher: ModelConfig, config: Config, phase: Phase, teacher_name: str = "") -> ModelConfig:
    """The student's model config in ``phase``: the teacher's network with the student's target, step counts and
    sampler, its teacher's name (``teacher_name``, when given), and, for a class-conditional teacher, the guidance
    scale as an input over the distilled range."""
    d = config.distill
    guided = teacher.class_conditional
    consistency = phase.kind in (CONSISTENCY, MIDTRAINING)  # a mid-trained student samples as the final one
    # Without stage one the teacher already predicts distill.prediction (needs_guidance_stage).
    return dataclasses.replace(
        teacher,
        prediction=d.prediction,
        guidance_input=guided,
        guidance_range=(d.guidance_min, d.guidance_max) if guided else (),
        distilled_steps=phase.student_steps,
        distilled_sampler=CONSISTENCY if consistency else "ddim",
        distilled_step_counts=tuple(sorted(d.student_steps)) if consistency else (),
        # A student halved further still names the diffusion model at the start of the chain (what it cannot do
        # itself, such as inverting images, needs that model).
        distilled_from=(teacher.distilled_from or teacher_name) if teacher.distilled_steps else teacher_name,
    )


def student_config(config: Config, phase: Phase, teacher_name: str = "") -> Config:
    """The config stored with the students of ``phase``: the run's (whose model is the teacher's), with the
    student's model."""
    return dataclasses.replace(config, model=student_model(config.model, config, phase, teacher_name))
