"""Shapes, dtypes and defining properties of the network (ddim/nn/) and the model (ddim/model.py)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim.config import ModelConfig
from ddim.model import DiffusionModel, init_variables
from ddim.nn import ResidualBlock, UNet, sinusoidal_embedding
from ddim.nn.layers import BatchNorm
from ddim.sampling import map_batches, process, programs
from ddim.spec import SamplingSpec
from tests.conftest import normal, run_once, tiny_config, uniform

TINY_MODEL = ModelConfig(image_size=16, widths=(8, 16), block_depth=1, embedding_dims=8)


def test_sinusoidal_embedding_layout():
    variances = jnp.array([0.0, 0.5]).reshape(2, 1, 1, 1)
    emb = sinusoidal_embedding(variances, 32, 1.0, 1000.0)
    assert emb.shape == (2, 1, 1, 32) and emb.dtype == jnp.float32
    np.testing.assert_allclose(emb[0, 0, 0, :16], 0.0, atol=1e-7)  # sin(0)
    np.testing.assert_allclose(emb[0, 0, 0, 16:], 1.0, atol=1e-7)  # cos(0)
    frequencies = np.exp(np.linspace(np.log(1.0), np.log(1000.0), 16))
    np.testing.assert_allclose(emb[1, 0, 0, :16], np.sin(2 * np.pi * frequencies * 0.5), atol=2e-3)


@pytest.mark.parametrize("in_width,width", [(8, 8), (8, 12)])
def test_residual_block_shapes_and_skip(in_width, width):
    block = ResidualBlock(width)
    x = normal(0, (2, 8, 8, in_width))
    variables = run_once(lambda k, x: block.init(k, x, train=True), jax.random.key(1), x)
    y, updates = run_once(lambda v, x: block.apply(v, x, train=True, mutable=["batch_stats"]), variables, x)
    assert y.shape == (2, 8, 8, width) and y.dtype == jnp.float32
    assert ("skip" in variables["params"]) == (in_width != width)
    # BatchNorm without scale/offset: only running statistics, no BN parameters.
    assert set(variables["batch_stats"]) == {"BatchNorm_0"}
    assert not any("BatchNorm" in name for name in variables["params"])



@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_batch_norm_is_flax_batch_norm_without_scale_or_offset(dtype):
    # The same variables (so every checkpoint and bundle loads), outputs and running statistics as the
    # flax layer the blocks used before, in training and inference mode.
    ours, flax_bn = BatchNorm(use_running_average=False, dtype=dtype), nn.BatchNorm(
        use_running_average=False, use_bias=False, use_scale=False, momentum=0.99, epsilon=1e-3, dtype=dtype)
    x = (2.0 + 3.0 * normal(0, (4, 5, 5, 6))).astype(dtype)
    variables = ours.init(jax.random.key(0), x)
    assert jax.tree.map(jnp.shape, variables) == jax.tree.map(jnp.shape, flax_bn.init(jax.random.key(0), x))
    (y, updates), (want_y, want_updates) = (
        bn.apply(variables, x, mutable=["batch_stats"]) for bn in (ours, flax_bn))
    assert y.dtype == want_y.dtype == dtype
    tolerance = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(want_y, np.float32), atol=tolerance)
    for got, want in zip(jax.tree.leaves(updates), jax.tree.leaves(want_updates)):
        np.testing.assert_allclose(got, want, rtol=1e-5)
    inference = [bn.clone(use_running_average=True).apply(updates, x) for bn in (ours, flax_bn)]
    np.testing.assert_allclose(np.asarray(inference[0], np.float32), np.asarray(inference[1], np.float32),
                               atol=tolerance)

def test_unet_output_shape_and_zero_initialised_head():
    net = UNet(ModelConfig(widths=(8, 16, 24), block_depth=2, embedding_dims=8))
    x = normal(0, (3, 16, 16, 3))
    variances = jnp.full((3, 1, 1, 1), 0.3)
    variables = run_once(lambda k: net.init(k, x, variances, train=True), jax.random.key(1))
    np.testing.assert_array_equal(variables["params"]["head"]["kernel"], 0.0)
    out, _ = run_once(lambda v: net.apply(v, x, variances, train=True, mutable=["batch_stats"]), variables)
    assert out.shape == x.shape and out.dtype == jnp.float32
    np.testing.assert_array_equal(out, 0.0)


def test_keras_reference_parameter_count():
    """The flowers64 network has the Keras example's structure (and so its parameter count)."""
    model = DiffusionModel(tiny_config("model.image_size=64", "model.widths=[32, 64, 96, 128]",
                                     "model.block_depth=2", "model.embedding_dims=32").model)
    shapes = jax.eval_shape(lambda: init_variables(model, jax.random.key(0)))
    count = sum(np.prod(x.shape) for x in jax.tree.leaves(shapes["params"]))
    assert count == 1_950_627


