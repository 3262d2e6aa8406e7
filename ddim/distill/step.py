"""The student's train state and the jitted distillation steps: one optimiser step, nothing around it.

The state is :class:`ddim.train.state.TrainState`, so a student's checkpoint is an ordinary checkpoint that every
verb loads. Each phase starts a fresh state from its teacher's weights (:func:`create_student_state`; consistency
distillation after mid-training from the mid-trained student's) with a fresh Adam whose learning rate decays
linearly to 0 over the phase, as the reference code does, and a weight average that warms up from the phase's
start (so none of the previous phase's weights stay in it). Mid-training's step (:func:`midtraining_step`) reads
banked trajectories instead of images and has no teacher in it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from ddim import compilation, diffusion, ops, parallel
from ddim.config import Config, ConfigError, DistillConfig
from ddim.distill import targets
from ddim.distill import targets_consistency as consistency
from ddim.distill.plan import CONSISTENCY, GUIDANCE_STAGE, MIDTRAINING, TRAJECTORY, Phase
from ddim.model import DiffusionModel, bind_denoiser, init_variables, normalize
from ddim.train.state import TrainState, class_condition, to_float, update_ema


def optimizer(settings: DistillConfig, phase: Phase) -> optax.GradientTransformation:
    """Adam from the phase's learning rate (``trajectory_learning_rate`` for the trajectory phase, else
    ``learning_rate``) decayed linearly to 0 over its steps, after clipping the gradient's norm (the reference's
    ``learning_rate_anneal_type = "linear"``, no weight decay)."""
    rate = settings.trajectory_learning_rate if phase.kind == TRAJECTORY else settings.learning_rate
    adam = optax.adam(optax.linear_schedule(rate, 0.0, max(phase.optimizer_steps, 1)))
    return optax.chain(optax.clip_by_global_norm(settings.grad_clip), adam) if settings.grad_clip > 0 else adam


def student_variables(student: DiffusionModel, teacher_variables: dict[str, Any], rng) -> dict[str, Any]:
    """The teacher's variables in the student's structure: every teacher weight kept, the student's new ones (the
    guidance embedding, initialised to zero output) from their initialisers."""
    init = jax.jit(functools.partial(init_variables, student))
    fresh = jax.device_get(compilation.compile_for_one_call(init, rng)(rng))
    merged = {}
    for collection in ("params", "batch_stats"):
        given = traverse_util.flatten_dict(jax.device_get(teacher_variables[collection]))
        new = traverse_util.flatten_dict(fresh[collection])
        for key, value in given.items():
            if key not in new or new[key].shape != value.shape:
                raise ConfigError(f"the teacher's weight {'/'.join(key)} does not fit the student's network")
        merged[collection] = traverse_util.unflatten_dict({key: given.get(key, value) for key, value in new.items()})
    return merged


def create_student_state(student: DiffusionModel, teacher_variables, config: Config, phase: Phase, rng,
                         mesh=None) -> TrainState:
    """A phase's first state: the teacher's weights, a fresh optimiser, the global step ``phase.start``."""
    variables = student_variables(student, teacher_variables, rng)
    params = jax.tree.map(jnp.asarray, variables["params"])
    batch_stats = jax.tree.map(jnp.asarray, variables["batch_stats"])
    state = TrainState.create(
        apply_fn=student.apply, params=params, tx=optimizer(config.distill, phase),
        batch_stats=batch_stats, ema_params=jax.tree.map(jnp.copy, params),
        ema_batch_stats=jax.tree.map(jnp.copy, batch_stats),
    )
    state = state.replace(step=jnp.asarray(phase.start, jnp.int32))
    return parallel.replicate(state, mesh or parallel.data_mesh())


@dataclass(frozen=True)
class ConsistencySettings:
    """How consistency distillation makes and scores its pairs (``distill.consistency_*``; static under ``jit``)."""

    continuous: bool
    """Continuous levels with a shrinking gap (ECT); else neighbours on the teacher's grid (Song et al. 2023)."""
    tangent: bool
    """The gap taken to zero: the tangent along the path (Lu & Song 2024, sCD); levels drawn as ``continuous``."""
    tangent_warmup: int
    """Steps over which the tangent's second term ramps in (``distill.consistency_tangent_warmup``)."""
    tangent_c: float
    """The tangent normalisation's constant (``distill.consistency_tangent_c``)."""
    teacher_pair: bool
    """The second point from the guided teacher's ODE step; else the same image and noise (ECT's tuning)."""
    huber_c: float | None
    """The pseudo-Huber constant; None: the squared error."""
    inverse_gap: bool
    gap_base: float
    stage_steps: int
    first_stage: int
    schedule_levels: bool
    """First levels uniform in the schedule's time; else log-normal with ``time_mean`` and ``time_std``."""
    time_mean: float
    time_std: float

    @classmethod
    def of(cls, d: DistillConfig, image_shape: tuple[int, ...]) -> "ConsistencySettings":
        numbers = 1
        for size in image_shape:
            numbers *= size
        huber = d.consistency_huber_c * numbers ** 0.5 if d.consistency_loss == "pseudo-huber" else None
        return cls(d.consistency_times == "continuous", d.consistency_times == "tangent",
                   d.consistency_tangent_warmup, d.consistency_tangent_c, d.consistency_pair == "teacher", huber,
                   d.consistency_weighting == "inverse-gap", d.consistency_gap_base, d.consistency_stage_steps,
                   d.consistency_first_stage, d.consistency_levels == "schedule", d.consistency_time_mean,
                   d.consistency_time_std)


