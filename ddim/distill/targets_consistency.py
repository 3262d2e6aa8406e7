"""Consistency distillation's maths as pure functions of arrays (Song et al. 2023, "Consistency models"), and
consistency tuning's, continuous-time consistency distillation's and consistency mid-training's.

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

**Consistency tuning** (``distill.consistency_times = "continuous"``, ``consistency_loss = "pseudo-huber"``,
``consistency_weighting = "inverse-gap"``; measured behind Song et al.'s recipe at equal CPU time, so not the default:
docs/research/consistency-tuning.md): Easy Consistency Tuning (Geng
et al. 2024, ECT; locuslab/ect ``training/loss.py``) with improved consistency training's distance (Song & Dhariwal
2023, iCT). The student starts from the teacher's weights; a noise level ``t`` is drawn from a log-normal and the
pair's second level ``r`` lies a gap below it that shrinks by ``q`` every stage (:func:`shrinking_gap_level`); the
loss is ``w(t, r) d(f(z_t, t), sg f(z_r, r))`` with the pseudo-Huber ``d`` and ``w = 1 / (t - r)``
(:func:`tuning_loss`). Departures from the papers, and why:

- The pair's second point comes, by default, from one step of the *guided teacher's* ODE (``consistency_pair =
  "teacher"``: distillation, as the target of CMT's ``ECDGuidLoss`` is the guided teacher's) rather than from the
  same image and noise (ECT's ``"data"``, also here): a class-conditional student samples with guidance in one
  pass per step only if its targets carry the guidance scale.
- The teacher's ODE step is DDIM's (Euler's in ``tau``), as in the grid recipe; the papers use Heun's.
- Levels are drawn from the log-normal *truncated* to the schedule's range (:func:`sample_levels`), and a second
  level below the schedule's cleanest one is the boundary: the network was trained only inside that range, and the
  sampler evaluates it only there. ECT draws from EDM's whole range and clamps ``r`` at 0.
- Every constant on ECT's noise levels (the log-normal's mean, the gap's ``n(t)``, the pseudo-Huber constant) is
  rescaled from EDM's data of standard deviation 0.5 to this project's unit-variance data.
- The target network is the student's weights without gradient (as iCT and ECT); the weight average
  (``distill.ema_decay``) is only what the student samples with.
- ``distill.consistency_levels = "schedule"`` draws the first level uniformly in the schedule's time instead of
  from the log-normal: an option of this project, since a short CPU run trains few draws at the noisiest end,
  where sampling in one pass evaluates the student (the log-normal's median level is 0.67 here).
- There is no dropout in this network, so ECT's shared dropout mask has nothing to share.

**Continuous-time consistency distillation** (``distill.consistency_times = "tangent"``; Lu & Song 2024,
"Simplifying, stabilizing and scaling continuous-time consistency models", sCM, its sCD): the gap of the pair taken
to zero. This project's cosine schedule is their TrigFlow: ``z = cos(a) x + sin(a) eps`` at the angle ``a``
(signal rate ``cos a``, noise rate ``sin a``), the velocity ``v = cos(a) eps - sin(a) x`` is ``dz/da``, and the
consistency function ``f = cos(a) z - sin(a) F`` with ``F`` the velocity prediction (their eq. 1 and 4 with
``sigma_d = 1``, the normaliser's unit variance). Its training gradient is ``grad E[F_theta . sg(-cos(a) df/da)]``
(their eq. 6 with ``w(a) = 1 / tan(a)``), which is that of the squared error of ``F_theta`` against
``sg(F + g)`` with the tangent

    g = -cos^2(a) (F - dz/da) - r sin(a) cos(a) (z + dF/da)

(:func:`tangent_target`), ``F`` and ``dF/da`` the student's own, without gradient, along the path: one
Jacobian-vector product through the network in the direction ``(dz/da, 1)`` (:func:`velocity_and_tangent`), and
``dz/da`` the guided teacher's velocity (distillation), or the data's ``cos(a) eps - sin(a) x`` with
``consistency_pair = "data"`` (their sCT). Departures, and why:

- No learned adaptive weighting ``w_phi(a)`` (their eq. 8): a second network, and a short run has too few steps
  to fit it; the tangent normalisation ``g / (|g| + c)`` (their section 4.2) and the tangent warm-up ``r`` ramping
  from 0 to 1 (``distill.consistency_tangent_warmup``) are kept, the stabilisers they name first.
- Angles come from ``tan(a)`` drawn as consistency tuning draws its levels (log-normal, truncated to the schedule;
  their ``tan(a) = e^tau / sigma_d``, ``tau ~ N(P_mean, P_std^2)``, rescaled as the levels are), and the network is
  this project's: no positional time embedding or adaptive double normalisation, which sCM adds for stability.
- The teacher's velocity is the guided one at the drawn scale, and the student's input carries that scale, as in
  consistency distillation here; sCM distils unguided teachers.

**Consistency mid-training** (``distill.consistency_midtraining_steps``; Hu et al. 2025, "Consistency
mid-training", CMT; sony/cmt ``training/loss.py``, ``DPMSolverLoss``): before consistency distillation, the
student, started from the teacher's weights, regresses the consistency function directly on trajectories the
teacher solved: ``f(z_{t_n}, t_n)`` onto the trajectory's end ``x_0`` (:func:`teacher_trajectory`,
:func:`midtraining_loss`), so consistency distillation starts from a network that already maps every point of
the teacher's ODE near its end. Departures, and why:

- The trajectories are the guided teacher's deterministic DDIM path on the ``start_steps``-step uniform grid
  from pure noise (DDIM eq. 13, :func:`teacher_ode_step`), the points and the solver the grid recipe trains on;
  CMT's are DPM-Solver++ multistep paths on a log-SNR grid started from noised data at EDM's ``t = 80``.
- They are solved once and banked (``<out>/trajectories.npz``, :mod:`ddim.distill.bank`), and each step draws
  (trajectory, grid point) pairs from the bank; CMT's code solves each batch's trajectories as it trains and
  trains on every point of them. Banking keeps the teacher out of the mid-training step, which is a CPU run's
  cost.
- The distance is the squared error with equal weights, as the 2023 recipe's (:func:`consistency_loss`); CMT's
  images use LPIPS (its squared-error option is the per-image sum, the same loss up to a constant).
- The trajectories carry each one's class (a ``label_dropout`` share the null class) and guidance scale, drawn as
  consistency distillation draws them, so the mid-trained student takes the same inputs as the final one.
"""

