"""``[distill]``: the settings of ``ddim distill`` (docs/distillation.md)."""

from __future__ import annotations

from dataclasses import dataclass

from ddim.config.parsing import ConfigError, at_least, choice

METHODS = ("progressive", "consistency")
CONSISTENCY_TIMES = ("continuous", "grid", "tangent")
CONSISTENCY_LEVELS = ("log-normal", "schedule")
CONSISTENCY_PAIRS = ("teacher", "data")
CONSISTENCY_LOSSES = ("pseudo-huber", "squared")
CONSISTENCY_WEIGHTINGS = ("inverse-gap", "uniform")


@dataclass(frozen=True)
class DistillConfig:
    """``ddim distill``: progressive distillation (Salimans & Ho 2022, Algorithm 2) of a teacher into few-step
    students, with the guidance scale folded into the student first for class-conditional teachers (Meng et al.
    2023, stage one), or consistency distillation into one student of 1, 2 or 4 steps (Song et al. 2023's Algorithm 2 by default;
    consistency tuning, Geng et al. 2024, with ``consistency_times = "continuous"``, ``consistency_loss =
    "pseudo-huber"`` and ``consistency_weighting = "inverse-gap"``). Defaults follow the papers' reference code (google-research ``diffusion_distillation``,
    ``cifar_distill.py``; openai ``consistency_models_cifar10``) where it fits a CPU-sized run; see
    docs/distillation.md."""

    method: str = "progressive"
    """"progressive": halving rounds, one student per step count (``ddim distill --method progressive``);
    "consistency": one student that samples in any of ``student_steps`` (``--method consistency``)."""
    start_steps: int = 32
    """The teacher's DDIM step count: its deterministic DDIM sample on the uniform grid of this many steps is what
    the students learn to reproduce in fewer. Progressive: the first round starts from it; consistency on the grid:
    the grid of the ODE steps whose ends the student learns to map to the same image (unused with continuous
    times)."""
    end_steps: int = 1
    """The last round's student step count; start_steps / end_steps must be a power of 2 (rounds halve)."""
    round_steps: int = 2000
    """Optimiser steps per halving round (the reference: 50,000 at batch 128 on TPUs)."""
    trajectory_steps: int = 0
    """Progressive: optimiser steps of a last phase ("trajectory") in which the last round's student learns the
    run's teacher's own guided DDIM path at its grid's times instead of its own teacher's two steps (the image
    whose DDIM step lands on the path's next point of the student's grid, the path's end at the last), so the
    rounds' errors stop adding up; the path is banked once as for consistency mid-training (consistency_bank_size
    trajectories of start_steps steps). 0: none. Its student is ``students/trajectory``. A run stopped or finished
    before it may add it: the same command with this set goes on from the last round."""
    trajectory_learning_rate: float = 1e-4
    """Adam's learning rate at the start of the trajectory phase, decayed linearly to 0 at its end; its own
    setting, so that a finished run adding the phase may choose it."""
    trajectory_rollout: float = 0.0
    """Trajectory phase: the weight of a second term, the squared error of the student's own deterministic sample
    (all its steps from the path's noise, differentiated through) against the path's end, so that its later steps
    learn from its earlier steps' outputs rather than from the teacher's path alone. Each step then costs the
    student's step count more network passes. 0: the path's points only."""
    first_stage_steps: int = 2000
    """Optimiser steps of stage one: the student learns the teacher's guided prediction at start_steps' times,
    with the guidance scale as an input (Meng et al. 2023) and in its own prediction target. Only run when the
    teacher is class-conditional or predicts another target than the student; else round one starts from the
    teacher."""
    prediction: str = "velocity"
    """The student's prediction target: "velocity" (v = alpha eps - sigma x_0) or "image" (x_0; the reference's
    choice). Not "noise": a noise prediction divides by the signal rate to give the image, which at one step
    (signal rate 0.02) magnifies its error fifty-fold (Salimans & Ho 2022, section 4)."""
    learning_rate: float = 1e-4
    """Adam's learning rate at the start of every round, decayed linearly to 0 at its end (the reference: 5e-5
    over 50,000 steps; shorter rounds take a larger one)."""
    batch_size: int = 64
    """Images per optimiser step."""
    grad_clip: float = 1.0
    """Clip the gradient's global norm to this (the reference: 1); 0: no clipping."""
    ema_decay: float = 0.0
    """Decay of the student's weight average used as the next teacher and for sampling; 0 uses the weights
    themselves (the reference: 0, as the learning rate decays to 0 in every round). It warms up at every phase's
    start, min(ema_decay, (1 + n) / (10 + n)) after n of its steps, so no phase keeps its predecessor's weights."""
    guidance_min: float = 0.0
    """Class-conditional teachers: the lowest guidance scale the student learns (0: the unconditional model)."""
    guidance_max: float = 4.0
    """Class-conditional teachers: the highest guidance scale the student learns (Meng et al.: w in [0, 4] on
    ImageNet 64, their w being this project's scale minus 1)."""
    label_dropout: float = 0.1
    """Class-conditional teachers: the share of images distilled with the null class, so the student keeps the
    unconditional prediction that the verbs without a class use (the teacher's own train.label_dropout)."""
    consistency_steps: int = 10000
    """Consistency: optimiser steps of its one phase."""
    student_steps: tuple[int, ...] = (1, 2, 4)
    """Consistency: the step counts the student samples with (multistep consistency sampling on the uniform grid
    of that many steps); each must divide start_steps. The largest is its default."""
    guidance_sampling: str = "focused"
    """How the guidance scales of stage one (progressive) and of consistency distillation are drawn: "uniform" on
    [guidance_min, guidance_max] (Meng et al. 2023), or "focused": half of them uniform there, half uniform on
    guidance_focus. The guided target's distance from the plain one grows as (scale - 1)^2, so uniform draws
    spend most of the training on the largest scales, while people sample at 1 to 2 (the bundled models' best
    FID at 1.5)."""
    guidance_focus: tuple[float, ...] = (1.0, 2.0)
    """With guidance_sampling "focused": the [lowest, highest] scale half of the draws come from; within
    [guidance_min, guidance_max]."""
    consistency_times: str = "grid"
    """Consistency: where the pairs of points lie. "grid": neighbours on the teacher's ``start_steps``-step uniform
    grid (Song et al. 2023, Algorithm 2); "continuous": a noise level drawn from a log-normal and a second one a gap
    below it that shrinks stage by stage (consistency tuning, Geng et al. 2024, ECT); "tangent": the gap taken to
    zero, the student's tangent along the ODE at a level drawn as "continuous" draws it (continuous-time consistency
    distillation, Lu & Song 2024, sCD; with consistency_pair "data", their sCT), its own loss in place of
    consistency_loss and consistency_weighting. The defaults of the
    ``consistency_*`` settings are Song et al.'s recipe, which scored best at every pass count against consistency
    tuning and each of its parts at equal CPU time (docs/research/consistency-tuning.md)."""
    consistency_pair: str = "teacher"
    """Consistency: how the pair's second point is made. "teacher": one step of the guided teacher's ODE from the
    first (distillation; the guidance scale an input); "data": the same image and noise at the second level (ECT's
    tuning: no teacher in the step, so no guidance to learn; the student is trained at guidance 1)."""
    consistency_loss: str = "squared"
    """Consistency: "squared" (the mean squared error) or "pseudo-huber" (iCT: sqrt(|d|^2 + c^2) - c per image)."""
    consistency_weighting: str = "uniform"
    """Consistency: "uniform" weighs all pairs alike; "inverse-gap" weighs a pair by 1 / (t - r), its levels' gap
    (ECT)."""
    consistency_gap_base: float = 2.0
    """Consistency with continuous times: q, the gap is the level's n(t) / q^(s + 1) at stage s (ECT: 2)."""
    consistency_stage_steps: int = 2000
    """Consistency with continuous times: optimiser steps per stage of the gap (ECT: 25,000 at batch 128 on
    CIFAR-10, for 400,000 steps; a CPU run of 16,000 steps takes eight stages' worth at its scale)."""
    consistency_first_stage: int = 1
    """Consistency with continuous times: the stage the run starts at. ECT's authors advise skipping stage 0 (its
    pairs reach the boundary at low noise: plain diffusion training) when the student starts from a diffusion
    model, as here."""
    consistency_levels: str = "log-normal"
    """Consistency with continuous times: how the first level of a pair is drawn. "log-normal": ln t from a normal
    (iCT, ECT), most draws at low noise; "schedule": uniformly in the schedule's time, so every stretch of the path
    the samplers step along is trained alike (the grid recipe's share, continuous), the noisiest end too, where
    sampling in one pass evaluates the student."""
    consistency_time_mean: float = -0.4
    """Consistency with continuous times: the mean of ln t (ECT's -1.1 on EDM's levels, whose data has standard
    deviation 0.5: -1.1 + ln 2 on this project's unit-variance levels)."""
    consistency_time_std: float = 2.0
    """Consistency with continuous times: the standard deviation of ln t (ECT: 2.0)."""
    consistency_huber_c: float = 0.00108
    """Consistency with the pseudo-Huber loss: c over sqrt(d), d the image's numbers (H x W x C): iCT's 0.00054 for
    data in [-1, 1], doubled for this project's unit-variance data (c = 0.06 at 32x32)."""
    consistency_tangent_warmup: int = 200
    """Consistency with tangent times: optimiser steps over which the tangent's second term (the student's own
    derivative along the path) ramps from 0 to its full weight (sCM's tangent warm-up: 10,000 of their
    iterations; scaled to a CPU run's length)."""
    consistency_tangent_c: float = 0.1
    """Consistency with tangent times: the tangent is divided by its norm plus this (sCM's tangent normalisation,
    c = 0.1), which bounds its size when the derivative through the network is large."""
    consistency_midtraining_steps: int = 0
    """Consistency: optimiser steps of consistency mid-training (Hu et al. 2025, CMT) before consistency
    distillation; 0: none. The student, started from the teacher's weights, learns to map every point of banked
    trajectories of the guided teacher's ODE (its DDIM path on the ``start_steps``-step grid) to the trajectory's
    end, and consistency distillation starts from the mid-trained weights (ddim/distill/plan.py)."""
    consistency_bank_size: int = 2048
    """Consistency mid-training and the trajectory phase: the teacher's trajectories banked once, before they
    train, in ``<out>/trajectories.npz``: ``start_steps`` points each in float16 and the end image, 200 MB for 2048
    trajectories of 16 steps at 32x32; the teacher's cost is ``start_steps`` guided passes per trajectory. Solved
    in parts that a stopped run keeps (``<out>/trajectories.parts/``), so Ctrl-C while banking loses about a minute.
    At least ``batch_size``."""
    seed: int = 0
    """Seed of the data order, noise, times, guidance scales and banked trajectories."""


