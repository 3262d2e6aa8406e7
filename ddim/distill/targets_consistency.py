"""Consistency distillation's maths as pure functions of arrays (Song et al. 2023, "Consistency models").

Notation as :mod:`ddim.distill.targets`: ``z_t = alpha_t x + sigma_t eps`` (DDIM eq. 4) on this project's cosine
schedule (signal rate 0.95 at ``t = 0`` to 0.02 at ``t = 1``), ``x_hat`` and ``eps_hat`` a model's image and noise
predictions at ``z_t``.

**The consistency function and its boundary.** A consistency function maps every point of one trajectory of the
probability-flow ODE to the trajectory's end (Song et al., eq. 2). Their parameterisation (eq. 3, appendix C),

    f(x, t) = c_skip(t) x + c_out(t) F(x, t),   c_skip = s_d^2 / ((t - e)^2 + s_d^2),
                                                 c_out = s_d (t - e) / sqrt(s_d^2 + t^2),

returns its input at the smallest time ``e``, whatever the network ``F`` outputs. Their ``t`` is the EDM noise
level and ``x`` the EDM state; in this schedule those are ``sigma / alpha`` and ``z / alpha`` (DDIM eq. 14, the ODE
of ``z / alpha`` in ``sigma / alpha``). Every sampler here ends one step below the schedule's cleanest level: its
sample is the image prediction at the last time, the DDIM step to noise rate 0 (:mod:`ddim.samplers`). So the
trajectory's end, and ``e``, is noise rate 0 (signal rate 1), not the schedule's ``t = 0`` (signal rate 0.95, a
noise rate of 0.31 that would stay in the images). With ``e = 0`` and ``s_d = 1`` (the model's normaliser gives
every channel unit variance), ``c_skip = alpha^2`` and ``c_out = sigma``, and
``f = alpha^2 (z / alpha) + sigma F = alpha z + sigma F``: with ``F = -v`` that is the image prediction of a
velocity network, ``x_hat = alpha z - sigma v`` (:mod:`ddim.objective`). A velocity student *is* the paper's
parameterisation, its image prediction the consistency function, and at noise rate 0 it returns its input
exactly (:func:`consistency_function`).

**Discrete-time consistency distillation** (Song et al., Algorithm 2; openai ``consistency_models_cifar10``,
``jcm/losses.py``, ``get_consistency_loss_fn``): on the teacher's ``N``-step uniform grid ``t_n = n / N``, with
``t_0`` the boundary (noise rate 0), draw ``n`` in ``1..N``, noise a data image to ``z_{t_n}``, take one step of
the ODE solver from ``t_n`` to ``t_{n-1}`` (here the teacher's guided DDIM step, DDIM eq. 13, the solver the
students of progressive distillation follow too; the paper's is Heun's), and pull the student's
``f(z_{t_n}, t_n)`` towards the target network's ``f(z_hat_{t_{n-1}}, t_{n-1})`` (:func:`consistency_loss`). At
``n = 1`` the target is the teacher's image prediction itself, the last step of its ``N``-step sample.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from ddim import diffusion

Denoise = Callable  # (z, noise_rates, signal_rates) -> (pred_noises, pred_images)


def boundary_rates(like):
    """``(noise_rates, signal_rates)`` of the trajectory's end, noise rate 0 and signal rate 1, shaped as ``like``."""
    return jnp.zeros_like(like), jnp.ones_like(like)


def consistency_function(denoise: Denoise, z, noise_rates, signal_rates):
    """``f(z, t)``: the image prediction of a velocity model, ``alpha z - sigma v`` (module docstring: the paper's
    ``c_skip z + c_out F`` with ``c_skip = alpha^2`` on ``z / alpha``, ``c_out = sigma``, ``F = -v``); it is ``z``
    exactly at :func:`boundary_rates`."""
    return denoise(z, noise_rates, signal_rates)[1]


def previous_rates(schedule: Callable, index, steps: int):
    """The rates at ``t_{n-1} = (n - 1) / steps`` for grid positions ``index`` (``n``, ``(B,)``), the boundary at
    ``n = 1``: ``(noise_rates, signal_rates)``, each ``(B, 1, 1, 1)``."""
    times = ((index - 1).astype(jnp.float32) / steps).reshape(-1, 1, 1, 1)
    noise_rates, signal_rates = schedule(times)
    at_boundary = index.reshape(-1, 1, 1, 1) == 1
    end_noise, end_signal = boundary_rates(noise_rates)
    return jnp.where(at_boundary, end_noise, noise_rates), jnp.where(at_boundary, end_signal, signal_rates)


def teacher_ode_step(teacher: Denoise, z_t, rates_t, rates_s):
    """One step of the teacher's probability-flow ODE from ``z_t`` (rates ``rates_t``) to the rates ``rates_s``:
    the deterministic DDIM step ``z_s = alpha_s x_hat + sigma_s eps_hat`` (DDIM eq. 12 with eta 0, the Euler step of
    eq. 13); at the boundary it is the teacher's image prediction ``x_hat``."""
    pred_noises, pred_images = teacher(z_t, *rates_t)
    return diffusion.ddim_step(pred_images, pred_noises, *rates_s)


def consistency_loss(student_images, target_images):
    """``mean |f_theta(z_{t_n}, t_n) - f_target(z_hat_{t_{n-1}}, t_{n-1})|^2``: Song et al.'s loss (eq. 7-8) with the
    squared l2 metric and ``lambda(t) = 1`` (their CIFAR-10 l2 runs; LPIPS, their best metric, needs a network this
    project does not ship)."""
    return jnp.mean(jnp.square(student_images - target_images))