from __future__ import annotations

from typing import Callable

import jax
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



# --- consistency tuning: continuous times, a shrinking gap, a robust distance ----------------------------------
#
# Easy Consistency Tuning (Geng et al. 2024, "Consistency models made easy", ECT; locuslab/ect, training/loss.py)
# starts from the diffusion model and trains pairs of points (t, r) of one trajectory at continuous noise levels
# whose gap shrinks stage by stage, with improved consistency training's distance and weighting (Song & Dhariwal
# 2023, iCT). Their noise level is EDM's: the state ``x + t eps`` of data of standard deviation 0.5. Here the data
# has unit variance (the model's normaliser), so this project's level ``tau = sigma / alpha`` (the ``t`` of the
# module docstring) is twice EDM's at the same signal-to-noise ratio; every constant below is ECT's rescaled so.


def rates_of_level(tau):
    """``(noise_rates, signal_rates)`` of the noise level ``tau = sigma / alpha`` (variance preserving:
    ``sigma = tau / sqrt(1 + tau^2)``, ``alpha = 1 / sqrt(1 + tau^2)``); level 0 is the boundary."""
    signal = jax.lax.rsqrt(1.0 + jnp.square(tau))
    return tau * signal, signal


def level_of_rates(noise_rates, signal_rates):
    """The noise level ``tau = sigma / alpha`` of ``(noise_rates, signal_rates)``."""
    return noise_rates / signal_rates