def validate_distill(d: DistillConfig) -> None:
    """Check the relations between ``[distill]`` values that types alone cannot express."""
    choice("distill.method", d.method, METHODS)
    at_least(1, {"distill.start_steps": d.start_steps, "distill.end_steps": d.end_steps,
                 "distill.round_steps": d.round_steps, "distill.batch_size": d.batch_size,
                 "distill.consistency_steps": d.consistency_steps})
    at_least(0, {"distill.first_stage_steps": d.first_stage_steps,
                 "distill.consistency_midtraining_steps": d.consistency_midtraining_steps,
                 "distill.trajectory_steps": d.trajectory_steps})
    choice("distill.prediction", d.prediction, ("velocity", "image"))
    choice("distill.guidance_sampling", d.guidance_sampling, ("uniform", "focused"))
    if d.method == "consistency":
        _validate_consistency(d)
    else:
        _validate_halving(d)
        if d.consistency_midtraining_steps:
            raise ConfigError(f"distill.consistency_midtraining_steps is for distill.method \"consistency\" "
                              f"(mid-training comes before consistency distillation), not {d.method!r}; set it to 0")
    if d.trajectory_steps and d.method != "progressive":
        raise ConfigError(f"distill.trajectory_steps is for distill.method \"progressive\" (it tunes the last "
                          f"round's student), not {d.method!r}; set it to 0")
    if d.trajectory_steps and d.consistency_bank_size < d.batch_size:
        raise ConfigError(f"distill.consistency_bank_size ({d.consistency_bank_size}) must be at least "
                          f"distill.batch_size ({d.batch_size}): the trajectory phase draws its batches from the bank")
    if d.trajectory_rollout < 0 or d.trajectory_rollout and not d.trajectory_steps:
        raise ConfigError(f"distill.trajectory_rollout weighs a term of the trajectory phase: it must be >= 0, and 0 "
                          f"without distill.trajectory_steps; got {d.trajectory_rollout}")
    for name, rate in (("learning_rate", d.learning_rate), ("trajectory_learning_rate", d.trajectory_learning_rate)):
        if not rate > 0:
            raise ConfigError(f"distill.{name} must be > 0, got {rate}")
    if d.grad_clip < 0:
        raise ConfigError(f"distill.grad_clip must be >= 0, got {d.grad_clip}")
    if not 0.0 <= d.ema_decay < 1.0:
        raise ConfigError(f"distill.ema_decay must be in [0, 1), got {d.ema_decay}")
    if not 0.0 <= d.guidance_min <= d.guidance_max:
        raise ConfigError(f"need 0 <= distill.guidance_min <= distill.guidance_max, got {d.guidance_min} and "
                          f"{d.guidance_max}")
    focus = d.guidance_focus
    inside = len(focus) == 2 and d.guidance_min <= focus[0] <= focus[1] <= d.guidance_max
    if d.guidance_sampling == "focused" and not inside:
        raise ConfigError(f"distill.guidance_focus must be [lowest, highest] within distill.guidance_min and "
                          f"distill.guidance_max ({d.guidance_min:g} to {d.guidance_max:g}), got {list(focus)}")
    if not 0.0 <= d.label_dropout < 1.0:
        raise ConfigError(f"distill.label_dropout must be in [0, 1), got {d.label_dropout}")