def test_diffusion_model_forward_outputs():
    model = DiffusionModel(TINY_MODEL)
    variables = run_once(lambda k: init_variables(model, k), jax.random.key(0))
    images = uniform(1, (4, 16, 16, 3))
    (batch, outputs), updates = run_once(
        lambda v, x, k: model.apply(v, x, k, train=True, mutable=["batch_stats"]), variables, images, jax.random.key(2)
    )
    pred_noises, pred_images = model.objective.predictions(outputs, batch.noisy_images, batch.noise_rates,
                                                           batch.signal_rates)
    for array in (batch.noises, batch.images, batch.noisy_images, outputs, pred_noises, pred_images):
        assert array.shape == (4, 16, 16, 3) and array.dtype == jnp.float32
    # The untrained (zero-head) model predicts zero noise, so its image estimate is x_t / signal_rate.
    np.testing.assert_array_equal(pred_noises, 0.0)
    np.testing.assert_allclose(pred_images, batch.noisy_images / batch.signal_rates, rtol=1e-6)
    # Training mode normalises with batch statistics: per-channel mean 0, variance ~1.
    clean = batch.images
    np.testing.assert_allclose(clean.mean(axis=(0, 1, 2)), 0.0, atol=1e-5)
    np.testing.assert_allclose(clean.var(axis=(0, 1, 2)), 1.0, rtol=0.05)
    assert set(updates["batch_stats"]) == {"normalizer", "network"}


@pytest.fixture(scope="module")
def tiny_model_and_variables():
    model = DiffusionModel(TINY_MODEL)
    variables = run_once(lambda k: init_variables(model, k), jax.random.key(0))
    # Make the head non-zero so generation depends on the network, and set image statistics.
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: normal(len(path), x.shape, 0.05) if "head" in str(path) else x,
        variables["params"],
    )
    stats = dict(variables["batch_stats"])
    stats["normalizer"] = {"mean": jnp.array([0.4, 0.5, 0.3]), "var": jnp.array([0.05, 0.06, 0.07])}
    return model, {"params": params, "batch_stats": stats}


def test_generate_shape_range_and_determinism(tiny_model_and_variables):
    model, variables = tiny_model_and_variables

    def generate(seed):  # the seeded sampling program of ddim sample and Pipeline.generate, before uint8
        return map_batches(programs.sample, model, variables, SamplingSpec(steps=4), count=3,
                           traced=(jnp.float32(0),), seed=seed)

    a, b, c = generate(0), generate(0), generate(1)
    assert a.shape == (3, 16, 16, 3) and a.dtype == np.float32
    assert 0.0 <= float(a.min()) and float(a.max()) <= 1.0
    np.testing.assert_array_equal(a, b)
    assert float(jnp.abs(a - c).mean()) > 1e-3


def test_generate_eta_zero_ignores_fresh_noise_and_eta_positive_uses_it(tiny_model_and_variables):
    model, variables = tiny_model_and_variables
    noise = normal(5, (2, 16, 16, 3))

    @jax.jit
    def run_jit(key, eta):
        return process.generate(model, variables, key, 2, SamplingSpec(steps=4), eta=eta, latents=noise)

    def run(key, eta):
        return run_jit(jax.random.key(key), jnp.float32(eta))

    # Same initial noise, different keys: deterministic DDIM ignores the key, eta > 0 does not.
    np.testing.assert_array_equal(run(0, 0.0), run(1, 0.0))
    assert float(jnp.abs(run(0, 1.0) - run(1, 1.0)).mean()) > 1e-4
    assert float(jnp.abs(run(0, 1.0) - run(0, 0.0)).mean()) > 1e-4


def test_generate_with_one_step_and_denormalisation(tiny_model_and_variables):
    model, variables = tiny_model_and_variables
    zero_head = jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.zeros_like(x) if "head" in str(path) else x, variables["params"]
    )
    noise = jnp.zeros((1, 16, 16, 3))
    out = jax.jit(lambda v: process.generate(model, v, jax.random.key(0), 1, SamplingSpec(steps=1),
                                             latents=noise))({**variables, "params": zero_head})
    # Zero noise in, zero noise predicted: x_0 = 0 in normalised units. Sampling denormalises with the
    # normaliser's *running* statistics (there is no batch to take statistics from), so this is their mean.
    np.testing.assert_allclose(out[0, 0, 0], [0.4, 0.5, 0.3], atol=1e-6)


def test_generate_rejects_non_positive_steps():
    with pytest.raises(ValueError, match="diffusion steps"):
        SamplingSpec(steps=0)