def sample_levels(rng, batch_size: int, mean: float, std: float, lowest: float, highest: float):
    """Noise levels ``(B, 1, 1, 1)`` with ``ln tau ~ N(mean, std^2)`` (iCT's and ECT's log-normal proposal), truncated
    to ``[lowest, highest]``: the schedule's own range, where the network was trained and the sampler evaluates it.
    ECT's ``N(-1.1, 2^2)`` on EDM's levels is ``N(-1.1 + ln 2, 2^2)`` on these."""
    low, high = (jnp.log(lowest) - mean) / std, (jnp.log(highest) - mean) / std
    normal = jax.random.truncated_normal(rng, low, high, (batch_size, 1, 1, 1), jnp.float32)
    return jnp.exp(mean + std * normal)


def gap_divisor(stage, base: float):
    """``q^(s + 1)``: how many times finer than the level itself the pair's gap is at stage ``s`` (ECT, q = 2)."""
    return jnp.power(jnp.float32(base), jnp.asarray(stage, jnp.float32) + 1.0)


def shrinking_gap_level(tau, stage, base: float, lowest: float):
    """The pair's second level ``r = tau (1 - n(tau) / q^(s + 1))`` with ``n(tau) = 1 + 8 sigmoid(-tau / 2)`` (ECT's
    ``t_to_r_sigmoid``, k = 8, b = 1 on EDM's levels, so b = 1/2 here): the gap shrinks as the stage ``s`` rises, and
    is relatively wider at low noise. A level below ``lowest`` (the schedule's cleanest) becomes the boundary, 0:
    ECT clamps at 0 too, and below the schedule's range the network was never trained, so a target there would
    come from an untrained input (the sampler never evaluates it there either)."""
    n = 1.0 + 8.0 * jax.nn.sigmoid(-tau / 2.0)
    r = tau * (1.0 - n / gap_divisor(stage, base))
    return jnp.where(r < lowest, 0.0, r)


def data_pair_point(images, noises, level_r):
    """ECT's tuning pair: the same image and noise at level ``r``, ``z_r = alpha_r x + sigma_r eps``; at the
    boundary the image itself."""
    noise_rates, signal_rates = rates_of_level(level_r)
    return signal_rates * images + noise_rates * noises


def pseudo_huber(student_images, target_images, c: float):
    """``sqrt(|a - b|^2 + c^2) - c`` per image (iCT, eq. 9): the l2 distance's robustness to outliers with a smooth
    minimum; ``(B,)``."""
    squared = jnp.sum(jnp.square(student_images - target_images), axis=tuple(range(1, student_images.ndim)))
    return jnp.sqrt(squared + c * c) - c


def tuning_loss(student_images, target_images, level_t, level_r, *, huber_c: float | None, inverse_gap: bool):
    """The batch mean of ``w(t, r) d(f(z_t, t), sg f(z_r, r))``: ``d`` the pseudo-Huber distance with constant
    ``huber_c`` (None: the mean squared error of :func:`consistency_loss`), ``w = 1 / (t - r)`` with
    ``inverse_gap`` (ECT's weighting, which keeps the gradient's size as the gap shrinks), else 1."""
    if huber_c is None:
        distance = jnp.mean(jnp.square(student_images - target_images), axis=tuple(range(1, student_images.ndim)))
    else:
        distance = pseudo_huber(student_images, target_images, huber_c)
    if inverse_gap:
        distance = distance / (level_t - level_r).reshape(-1)
    return jnp.mean(distance)


# --- continuous-time consistency distillation: the tangent along the path, through the network ---------------------


