"""The student's train state and the jitted distillation step: one optimiser step, nothing around it.

The state is :class:`ddim.train.state.TrainState`, so a student's checkpoint is an ordinary checkpoint that every
verb loads. Each phase starts a fresh state from its teacher's weights (:func:`create_student_state`) with a fresh
Adam whose learning rate decays linearly to 0 over the phase, as the reference code does, and a weight average
that warms up from the phase's start (so none of the previous phase's weights stay in it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from ddim import diffusion, parallel, runtime
from ddim.config import Config, ConfigError, DistillConfig
from ddim.distill import targets
from ddim.distill import targets_consistency as consistency
from ddim.distill.plan import CONSISTENCY, GUIDANCE_STAGE, Phase
from ddim.model import DiffusionModel, bind_denoiser, init_variables, normalize
from ddim.train.state import TrainState, class_condition, to_float, update_ema


def optimizer(settings: DistillConfig, steps: int) -> optax.GradientTransformation:
    """Adam from ``learning_rate`` decayed linearly to 0 over ``steps``, after clipping the gradient's norm (the
    reference's ``learning_rate_anneal_type = "linear"``, no weight decay)."""
    adam = optax.adam(optax.linear_schedule(settings.learning_rate, 0.0, max(steps, 1)))
    return optax.chain(optax.clip_by_global_norm(settings.grad_clip), adam) if settings.grad_clip > 0 else adam


def student_variables(student: DiffusionModel, teacher_variables: dict[str, Any], rng) -> dict[str, Any]:
    """The teacher's variables in the student's structure: every teacher weight kept, the student's new ones (the
    guidance embedding, initialised to zero output) from their initialisers."""
    init = jax.jit(functools.partial(init_variables, student))
    fresh = jax.device_get(runtime.compile_for_one_call(init, rng)(rng))
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
        apply_fn=student.apply, params=params, tx=optimizer(config.distill, phase.optimizer_steps),
        batch_stats=batch_stats, ema_params=jax.tree.map(jnp.copy, params),
        ema_batch_stats=jax.tree.map(jnp.copy, batch_stats),
    )
    state = state.replace(step=jnp.asarray(phase.start, jnp.int32))
    return parallel.replicate(state, mesh or parallel.data_mesh())


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

    @classmethod
    def of(cls, student: DiffusionModel, teacher: DiffusionModel, config: Config, phase: Phase) -> "StepSettings":
        d = config.distill
        focus = tuple(d.guidance_focus) if d.guidance_sampling == "focused" else ()
        return cls(student, teacher, phase.kind, phase.grid_steps, student.config.class_conditional, d.guidance_min,
                   d.guidance_max, focus, d.label_dropout, d.ema_decay, phase.start)


def distill_step(state: TrainState, teacher_variables, batch, rng, settings: StepSettings):
    """One optimiser step of the student on a batch ``{"image", "label"}``; returns the new state and its loss.

    The batch's images are noised at a time of the phase's grid; the target is the teacher's guided prediction
    (stage one) or the image of its two DDIM steps (a round), both from :mod:`ddim.distill.targets`, and the loss
    their truncated-SNR-weighted squared error; in consistency distillation the target is the student's own
    consistency function (its weights without gradient) one teacher step further along the ODE
    (:mod:`ddim.distill.targets_consistency`). A class-conditional student gets each image's class (a
    ``label_dropout`` share of them the null class) and a guidance scale drawn from the distilled range, and its
    teacher the same.
    """
    rng = jax.random.fold_in(rng, state.step)
    noise_rng, time_rng, guidance_rng, label_rng = jax.random.split(rng, 4)
    teacher = settings.teacher
    images = normalize(teacher, teacher_variables, to_float(batch["image"]))
    batch_size = images.shape[0]
    index, times = targets.grid_times(time_rng, batch_size, settings.grid_steps)
    schedule = settings.student.objective.schedule
    noise_rates, signal_rates = schedule(times)
    noises = jax.random.normal(noise_rng, images.shape, jnp.float32)
    noisy = diffusion.add_noise(images, noises, noise_rates, signal_rates)
    cond = None
    if settings.conditional:
        cond = class_condition(batch, label_rng, settings.label_dropout)
        cond["guidance"] = targets.guidance_scales(guidance_rng, batch_size, settings.guidance_min,
                                                   settings.guidance_max, settings.guidance_focus)
    teacher_denoise = bind_denoiser(teacher, teacher_variables)

    def teach(z, rates_noise, rates_signal):
        return teacher_denoise(z, rates_noise, rates_signal, cond)

    def student(params):
        denoise = bind_denoiser(settings.student, {"params": params, "batch_stats": state.batch_stats})
        return lambda z, rates_noise, rates_signal: denoise(z, rates_noise, rates_signal, cond)

    if settings.kind == CONSISTENCY:
        rates_s = consistency.previous_rates(schedule, index, settings.grid_steps)
        z_s = consistency.teacher_ode_step(teach, noisy, (noise_rates, signal_rates), rates_s)
        # The target network is the student's weights without gradient (Song & Dhariwal 2023; Lu & Song 2024).
        target = consistency.consistency_function(student(state.params), z_s, *rates_s)
    elif settings.kind == GUIDANCE_STAGE:
        _, target = teach(noisy, noise_rates, signal_rates)
    else:
        target = targets.progressive_target(teach, schedule, noisy, index, times, settings.grid_steps)
    target = jax.lax.stop_gradient(target)

    def loss_fn(params):
        _, predicted = student(params)(noisy, noise_rates, signal_rates)  # a velocity student's: f(z_t, t)
        if settings.kind == CONSISTENCY:
            return consistency.consistency_loss(predicted, target)
        return targets.truncated_snr_loss(predicted, target, noise_rates, signal_rates)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    new_state = state.apply_gradients(grads=grads)
    # Warm-up from the phase's start: min(decay, (1 + n) / (10 + n)) after n steps of the phase.
    new_state = update_ema(new_state, state.step - settings.phase_start, settings.ema_decay, warmup=True)
    return new_state, {"loss": loss}


@functools.cache
def compiled_step(settings: StepSettings, mesh):
    """:func:`distill_step` jitted for ``settings`` over ``mesh``; the old state is donated."""
    replicated = parallel.replicated(mesh)
    return jax.jit(functools.partial(distill_step, settings=settings), donate_argnums=(0,),
                   out_shardings=(replicated, replicated))
