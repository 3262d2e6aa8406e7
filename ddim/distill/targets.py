"""The maths of distillation as pure functions of arrays: the times a student is trained at, its targets, its loss.

Notation as :mod:`ddim.objective`: ``z_t = alpha_t x + sigma_t eps`` (DDIM eq. 4), one DDIM step from ``t`` to
``s`` is ``z_s = alpha_s x_hat + sigma_s eps_hat`` (DDIM eq. 12 with eta 0), and a student of ``N`` steps walks
the uniform grid ``t = 1, 1 - 1/N, ..., 1/N`` of :mod:`ddim.samplers`, returning its image prediction at the
last time.

- Progressive distillation (Salimans & Ho 2022, Algorithm 2): from ``z_t`` at a time of the student's grid the
  teacher takes two DDIM steps of ``1/(2N)``, to ``z_s``; the student's one step lands there exactly when its
  image prediction is :func:`one_step_target`. At the grid's last time the sample is the prediction itself, so
  the target there is the teacher's image prediction after its first step, the sample of its ``2N``-step run (as
  the reference code, ``jnp.where(i == 0, x_pred, x_target)``).
- On the teacher's own path (Luhman & Luhman 2021 teach a student the teacher's ODE solutions): from a point
  ``z_t`` of the teacher's banked DDIM path at a time of the student's grid, :func:`trajectory_target`, the image
  whose one step lands on the path's point at the grid's next time, or at its last time the path's end.
  With a rollout weight, the student's own sample of the path's noise, all its steps taken in one differentiated
  pass, also learns the path's end (:func:`rollout_loss`): a later step then learns from the earlier steps'
  outputs, which sampling gives it, not from the teacher's path, which it never sees there.
- Guided distillation, stage one (Meng et al. 2023, eq. 6-7): the student, given the guidance scale ``w``,
  learns the teacher's guided prediction ``x_c + (w - 1)(x_c - x_u)`` in one network pass.
- Both use the truncated-SNR weighting of the image's squared error, ``max(SNR, 1)`` (Salimans & Ho 2022,
  section 4; the reference's ``snr_trunc``): the noise's error at low noise, the image's at high noise, where a
  noise weighting would vanish.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from ddim import diffusion
from ddim.objective import snr

Denoise = Callable  # (z, noise_rates, signal_rates) -> (pred_noises, pred_images)


def grid_times(rng, batch_size: int, steps: int):
    """``(index, t)``: a uniform draw from a ``steps``-step uniform grid, ``t = index / steps`` with ``index`` in
    ``1..steps``, shaped ``(B,)`` and ``(B, 1, 1, 1)`` (the reference code's discrete-time training)."""
    index = jax.random.randint(rng, (batch_size,), 1, steps + 1)
    return index, (index.astype(jnp.float32) / steps).reshape(-1, 1, 1, 1)


def one_step_target(z_t, rates_t, z_s, rates_s):
    """The image prediction whose DDIM step from ``z_t`` lands on ``z_s`` (Salimans & Ho 2022, Algorithm 2).

    One deterministic DDIM step is ``z_s = alpha_s x + (sigma_s / sigma_t)(z_t - alpha_t x)``; solved for ``x``,
    ``x = (z_s - (sigma_s / sigma_t) z_t) / (alpha_s - (sigma_s / sigma_t) alpha_t)``. ``rates_*`` are
    ``(noise_rates, signal_rates)``.
    """
    (sigma_t, alpha_t), (sigma_s, alpha_s) = rates_t, rates_s
    ratio = sigma_s / sigma_t
    return (z_s - ratio * z_t) / (alpha_s - ratio * alpha_t)


def two_teacher_steps(teacher: Denoise, schedule: Callable, z_t, t, step_size):
    """The teacher's two DDIM steps of ``step_size / 2`` from ``z_t`` at times ``t``: ``(z_s, mid_images)``.

    ``z_s`` is where they land (time ``t - step_size``) and ``mid_images`` the teacher's image prediction at the
    midpoint, which is its sample when the midpoint is the last time of its grid.
    """
    rates_t = schedule(t)
    noises, images = teacher(z_t, *rates_t)
    rates_mid = schedule(t - step_size / 2)
    z_mid = diffusion.ddim_step(images, noises, *rates_mid)
    noises, mid_images = teacher(z_mid, *rates_mid)
    rates_s = schedule(t - step_size)
    return diffusion.ddim_step(mid_images, noises, *rates_s), mid_images


def progressive_target(teacher: Denoise, schedule: Callable, z_t, index, t, student_steps: int):
    """The image a student of ``student_steps`` steps should predict at ``z_t`` (module docstring).

    ``index`` is the position of ``t`` on the student's grid (``t = index / student_steps``); at ``index`` 1, the
    last step, the target is the teacher's sample instead of the one-step target.
    """
    step_size = 1.0 / student_steps
    z_s, mid_images = two_teacher_steps(teacher, schedule, z_t, t, step_size)
    target = one_step_target(z_t, schedule(t), z_s, schedule(t - step_size))
    last = (index == 1).reshape(-1, 1, 1, 1)
    return jnp.where(last, mid_images, target)


def trajectory_target(z_t, rates_t, z_s, rates_s, last):
    """The image a student should predict at ``z_t``, a point of the teacher's path at a time of the student's
    grid: where ``last`` (the grid's last time, ``(B,)``) the path's end ``z_s`` itself, the sample; elsewhere the
    :func:`one_step_target` that lands on the path's point ``z_s`` at the grid's next time."""
    return jnp.where(last.reshape(-1, 1, 1, 1), z_s, one_step_target(z_t, rates_t, z_s, rates_s))


def student_sample(student: Denoise, schedule: Callable, noise, steps: int):
    """A student's deterministic ``steps``-step DDIM sample of ``noise`` (at ``t = 1``), as :func:`ddim.samplers.run`
    takes it: its image prediction at the grid's last time. A Python loop, so that the gradient flows through
    every step (``steps`` is a few)."""
    ones = jnp.ones((noise.shape[0], 1, 1, 1), jnp.float32)
    z, images = noise, noise
    for i in range(steps):
        time, next_time = diffusion.reverse_diffusion_times(i, steps)
        noises, images = student(z, *schedule(ones * time))
        if i < steps - 1:
            z = diffusion.ddim_step(images, noises, *schedule(ones * next_time))
    return images


def rollout_loss(sample_images, end_images):
    """``mean |x_student(eps) - x_teacher(eps)|^2``: the student's whole sample of a path's noise against the
    teacher's (Luhman & Luhman 2021's loss for their one-step student, here through all of the student's steps)."""
    return jnp.mean(jnp.square(sample_images - end_images))


def truncated_snr_loss(pred_images, target_images, noise_rates, signal_rates):
    """``mean(max(SNR, 1) |x_hat - x_target|^2)``: Salimans & Ho 2022, section 4 ("truncated SNR" weighting)."""
    weights = jnp.maximum(snr(noise_rates, signal_rates), 1.0)
    return jnp.mean(weights * jnp.square(pred_images - target_images))


def guidance_scales(rng, batch_size: int, lowest: float, highest: float, focus: tuple[float, ...] = ()):
    """Guidance scales, ``(B,)``: drawn uniformly from ``[lowest, highest]`` (Meng et al. 2023 draw ``w`` so), or
    with ``focus = (low, high)`` each with probability 1/2 uniformly from ``focus`` instead.

    The guided prediction ``x_c + (w - 1)(x_c - x_u)`` moves from the plain one by ``(w - 1)(x_c - x_u)``, so the
    squared error a student makes on it grows as ``(w - 1)^2``: uniform draws up to 4 spend most of the gradient
    on scales above 2. The focus puts half of the draws where the scales are sampled.
    """
    if not focus:
        return jax.random.uniform(rng, (batch_size,), minval=lowest, maxval=highest)
    uniform_rng, focus_rng, pick_rng = jax.random.split(rng, 3)
    scales = jax.random.uniform(uniform_rng, (batch_size,), minval=lowest, maxval=highest)
    focused = jax.random.uniform(focus_rng, (batch_size,), minval=focus[0], maxval=focus[1])
    return jnp.where(jax.random.bernoulli(pick_rng, 0.5, (batch_size,)), focused, scales)
