"""Speed levers must not change what the model learns.

The fast formulations of ``ddim/ops.py`` (matmul 1x1 convolutions, slice-based
upsampling with a hand-written adjoint) are compared with the textbook
``jax.lax`` / ``jax.image`` operations over a short real training run, and the
optional bfloat16 compute mode with float32.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim import ops
from ddim.train import state as state_lib
from tests import reference_ops
from tests.conftest import tiny_config

STEPS = 24


def _smooth_images(count: int, size: int) -> np.ndarray:
    """Images with structure (blurred colour blobs), so the denoiser has something to learn."""
    rng = np.random.default_rng(0)
    coarse = rng.uniform(0, 255, (count, 4, 4, 3))
    return np.asarray(jax.image.resize(coarse, (count, size, size, 3), "bilinear")).clip(0, 255).astype(np.uint8)


def _train(config):
    """The noise losses of ``STEPS`` training steps from the same initial state, data and keys, and the final state."""
    t = config.train
    state = state_lib.create_train_state(config, jax.random.key(0))
    images = _smooth_images(4 * t.batch_size, config.model.image_size)
    mean, var = state_lib.image_statistics([{"image": images}])
    # On one device, as the jitted step's outputs will be: no second compilation at step 2.
    state = jax.device_put(state_lib.set_normalizer_stats(state, mean, var), jax.devices()[0])
    # A fresh jit (not train.compiled_steps' cached one), so it traces whatever ops are current.
    step = jax.jit(functools.partial(state_lib.train_step, ema_decay=t.ema_decay, ema_warmup=t.ema_warmup))
    losses = []
    for i in range(STEPS):
        batch = images[(i % 4) * t.batch_size : (i % 4 + 1) * t.batch_size]
        batch = {"image": jnp.asarray(batch), "label": jnp.full((len(batch),), -1, jnp.int32)}
        state, metrics = step(state, batch, jax.random.fold_in(jax.random.key(1), i))
        losses.append(float(metrics["noise_loss"]))
    return np.asarray(losses), state


@pytest.fixture(scope="module")
def float32_losses():
    return _train(tiny_config("train.learning_rate=0.005"))[0]


def test_the_tiny_run_learns(float32_losses):
    assert float32_losses[-6:].mean() < 0.85 * float32_losses[:3].mean()


@pytest.mark.slow
def test_fast_ops_train_exactly_like_the_textbook_ops(monkeypatch, float32_losses):
    for name in ("conv2d", "average_pool_2x", "upsample_bilinear_2x"):
        monkeypatch.setattr(ops, name, getattr(reference_ops, name))
    reference, _ = _train(tiny_config("train.learning_rate=0.005"))
    # Same function, different summation order: float32 round-off only.
    np.testing.assert_allclose(float32_losses[0], reference[0], rtol=1e-5)
    np.testing.assert_allclose(float32_losses, reference, rtol=1e-4)


@pytest.mark.slow
def test_bfloat16_compute_trains_to_the_float32_loss(float32_losses):
    bf16, state = _train(tiny_config("train.learning_rate=0.005", 'model.dtype="bfloat16"'))
    assert np.isfinite(bf16).all()
    # Only the computation is bfloat16: parameters, EMA weights and statistics stay float32.
    leaves = jax.tree.leaves(state_lib.state_to_dict(state))
    assert all(x.dtype == jnp.float32 for x in leaves if jnp.issubdtype(x.dtype, jnp.floating))
    # bfloat16 keeps 8 bits of mantissa: per-step losses drift, the learning curve must not.
    np.testing.assert_allclose(bf16[0], float32_losses[0], rtol=0.02)
    np.testing.assert_allclose(bf16[-8:].mean(), float32_losses[-8:].mean(), rtol=0.05)