@dataclass(frozen=True)
class StepSettings:
    """What a distillation step is specialised on (static under ``jit``)."""

    student: DiffusionModel
    teacher: DiffusionModel
    kind: str
    grid_steps: int
    """The steps of the grid whose times are trained (:attr:`ddim.distill.plan.Phase.grid_steps`)."""
    conditional: bool
    guidance_min: float
    guidance_max: float
    guidance_focus: tuple[float, ...]
    """Half of the scales drawn from this range (``distill.guidance_sampling = "focused"``); empty: uniform."""
    label_dropout: float
    ema_decay: float
    phase_start: int
    """The global step the phase starts at: the weight average warms up from there."""
    consistency: ConsistencySettings | None = None
    """Consistency distillation's pairs and loss; None in the other phases."""
    trajectory_rollout: float = 0.0
    """The trajectory phase's weight of the student's own sample against the path's end (0 in the other phases)."""

    @classmethod
    def of(cls, student: DiffusionModel, teacher: DiffusionModel, config: Config, phase: Phase) -> "StepSettings":
        d = config.distill
        focus = tuple(d.guidance_focus) if d.guidance_sampling == "focused" else ()
        m = student.config
        consistency = (ConsistencySettings.of(d, (m.image_size, m.image_size, m.channels))
                       if phase.kind == CONSISTENCY else None)
        return cls(student, teacher, phase.kind, phase.grid_steps, m.class_conditional, d.guidance_min,
                   d.guidance_max, focus, d.label_dropout, d.ema_decay, phase.start, consistency,
                   d.trajectory_rollout if phase.kind == TRAJECTORY else 0.0)


def distill_step(state: TrainState, teacher_variables, batch, rng, settings: StepSettings):
    """One optimiser step of the student on a batch ``{"image", "label"}``; returns the new state and its loss.

    The batch's images are noised at a time of the phase's grid; the target is the teacher's guided prediction
    (stage one) or the image of its two DDIM steps (a round), both from :mod:`ddim.distill.targets`, and the loss
    their truncated-SNR-weighted squared error; in consistency distillation (:func:`consistency_loss_fn`) the
    target is the student's own consistency function (its weights without gradient) at the pair's second point.
    A class-conditional student gets each image's class (a ``label_dropout`` share of them the null class) and a
    guidance scale drawn from the distilled range, and its teacher the same.
    """
    rng = jax.random.fold_in(rng, state.step)
    noise_rng, time_rng, guidance_rng, label_rng = jax.random.split(rng, 4)
    teacher = settings.teacher
    images = normalize(teacher, teacher_variables, to_float(batch["image"]))
    batch_size = images.shape[0]
    noises = jax.random.normal(noise_rng, images.shape, jnp.float32)
    cond = None
    if settings.conditional:
        cond = class_condition(batch, label_rng, settings.label_dropout)
        data_pair = settings.consistency is not None and not settings.consistency.teacher_pair
        # Without a teacher in the step there is no guided target: the student learns the plain model (scale 1).
        cond["guidance"] = (jnp.ones((batch_size,), jnp.float32) if data_pair else
                            targets.guidance_scales(guidance_rng, batch_size, settings.guidance_min,
                                                    settings.guidance_max, settings.guidance_focus))
    teacher_denoise = bind_denoiser(teacher, teacher_variables)

    def teach(z, rates_noise, rates_signal):
        return teacher_denoise(z, rates_noise, rates_signal, cond)

    def student(params):
        denoise = bind_denoiser(settings.student, {"params": params, "batch_stats": state.batch_stats})
        return lambda z, rates_noise, rates_signal: denoise(z, rates_noise, rates_signal, cond)

    if settings.kind == CONSISTENCY:
        loss_fn = consistency_loss_fn(settings, state, teach, student, images, noises, time_rng)
    else:
        index, times = targets.grid_times(time_rng, batch_size, settings.grid_steps)
        schedule = settings.student.objective.schedule
        noise_rates, signal_rates = schedule(times)
        noisy = diffusion.add_noise(images, noises, noise_rates, signal_rates)
        if settings.kind == GUIDANCE_STAGE:
            _, target = teach(noisy, noise_rates, signal_rates)
        else:
            target = targets.progressive_target(teach, schedule, noisy, index, times, settings.grid_steps)
        target = jax.lax.stop_gradient(target)

        def loss_fn(params):
            _, predicted = student(params)(noisy, noise_rates, signal_rates)
            return targets.truncated_snr_loss(predicted, target, noise_rates, signal_rates)

    return optimiser_step(state, loss_fn, settings)


