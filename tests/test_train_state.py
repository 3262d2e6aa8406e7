"""The train state and its steps (ddim/train/state.py): updates, EMA, learning, evaluation, the normaliser."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim.train import state as state_lib
from tests.conftest import tiny_config


def _images(seed, n=8, size=16):
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def _batch(images):
    """A loader batch of ``images``: ``{"image", "label"}``, every label -1 (no class)."""
    return {"image": images, "label": np.full(len(images), -1, np.int32)}


def _copy(tree):
    return jax.tree.map(np.array, tree)


def test_ema_decay_warms_up():
    decays = [float(state_lib.ema_decay_at(s, 0.999, True)) for s in (0, 1, 10, 100, 10_000)]
    assert decays[0] == pytest.approx(0.1) and decays[1] == pytest.approx(2 / 11)
    assert decays == sorted(decays) and decays[-1] == pytest.approx(0.999)
    assert float(state_lib.ema_decay_at(0, 0.999, False)) == pytest.approx(0.999)


def test_one_train_step_updates_params_ema_and_batch_stats():
    config = tiny_config()
    state = state_lib.create_train_state(config, jax.random.key(0))
    before = _copy(state_lib.state_to_dict(state))
    step_fn, _ = state_lib.compiled_steps(config)
    state, metrics = step_fn(state, _batch(_images(1)), jax.random.key(1))
    after = _copy(state_lib.state_to_dict(state))
    assert int(state.step) == 1
    assert np.isfinite(float(metrics["noise_loss"])) and np.isfinite(float(metrics["image_loss"]))
    # Step 1: only the zero-initialised head gets a gradient (nothing flows back through zeros).
    assert np.abs(after["params"]["network"]["head"]["kernel"]).min() > 0
    # Step 2: with a non-zero head every parameter gets a gradient, and Adam moves each one.
    state2, _ = step_fn(state, _batch(_images(2)), jax.random.key(1))
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), before["params"], _copy(state2.params))
    assert all(jax.tree.leaves(moved)), moved
    # EMA: decay 0.1 at step 0 (warm-up), of the initial weights and the updated ones.
    expected = jax.tree.map(lambda e, p: 0.1 * e + 0.9 * p, before["ema_params"], after["params"])
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7), after["ema_params"], expected)
    # BatchNorm running statistics moved by momentum 0.99 towards the batch statistics.
    old_mean = before["batch_stats"]["network"]["ResidualBlock_0"]["BatchNorm_0"]["mean"]
    new_mean = after["batch_stats"]["network"]["ResidualBlock_0"]["BatchNorm_0"]["mean"]
    assert not np.array_equal(old_mean, new_mean)
    jax.tree.map(
        lambda got, e, p: np.testing.assert_allclose(got, 0.1 * e + 0.9 * p, rtol=1e-5, atol=1e-7),
        after["ema_batch_stats"], before["ema_batch_stats"], after["batch_stats"],
    )


def test_eval_step_uses_ema_weights_and_is_deterministic():
    config = tiny_config()
    state = state_lib.create_train_state(config, jax.random.key(0))
    _, eval_fn = state_lib.compiled_steps(config)
    a = eval_fn(state, _batch(_images(2)), jax.random.key(3))
    b = eval_fn(state, _batch(_images(2)), jax.random.key(3))
    assert float(a["noise_loss"]) == float(b["noise_loss"])
    # The untrained EMA model predicts zero noise: the MAE of standard normal noise, ~0.8.
    assert float(a["noise_loss"]) == pytest.approx(np.sqrt(2 / np.pi), abs=0.05)


def test_to_float_range():
    out = state_lib.to_float(jnp.array([0, 128, 255], jnp.uint8))
    np.testing.assert_allclose(out, [0.0, 128 / 255, 1.0])


def test_image_statistics_read_the_images_of_batches():
    batches = [_batch(_coloured_images(i)) for i in range(3)]
    pixels = np.concatenate([b["image"] for b in batches]).reshape(-1, 3) / 255.0
    mean, var = state_lib.image_statistics(batches)
    np.testing.assert_allclose(mean, pixels.mean(0), rtol=1e-6)
    np.testing.assert_allclose(var, pixels.var(0), rtol=1e-5)


def _coloured_images(seed, n=8, size=16):
    """Images with known per-channel statistics: uniform values around channel means (0.2, 0.5, 0.7)."""
    rng = np.random.default_rng(seed)
    means = np.array([0.2, 0.5, 0.7])
    return ((means + rng.uniform(-0.15, 0.15, (n, size, size, 3))) * 255).round().astype(np.uint8)


@pytest.mark.slow
def test_normaliser_running_statistics_converge_to_the_data():
    """Training mode standardises each batch with its own statistics; the running statistics
    (momentum 0.99) converge to the data's mean and variance, whatever they started from."""
    config = tiny_config()
    state = state_lib.create_train_state(config, jax.random.key(0))  # normaliser stats: mean 0, var 1
    step_fn, _ = state_lib.compiled_steps(config)
    batches = [_coloured_images(i) for i in range(8)]
    data = np.concatenate(batches).reshape(-1, 3) / 255.0
    for step in range(1500):  # 0.99 ** 1500: nothing is left of the initial variance of 1
        state, _ = step_fn(state, _batch(batches[step % 8]), jax.random.key(1))
    stats = jax.device_get(state.batch_stats["normalizer"])
    np.testing.assert_allclose(stats["mean"], data.mean(0), atol=2e-3)
    np.testing.assert_allclose(stats["var"], data.var(0), rtol=0.05)
    # The EMA copy, which sampling uses, tracks them too.
    ema = jax.device_get(state.ema_batch_stats["normalizer"])
    np.testing.assert_allclose(ema["mean"], data.mean(0), atol=5e-3)


def test_ema_variables_of_a_state_and_of_its_checkpoint_dict_agree():
    state = state_lib.create_train_state(tiny_config(), jax.random.key(0))
    from_state = state_lib.ema_variables(state)
    from_dict = state_lib.ema_variables(state_lib.state_to_dict(state))
    jax.tree.map(np.testing.assert_array_equal, from_state, from_dict)
    assert set(from_state) == {"params", "batch_stats"}