def _validate_halving(d: DistillConfig) -> None:
    ratio = d.start_steps // d.end_steps
    if d.start_steps % d.end_steps or ratio < 2 or ratio & (ratio - 1):
        reachable = ", ".join(str(d.start_steps >> k) for k in range(1, d.start_steps.bit_length())
                              if d.start_steps % (1 << k) == 0)
        raise ConfigError(f"distill.end_steps ({d.end_steps}) is not reachable by halving distill.start_steps "
                          f"({d.start_steps}); reachable: {reachable or 'none (start_steps is odd)'}")


def _validate_consistency(d: DistillConfig) -> None:
    choice("distill.consistency_times", d.consistency_times, CONSISTENCY_TIMES)
    choice("distill.consistency_pair", d.consistency_pair, CONSISTENCY_PAIRS)
    choice("distill.consistency_levels", d.consistency_levels, CONSISTENCY_LEVELS)
    choice("distill.consistency_loss", d.consistency_loss, CONSISTENCY_LOSSES)
    choice("distill.consistency_weighting", d.consistency_weighting, CONSISTENCY_WEIGHTINGS)
    at_least(1, {"distill.consistency_stage_steps": d.consistency_stage_steps})
    at_least(0, {"distill.consistency_first_stage": d.consistency_first_stage})
    if not d.consistency_gap_base > 1.0:
        raise ConfigError(f"distill.consistency_gap_base must be > 1 (the gap shrinks by it every stage), got "
                          f"{d.consistency_gap_base}")
    at_least(0, {"distill.consistency_tangent_warmup": d.consistency_tangent_warmup})
    if not d.consistency_tangent_c > 0.0:
        raise ConfigError(f"distill.consistency_tangent_c must be > 0, got {d.consistency_tangent_c}")
    if d.consistency_times == "tangent" and (d.consistency_loss, d.consistency_weighting) != ("squared", "uniform"):
        raise ConfigError('distill.consistency_times "tangent" has its own loss (the tangent\'s, Lu & Song 2024): '
                          'leave distill.consistency_loss "squared" and distill.consistency_weighting "uniform"')
    if not d.consistency_time_std > 0.0:
        raise ConfigError(f"distill.consistency_time_std must be > 0, got {d.consistency_time_std}")
    if d.consistency_huber_c < 0.0:
        raise ConfigError(f"distill.consistency_huber_c must be >= 0, got {d.consistency_huber_c}")
    if d.consistency_midtraining_steps and d.consistency_bank_size < d.batch_size:
        raise ConfigError(f"distill.consistency_bank_size ({d.consistency_bank_size}) must be at least "
                          f"distill.batch_size ({d.batch_size}): mid-training draws its batches from the bank")
    counts = d.student_steps
    if not counts or any(count < 1 or d.start_steps % count for count in counts) or len(set(counts)) < len(counts):
        divisors = ", ".join(str(n) for n in range(1, d.start_steps + 1) if d.start_steps % n == 0)
        raise ConfigError(f"distill.student_steps must be different step counts that divide distill.start_steps "
                          f"({d.start_steps}: {divisors}), got {list(counts)}")
    if d.prediction != "velocity":
        raise ConfigError('distill.method "consistency" needs distill.prediction "velocity": the velocity '
                          "parameterisation is what makes the student return its input at noise 0")