def midtraining_step(state: TrainState, teacher_variables, batch, rng, settings: StepSettings):
    """One optimiser step of consistency mid-training on banked points ``{"state", "index", "end", "label",
    "guidance"}`` (:mod:`ddim.distill.bank`): the student's consistency function at each state, at ``t_n = index /
    grid_steps`` with its trajectory's class and guidance scale, against the trajectory's end
    (:func:`~ddim.distill.targets_consistency.midtraining_loss`). The bank holds everything: ``teacher_variables``
    and ``rng`` are unused, the arguments of :func:`distill_step` so that one loop runs both."""
    times = (batch["index"].astype(jnp.float32) / settings.grid_steps).reshape(-1, 1, 1, 1)
    rates = settings.student.objective.schedule(times)
    cond = {"label": batch["label"], "guidance": batch["guidance"]} if settings.conditional else None

    def loss_fn(params):
        denoise = bind_denoiser(settings.student, {"params": params, "batch_stats": state.batch_stats})
        predicted = consistency.consistency_function(
            lambda z, noise_rates, signal_rates: denoise(z, noise_rates, signal_rates, cond), batch["state"], *rates)
        return consistency.midtraining_loss(predicted, batch["end"])

    return optimiser_step(state, loss_fn, settings)


def trajectory_step(state: TrainState, teacher_variables, batch, rng, settings: StepSettings):
    """One optimiser step of the trajectory phase on banked points ``{"state", "next", "index", "label",
    "guidance"}`` (:func:`ddim.distill.bank.grid_batches`): the student's image prediction at each point, a time
    ``index / N`` of its ``N``-step grid, against :func:`~ddim.distill.targets.trajectory_target` (the image whose
    DDIM step lands on the path's next point, the path's end at the last time), with the truncated-SNR weighting
    of the rounds; with ``trajectory_rollout``, plus that weight times :func:`~ddim.distill.targets.rollout_loss`
    of the student's own sample of each path's noise. The bank holds everything: ``teacher_variables`` and ``rng``
    are unused, as in mid-training."""
    student_steps = settings.student.config.distilled_steps
    times = (batch["index"].astype(jnp.float32) / student_steps).reshape(-1, 1, 1, 1)
    schedule = settings.student.objective.schedule
    rates_t, rates_s = schedule(times), schedule(times - 1.0 / student_steps)
    target = targets.trajectory_target(batch["state"], rates_t, batch["next"], rates_s, batch["index"] == 1)
    cond = {"label": batch["label"], "guidance": batch["guidance"]} if settings.conditional else None

    def loss_fn(params):
        denoise = bind_denoiser(settings.student, {"params": params, "batch_stats": state.batch_stats})
        _, predicted = denoise(batch["state"], *rates_t, cond)
        loss = targets.truncated_snr_loss(predicted, target, *rates_t)
        if settings.trajectory_rollout:
            sample = targets.student_sample(lambda z, noise_rates, signal_rates: denoise(
                z, noise_rates, signal_rates, cond), schedule, batch["noise"], student_steps)
            loss = loss + settings.trajectory_rollout * targets.rollout_loss(sample, batch["end"])
        return loss

    return optimiser_step(state, loss_fn, settings)


def optimiser_step(state: TrainState, loss_fn, settings: StepSettings):
    """``loss_fn``'s gradient at the student's weights applied, then the weight average; ``(state, {"loss"})``."""
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    new_state = state.apply_gradients(grads=grads)
    # Warm-up from the phase's start: min(decay, (1 + n) / (10 + n)) after n steps of the phase.
    new_state = update_ema(new_state, state.step - settings.phase_start, settings.ema_decay, warmup=True)
    return new_state, {"loss": loss}


