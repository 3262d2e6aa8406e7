"""The DDIM maths as pure functions of arrays (no network, no state).

Notation follows Song et al. 2020, "Denoising Diffusion Implicit Models"
(arXiv:2010.02502), with the continuous-time parametrisation of the Keras
example: a diffusion time ``t`` in [0, 1] maps to a *signal rate*
``sqrt(alpha_t)`` and a *noise rate* ``sqrt(1 - alpha_t)`` whose squares sum
to one, so a noisy image is (DDIM eq. 4)::

    x_t = signal_rate * x_0 + noise_rate * eps,      eps ~ N(0, I)

All functions broadcast: rates are usually shaped ``(batch, 1, 1, 1)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def cosine_schedule(diffusion_times, min_signal_rate: float = 0.02, max_signal_rate: float = 0.95):
    """Continuous cosine schedule: ``t -> (noise_rate, signal_rate)``.

    The angle is linear in ``t`` between ``acos(max_signal_rate)`` (t=0, almost
    clean) and ``acos(min_signal_rate)`` (t=1, almost pure noise), so that
    ``signal_rate = cos(angle)`` and ``noise_rate = sin(angle)`` satisfy
    ``signal_rate**2 + noise_rate**2 == 1`` for every ``t``. The end points are
    clipped away from 0 and 1 so that ``x_0`` can always be recovered
    (``signal_rate > 0``) and training never sees a noise-free input. This is the
    "cosine" schedule of Nichol & Dhariwal 2021 in continuous time.
    """
    start_angle = jnp.arccos(jnp.asarray(max_signal_rate, jnp.float32))
    end_angle = jnp.arccos(jnp.asarray(min_signal_rate, jnp.float32))
    angles = start_angle + diffusion_times * (end_angle - start_angle)
    return jnp.sin(angles), jnp.cos(angles)


def time_from_log_snr(log_snrs, min_signal_rate: float = 0.02, max_signal_rate: float = 0.95):
    """The inverse of :func:`cosine_schedule` in terms of the log-SNR ``lambda = log(signal_rate / noise_rate)``.

    ``tan(angle) = noise_rate / signal_rate = exp(-lambda)``, and the angle is
    linear in ``t``. Times outside [0, 1] come back for log-SNRs outside the
    schedule's range (they are not clipped).
    """
    start_angle = jnp.arccos(jnp.asarray(max_signal_rate, jnp.float32))
    end_angle = jnp.arccos(jnp.asarray(min_signal_rate, jnp.float32))
    return (jnp.arctan(jnp.exp(-log_snrs)) - start_angle) / (end_angle - start_angle)


def add_noise(images, noises, noise_rates, signal_rates):
    """Forward process q(x_t | x_0), DDIM eq. 4: ``x_t = sqrt(a_t) x_0 + sqrt(1 - a_t) eps``."""
    return signal_rates * images + noise_rates * noises


def predict_images(noisy_images, pred_noises, noise_rates, signal_rates):
    """The "predicted x_0" of DDIM eq. 12 (first bracket), from a noise prediction.

    ``x_0 = (x_t - sqrt(1 - a_t) eps_theta(x_t)) / sqrt(a_t)``.
    """
    return (noisy_images - noise_rates * pred_noises) / signal_rates


def ddim_sigma(noise_rates, signal_rates, next_noise_rates, next_signal_rates, eta):
    """Standard deviation of the fresh noise in one reverse step, DDIM eq. 16.

    ``sigma = eta * sqrt((1 - a_prev) / (1 - a_t)) * sqrt(1 - a_t / a_prev)``;
    ``eta = 0`` is the deterministic DDIM sampler, ``eta = 1`` the DDPM posterior.
    """
    alpha = signal_rates**2
    alpha_next = next_signal_rates**2
    variance = (next_noise_rates**2 / noise_rates**2) * (1.0 - alpha / alpha_next)
    return eta * jnp.sqrt(jnp.clip(variance, 0.0, None))


def ddim_step(pred_images, pred_noises, next_noise_rates, next_signal_rates, sigma=0.0, fresh_noise=None):
    """One reverse step x_t -> x_{t-1}, DDIM eq. 12.

    ``x_prev = sqrt(a_prev) x_0_pred + sqrt(1 - a_prev - sigma^2) eps_pred + sigma z``.
    With ``sigma == 0`` (eta = 0) the step is deterministic and simply re-noises
    the predicted clean image to the next, lower noise level with the *predicted*
    noise (the "direction pointing to x_t").
    """
    direction_rates = jnp.sqrt(jnp.clip(next_noise_rates**2 - sigma**2, 0.0, None))
    next_images = next_signal_rates * pred_images + direction_rates * pred_noises
    if fresh_noise is not None:
        next_images = next_images + sigma * fresh_noise
    return next_images


def reverse_diffusion_times(step: int, diffusion_steps: int):
    """Current and next diffusion times of reverse step ``step`` (0-based) of ``diffusion_steps``.

    The sampler walks ``t = 1, 1 - 1/S, ..., 1/S`` and re-noises to
    ``t - 1/S``; the last step lands on ``t = 0`` (the schedule's cleanest level).
    """
    step_size = 1.0 / diffusion_steps
    times = 1.0 - step * step_size
    return times, times - step_size


def slerp(a, b, weights):
    """Spherical interpolation between latents ``a`` and ``b`` (DDIM section 5.3, after White 2016).

    For each weight ``w`` in [0, 1]: the direction moves along the great circle
    from ``a`` to ``b`` (angle ``theta`` between them, ``sin((1-w) theta) a' +
    sin(w theta) b'``, over ``sin theta``, with unit ``a'``, ``b'``) and the
    norm moves linearly from ``|a|`` to ``|b|``, so latents of equal norm (as
    Gaussian noise of one size nearly has) keep it exactly, unlike a straight
    line, whose midpoint has a smaller norm than any Gaussian sample. ``a``
    and ``b`` have the same shape; returns float32 ``(len(weights), *a.shape)``.
    Computed in float64 with numpy: latents are small and live on the host.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    weights = np.asarray(weights, np.float64).reshape((-1,) + (1,) * a.ndim)
    norm_a, norm_b = np.linalg.norm(a), np.linalg.norm(b)
    unit_a, unit_b = a / norm_a, b / norm_b
    theta = np.arccos(np.clip(np.sum(unit_a * unit_b), -1.0, 1.0))
    if np.sin(theta) < 1e-9:  # (anti)parallel latents: no unique great circle; go straight
        directions = (1.0 - weights) * unit_a + weights * unit_b
    else:
        directions = (np.sin((1.0 - weights) * theta) * unit_a + np.sin(weights * theta) * unit_b) / np.sin(theta)
    lengths = np.linalg.norm(directions.reshape(len(directions), -1), axis=1).reshape(weights.shape)
    lengths = np.where(lengths == 0, 1.0, lengths)  # the midpoint of opposite latents
    return (directions / lengths * ((1.0 - weights) * norm_a + weights * norm_b)).astype(np.float32)


def sample_diffusion_times(rng, batch_size: int):
    """Uniform training diffusion times, shaped to broadcast over NHWC images."""
    return jax.random.uniform(rng, (batch_size, 1, 1, 1), minval=0.0, maxval=1.0)