def rates_of_angle(angle):
    """``(noise_rates, signal_rates)`` of the TrigFlow angle ``a``: ``(sin a, cos a)``; angle 0 is the boundary."""
    return jnp.sin(angle), jnp.cos(angle)


def angle_of_level(tau):
    """The angle ``a = arctan(tau)`` of the noise level ``tau = sigma / alpha = tan(a)``."""
    return jnp.arctan(tau)


def velocity_of(denoise: Denoise):
    """``F(z, a)``: the velocity ``cos(a) eps_hat - sin(a) x_hat`` of ``denoise``'s predictions at the angle ``a``
    (for a velocity network, its output)."""

    def velocity(z, angle):
        noise_rates, signal_rates = rates_of_angle(angle)
        pred_noises, pred_images = denoise(z, noise_rates, signal_rates)
        return signal_rates * pred_noises - noise_rates * pred_images

    return velocity


def velocity_and_tangent(velocity: Callable, z, angle, dz_da):
    """``(F, dF/da)``: ``velocity(z, a)`` and its total derivative along the path ``z(a)`` whose derivative is
    ``dz_da``, ``dF/da = dF/dz . dz/da + dF/da|_z``: one forward-mode product (``jax.jvp``), no gradient through it."""
    return jax.jvp(velocity, (z, angle), (dz_da, jnp.ones_like(angle)))


def tangent_target(velocity, velocity_tangent, z, dz_da, angle, warmup, c: float):
    """sCM's normalised tangent ``g / (|g| + c)`` with ``g = -cos^2(a) (F - dz/da) - r sin(a) cos(a) (z + dF/da)``
    (module docstring; ``r = warmup``, ``|g|`` per image over all its numbers): the student's velocity is pulled
    towards ``F + g``."""
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    g = -jnp.square(cos) * (velocity - dz_da) - warmup * sin * cos * (z + velocity_tangent)
    norm = jnp.sqrt(jnp.sum(jnp.square(g), axis=tuple(range(1, g.ndim)), keepdims=True))
    return g / (norm + c)


def tangent_loss(student_velocity, velocity, tangent):
    """``mean |F_theta - sg(F + g)|^2``, whose gradient at the student's weights is sCM's (module docstring)."""
    return jnp.mean(jnp.square(student_velocity - jax.lax.stop_gradient(velocity + tangent)))


def data_velocity(images, noises, angle):
    """The data's ``dz/da = cos(a) eps - sin(a) x`` (sCT's, ``consistency_pair = "data"``)."""
    return jnp.cos(angle) * noises - jnp.sin(angle) * images


# --- consistency mid-training: regress the consistency function on the teacher's banked trajectories --------------


def teacher_trajectory(teacher: Denoise, schedule: Callable, noise, steps: int):
    """The teacher's deterministic DDIM path from ``noise`` at ``t = 1`` down the ``steps``-step uniform grid:
    ``(states, end)``, ``states`` shaped ``(steps, *noise.shape)`` with ``states[n - 1]`` the point at ``t_n = n /
    steps``, and ``end`` the image prediction at ``t_1`` (the last :func:`teacher_ode_step`, to the boundary): the
    teacher's ``steps``-step DDIM sample of ``noise``."""
    ones = jnp.ones((noise.shape[0],), jnp.int32)

    def step(z, n):
        index = ones * n
        rates_t = schedule((index.astype(jnp.float32) / steps).reshape(-1, 1, 1, 1))
        return teacher_ode_step(teacher, z, rates_t, previous_rates(schedule, index, steps)), z

    end, states = jax.lax.scan(step, noise, jnp.arange(steps, 0, -1))
    return states[::-1], end


def midtraining_loss(student_images, end_images):
    """``mean |f_theta(z_{t_n}, t_n) - x_end|^2``: CMT's regression of the student's consistency function on the
    trajectory's end, with :func:`consistency_loss`'s squared error and equal weights (module docstring)."""
    return consistency_loss(student_images, end_images)