def consistency_loss_fn(settings: StepSettings, state: TrainState, teach, student, images, noises, rng):
    """The loss of a consistency step as a function of the student's parameters: the student's ``f(z_t, t)``
    against its own ``f(z_r, r)`` without gradient (the target network is the student itself, as in iCT and ECT),
    ``(t, r)`` neighbours on the teacher's grid or continuous levels a shrinking gap apart, ``z_r`` from the guided
    teacher's ODE step or from the same image and noise (:mod:`ddim.distill.targets_consistency`); with the gap
    taken to zero, :func:`tangent_loss_fn`."""
    c = settings.consistency
    schedule = settings.student.objective.schedule
    batch_size = images.shape[0]
    if c.tangent:
        return tangent_loss_fn(settings, state, teach, student, images, noises, rng)
    if c.continuous:
        level_t, cleanest = first_levels(c, schedule, rng, batch_size)
        stage = c.first_stage + (state.step - settings.phase_start) // c.stage_steps
        level_r = consistency.shrinking_gap_level(level_t, stage, c.gap_base, cleanest)
        rates_t, rates_r = consistency.rates_of_level(level_t), consistency.rates_of_level(level_r)
    else:
        index, times = targets.grid_times(rng, batch_size, settings.grid_steps)
        rates_t = schedule(times)
        rates_r = consistency.previous_rates(schedule, index, settings.grid_steps)
        level_t, level_r = consistency.level_of_rates(*rates_t), consistency.level_of_rates(*rates_r)
    noisy = diffusion.add_noise(images, noises, *rates_t)
    if c.teacher_pair:
        z_r = consistency.teacher_ode_step(teach, noisy, rates_t, rates_r)
    else:
        z_r = consistency.data_pair_point(images, noises, level_r)
    target = jax.lax.stop_gradient(consistency.consistency_function(student(state.params), z_r, *rates_r))

    def loss_fn(params):
        predicted = consistency.consistency_function(student(params), noisy, *rates_t)
        return consistency.tuning_loss(predicted, target, level_t, level_r, huber_c=c.huber_c,
                                       inverse_gap=c.inverse_gap)

    return loss_fn


def first_levels(c: ConsistencySettings, schedule, rng, batch_size: int):
    """``(levels, cleanest)``: a batch's first noise levels ``(B, 1, 1, 1)``, log-normal or uniform in the schedule's
    time (``c.schedule_levels``), within the schedule's range; and that range's cleanest level."""
    cleanest, noisiest = (consistency.level_of_rates(*schedule(jnp.float32(t))) for t in (0.0, 1.0))
    if c.schedule_levels:
        times = jax.random.uniform(rng, (batch_size, 1, 1, 1), jnp.float32)
        return consistency.level_of_rates(*schedule(times)), cleanest
    return consistency.sample_levels(rng, batch_size, c.time_mean, c.time_std, cleanest, noisiest), cleanest


def tangent_loss_fn(settings: StepSettings, state: TrainState, teach, student, images, noises, rng):
    """The loss of a continuous-time consistency step (Lu & Song 2024; :func:`~ddim.distill.targets_consistency.
    tangent_target`): the student's velocity at ``z_a`` against its own velocity plus the normalised tangent along
    the path, ``dz/da`` the guided teacher's velocity (or the data's), ``dF/da`` one Jacobian-vector product of the
    student without gradient; the tangent's second term ramps in over ``tangent_warmup`` steps."""
    c = settings.consistency
    level, _ = first_levels(c, settings.student.objective.schedule, rng, images.shape[0])
    angle = consistency.angle_of_level(level)
    noisy = diffusion.add_noise(images, noises, *consistency.rates_of_angle(angle))
    if c.teacher_pair:
        dz_da = consistency.velocity_of(teach)(noisy, angle)
    else:
        dz_da = consistency.data_velocity(images, noises, angle)
    # Forward-mode differentiation cannot pass a custom_vjp (oneDNN's convolutions, the upsampling's adjoint).
    with ops.forward_mode():
        velocity, velocity_tangent = consistency.velocity_and_tangent(
            consistency.velocity_of(student(state.params)), noisy, angle, dz_da)
    done = (state.step - settings.phase_start + 1).astype(jnp.float32)
    warmup = jnp.minimum(1.0, done / c.tangent_warmup) if c.tangent_warmup else jnp.float32(1.0)
    tangent = jax.lax.stop_gradient(
        consistency.tangent_target(velocity, velocity_tangent, noisy, dz_da, angle, warmup, c.tangent_c))

    def loss_fn(params):
        return consistency.tangent_loss(consistency.velocity_of(student(params))(noisy, angle), velocity, tangent)

    return loss_fn


@functools.cache
def compiled_step(settings: StepSettings, mesh):
    """:func:`distill_step` (:func:`midtraining_step` in mid-training, :func:`trajectory_step` in the trajectory
    phase) jitted for ``settings`` over ``mesh``; the old state is donated."""
    replicated = parallel.replicated(mesh)
    step = {MIDTRAINING: midtraining_step, TRAJECTORY: trajectory_step}.get(settings.kind, distill_step)
    return jax.jit(functools.partial(step, settings=settings), donate_argnums=(0,),
                   out_shardings=(replicated, replicated))
