"""Samplers and time spacings (ddim/samplers.py): exactness, convergence order, the bit-identical default."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim import diffusion, samplers
from ddim.config import ModelConfig
from ddim.model import DiffusionModel, init_variables
from ddim.sampling import process
from ddim.spec import SamplingSpec
from tests.conftest import normal

MIN_SIGNAL, MAX_SIGNAL = 0.02, 0.95


def schedule(times):
    return diffusion.cosine_schedule(times, MIN_SIGNAL, MAX_SIGNAL)


def grid(spacing, steps, start=1.0):
    return samplers.time_grid(spacing, steps, MIN_SIGNAL, MAX_SIGNAL, start)


# --- time grids ---------------------------------------------------------------------------------


def test_uniform_grid_is_ddims():
    g = grid("uniform", 4)
    np.testing.assert_allclose(g.times, [1.0, 0.75, 0.5, 0.25])
    np.testing.assert_allclose(g.next_times, [0.75, 0.5, 0.25, 0.0], atol=1e-7)
    np.testing.assert_allclose(grid("uniform", 4, start=0.5).times, [0.5, 0.375, 0.25, 0.125])


def test_logsnr_and_karras_grids_run_from_start_to_the_clean_end():
    for spacing in ("logsnr", "karras"):
        for start in (1.0, 0.6):
            times = np.asarray(grid(spacing, 6, start).times)
            assert times[0] == pytest.approx(start) and times[-1] == 0.0
            assert np.all(np.diff(times) < 0), (spacing, times)
    lambdas = samplers.Rates(*schedule(grid("logsnr", 6).times)).log_snr
    np.testing.assert_allclose(np.diff(lambdas), np.diff(lambdas)[0], rtol=1e-4)
    # Karras' rho = 7 lies between uniform in sigma (rho = 1) and uniform in log-SNR (rho -> inf):
    # its last step is longer than log-SNR's, its first one shorter.
    karras, logsnr = np.asarray(grid("karras", 6).times), np.asarray(grid("logsnr", 6).times)
    assert karras[-2] > logsnr[-2] and karras[1] > logsnr[1]
    # One step: the single evaluation is at the start, as for every spacing.
    for spacing in samplers.SPACINGS:
        np.testing.assert_allclose(grid(spacing, 1).times, [1.0])


def test_time_from_log_snr_inverts_the_schedule():
    times = jnp.linspace(0.0, 1.0, 11)
    lambdas = samplers.Rates(*schedule(times)).log_snr
    np.testing.assert_allclose(diffusion.time_from_log_snr(lambdas, MIN_SIGNAL, MAX_SIGNAL), times, atol=2e-5)


def test_reversed_grid_walks_back_over_the_same_times():
    g = grid("logsnr", 5)
    back = g.reversed()
    np.testing.assert_allclose(back.times, np.asarray(g.times)[::-1][:-1])
    np.testing.assert_allclose(back.next_times, np.asarray(g.times)[::-1][1:])
    np.testing.assert_allclose(grid("uniform", 4).reversed().times, [0.25, 0.5, 0.75], atol=1e-7)


def test_bad_names_list_the_valid_ones():
    with pytest.raises(ValueError,
                       match=r"unknown sampler 'euler' \(choose from ddim, dpmpp-2m, dpmpp-3m, consistency\)"):
        samplers.get_sampler("euler")
    with pytest.raises(ValueError, match=r"unknown spacing 'cosine' \(choose from uniform, logsnr, karras\)"):
        grid("cosine", 4)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        grid("logsnr", 0)


def test_the_solvers_and_the_cli_derive_from_the_one_registry():
    """ddim.spec names every sampler once (JAX-free, for `ddim --help`); the solvers and the CLI read it."""
    from ddim import spec
    from ddim.cli.app import SAMPLER_NAMES, SPACING_NAMES

    assert tuple(samplers.SAMPLERS) == tuple(spec.SAMPLERS) == SAMPLER_NAMES
    assert samplers.SPACINGS == tuple(spec.SPACINGS) == SPACING_NAMES
    for name, kind in spec.SAMPLERS.items():
        assert samplers.SAMPLERS[name].stochastic == kind.stochastic


# --- the solvers on problems with exact answers --------------------------------------------------


def run_sampler(denoise, x, name, spacing, steps):
    g = grid(spacing, steps)
    rng = jax.random.key(0)  # the consistency sampler's fresh noise
    return jax.jit(lambda x: samplers.run(denoise, schedule, x, g, name, rng=rng).pred_images)(x), g


@pytest.mark.slow
@pytest.mark.parametrize("spacing", samplers.SPACINGS)
def test_every_sampler_is_exact_when_the_data_is_one_point(spacing):
    """If all data is x0, the exact data prediction is x0 everywhere and every update is exact."""
    x0 = jnp.linspace(-1.0, 1.0, 16)

    def denoise(x, noise_rates, signal_rates):
        pred_noises = (x - signal_rates * x0) / noise_rates
        return pred_noises, diffusion.predict_images(x, pred_noises, noise_rates, signal_rates)

    noise = normal(0, x0.shape)
    for name in samplers.SAMPLERS:
        images, _ = run_sampler(denoise, noise, name, spacing, 5)
        np.testing.assert_allclose(images, x0, atol=1e-5, err_msg=name)


# Data ~ N(MU, SCALE^2) per dimension: E[eps | x_t] is linear in x_t, and the probability-flow ODE keeps
# z = (x_t - alpha_t MU) / sqrt(alpha_t^2 SCALE^2 + sigma_t^2) constant, so its solution is known exactly.
MU, SCALE = 0.3, 0.5


def gaussian_denoise(x, noise_rates, signal_rates):
    pred_noises = noise_rates * (x - signal_rates * MU) / (signal_rates**2 * SCALE**2 + noise_rates**2)
    return pred_noises, diffusion.predict_images(x, pred_noises, noise_rates, signal_rates)


def exact_gaussian_sample(noise, end_time):
    """The exact ODE solution from ``noise`` at t = 1 to ``end_time``, then its data prediction there."""
    start_noise, start_signal = schedule(1.0)
    end_noise, end_signal = schedule(end_time)
    z = (noise - start_signal * MU) / jnp.sqrt(start_signal**2 * SCALE**2 + start_noise**2)
    x = end_signal * MU + jnp.sqrt(end_signal**2 * SCALE**2 + end_noise**2) * z
    return gaussian_denoise(x, end_noise, end_signal)[1]


@functools.cache
def gaussian_errors(name, spacing, steps=(16, 32, 64)):
    noise = normal(0, (512,))
    errors = []
    for count in steps:
        images, g = run_sampler(gaussian_denoise, noise, name, spacing, count)
        exact = exact_gaussian_sample(noise, g.times[-1])
        errors.append(float(jnp.sqrt(jnp.mean((images - exact) ** 2))))
    return np.array(errors)


@pytest.mark.parametrize(
    "spacing", ["logsnr", pytest.param("uniform", marks=pytest.mark.slow), pytest.param("karras", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("name,order", [("ddim", 1.0), ("dpmpp-2m", 2.0)])
def test_error_order_on_a_gaussian_toy_problem(name, order, spacing):
    """Doubling the steps divides the error by about 2 for DDIM and 4 for DPM-Solver++(2M).

    (Karras' grid is not yet in the asymptotic regime at 16-64 steps: 2M converges faster than order 2 there.)
    """
    errors = gaussian_errors(name, spacing)
    measured = np.log2(errors[:-1] / errors[1:])
    assert np.all(measured > order - 0.5) and np.all(measured < order + 1.0), (errors, measured)
    if spacing != "karras":
        assert measured[-1] == pytest.approx(order, abs=0.35), (errors, measured)
    assert errors[-1] < (2e-4 if order == 2 else 1e-2), errors


@pytest.mark.slow
def test_higher_order_samplers_are_closer_at_the_same_step_count():
    for spacing in ("uniform", "logsnr"):
        ddim, second, third = (gaussian_errors(name, spacing) for name in ("ddim", "dpmpp-2m", "dpmpp-3m"))
        assert np.all(second < ddim / 5) and np.all(third < ddim / 5), (ddim, second, third)


@pytest.mark.slow
def test_stochastic_ddim_needs_an_rng_and_deterministic_samplers_ignore_eta():
    noise = normal(0, (64,))
    g = grid("logsnr", 4)
    with pytest.raises(ValueError, match="needs an rng"):
        samplers.run(gaussian_denoise, schedule, noise, g, "ddim", eta=1.0)
    a = samplers.run(gaussian_denoise, schedule, noise, g, "dpmpp-2m", eta=1.0, rng=jax.random.key(1))
    b = samplers.run(gaussian_denoise, schedule, noise, g, "dpmpp-2m")
    np.testing.assert_array_equal(a.pred_images, b.pred_images)


@pytest.mark.slow
def test_trajectory_holds_every_steps_prediction_and_the_hook_sees_every_state():
    noise = normal(0, (8,))
    seen = []

    def hook(step, x, rates):
        jax.debug.callback(lambda s: seen.append(int(s)), step)
        return x

    result = samplers.run(gaussian_denoise, schedule, noise, grid("karras", 5), "dpmpp-2m", hook=hook,
                          keep_trajectory=True)
    assert result.trajectory.shape == (5, 8)
    np.testing.assert_array_equal(result.trajectory[-1], result.pred_images)
    assert sorted(seen) == [0, 1, 2, 3, 4]


# --- the default path on the real network ---------------------------------------------------------


@pytest.mark.slow
def test_default_sampler_gives_the_same_bits_as_the_ddim_loop_before_samplers():
    """`ddim`, `uniform` must reproduce the pixels of the pre-samplers loop (tests/legacy_sampler.py)."""
    from tests.legacy_sampler import LegacyDiffusionModel

    config = ModelConfig(image_size=16, widths=(8, 16), block_depth=1, embedding_dims=8)
    model, legacy = DiffusionModel(config), LegacyDiffusionModel(config)
    variables = init_variables(model, jax.random.key(0))
    params = jax.tree.map(lambda x: x + normal(1, x.shape, 0.05), variables["params"])
    variables = {**variables, "params": params}

    @jax.jit
    def new(rng, eta):
        return process.generate(model, variables, rng, 3, SamplingSpec(steps=20), eta=eta)

    @jax.jit
    def old(rng, eta):
        return legacy.apply(variables, rng, 3, 20, eta, method=LegacyDiffusionModel.legacy_generate)

    for eta in (0.0, 0.6):
        a, b = new(jax.random.key(3), jnp.float32(eta)), old(jax.random.key(3), jnp.float32(eta))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
