"""The DDIM maths (ddim/diffusion.py): schedule identities and exactness of the sampler step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim import diffusion
from tests.conftest import normal


def test_schedule_rates_are_on_the_unit_circle_and_hit_the_end_points():
    times = jnp.linspace(0.0, 1.0, 101)
    noise, signal = diffusion.cosine_schedule(times, 0.02, 0.95)
    np.testing.assert_allclose(signal**2 + noise**2, 1.0, atol=1e-6)
    np.testing.assert_allclose(signal[0], 0.95, atol=1e-6)
    np.testing.assert_allclose(signal[-1], 0.02, atol=1e-6)
    assert np.all(np.diff(np.asarray(signal)) < 0), "signal rate must fall with time"
    assert np.all(np.diff(np.asarray(noise)) > 0), "noise rate must rise with time"


def test_schedule_is_linear_in_angle():
    times = jnp.array([0.0, 0.25, 0.5, 1.0])
    noise, signal = diffusion.cosine_schedule(times, 0.1, 0.9)
    angles = np.arctan2(np.asarray(noise), np.asarray(signal))
    start, end = np.arccos(0.9), np.arccos(0.1)
    np.testing.assert_allclose(angles, start + np.asarray(times) * (end - start), atol=1e-6)


def _data(seed=0, shape=(4, 8, 8, 3)):
    return normal(2 * seed, shape), normal(2 * seed + 1, shape)


def test_predicted_images_invert_the_forward_process():
    images, noises = _data()
    noise, signal = diffusion.cosine_schedule(jnp.full((4, 1, 1, 1), 0.7))
    noisy = diffusion.add_noise(images, noises, noise, signal)
    np.testing.assert_allclose(diffusion.predict_images(noisy, noises, noise, signal), images, atol=1e-5)


@pytest.mark.parametrize("steps", [1, 3, 20])
def test_ddim_with_a_perfect_noise_predictor_reconstructs_the_image(steps):
    """With eps_theta = the true noise, every deterministic DDIM step lands exactly on
    x_{t-1} = sqrt(a_{t-1}) x_0 + sqrt(1 - a_{t-1}) eps, and the x_0 prediction is x_0."""
    images, noises = _data(1)
    ones = jnp.ones((4, 1, 1, 1))
    noise, signal = diffusion.cosine_schedule(ones)
    x = diffusion.add_noise(images, noises, noise, signal)
    for step in range(steps):
        times, next_times = diffusion.reverse_diffusion_times(step, steps)
        noise, signal = diffusion.cosine_schedule(ones * times)
        pred_images = diffusion.predict_images(x, noises, noise, signal)
        np.testing.assert_allclose(pred_images, images, atol=1e-4)
        next_noise, next_signal = diffusion.cosine_schedule(ones * next_times)
        x = diffusion.ddim_step(pred_images, noises, next_noise, next_signal)
        np.testing.assert_allclose(x, diffusion.add_noise(images, noises, next_noise, next_signal), atol=1e-4)
    assert next_times == pytest.approx(0.0)


def test_sigma_is_zero_for_eta_zero_and_the_ddpm_posterior_for_eta_one():
    times = jnp.array([0.9, 0.5, 0.2])
    noise, signal = diffusion.cosine_schedule(times)
    next_noise, next_signal = diffusion.cosine_schedule(times - 0.1)
    np.testing.assert_array_equal(diffusion.ddim_sigma(noise, signal, next_noise, next_signal, 0.0), 0.0)
    alpha, alpha_prev = np.asarray(signal) ** 2, np.asarray(next_signal) ** 2
    expected = np.sqrt((1 - alpha_prev) / (1 - alpha) * (1 - alpha / alpha_prev))
    np.testing.assert_allclose(diffusion.ddim_sigma(noise, signal, next_noise, next_signal, 1.0), expected, rtol=1e-5)
    np.testing.assert_allclose(
        diffusion.ddim_sigma(noise, signal, next_noise, next_signal, 0.5), 0.5 * expected, rtol=1e-5
    )


def test_stochastic_step_keeps_the_marginal_noise_level():
    """DDIM eq. 12: direction^2 + sigma^2 = 1 - a_{t-1}, so the total noise variance is unchanged."""
    images, noises = _data(2, (20000,))
    fresh = normal(3, (20000,))
    noise, signal = diffusion.cosine_schedule(jnp.float32(0.6))
    next_noise, next_signal = diffusion.cosine_schedule(jnp.float32(0.4))
    sigma = diffusion.ddim_sigma(noise, signal, next_noise, next_signal, 1.0)
    assert float(sigma) > 0
    x = diffusion.ddim_step(jnp.zeros_like(images), noises, next_noise, next_signal, sigma, fresh)
    np.testing.assert_allclose(float(jnp.var(x)), float(next_noise) ** 2, rtol=0.05)


def test_reverse_times_walk_from_one_to_zero():
    steps = 4
    pairs = [diffusion.reverse_diffusion_times(s, steps) for s in range(steps)]
    np.testing.assert_allclose([p[0] for p in pairs], [1.0, 0.75, 0.5, 0.25])
    np.testing.assert_allclose([p[1] for p in pairs], [0.75, 0.5, 0.25, 0.0], atol=1e-12)


def test_training_times_are_uniform_in_unit_interval():
    times = diffusion.sample_diffusion_times(jax.random.key(0), 4096)
    assert times.shape == (4096, 1, 1, 1)
    assert 0.0 <= float(times.min()) and float(times.max()) < 1.0
    assert abs(float(times.mean()) - 0.5) < 0.02
