"""The recipe's options: prediction target, loss and weighting, schedule, attention, every-block embedding, dropout."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim import objective as objective_lib
from ddim import compilation
from ddim.config import ConfigError
from ddim.model import DiffusionModel, init_variables
from ddim.objective import NoisyBatch, Objective
from ddim.sampling import process
from ddim.spec import SamplingSpec
from ddim.train import state as state_lib
from tests.conftest import run_once, tiny_config, uniform

# Every option, in two tiny runs (one compile each: the suite's time is CI's budget): the first has every
# option that changes the network or the objective, the second the remaining values of each.
EVERY_OPTION = (
    'model.prediction="velocity"', "model.attention_resolutions=[8]", "model.attention_heads=2",
    'model.embedding_injection="every-block"', "model.dropout=0.1", 'train.loss="mse"',
    'train.loss_weighting="min-snr"', 'train.lr_schedule="cosine"', "train.warmup_steps=2", "train.grad_clip=1.0",
    "train.max_steps=8",
)
OTHER_VALUES = (
    'train.loss_weighting="p2"', "model.attention_resolutions=[8, 16]", "model.dropout=0.2", "train.warmup_steps=3",
)


def _batch(config, count=4, seed=0):
    size = config.model.image_size
    images = np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    return {"image": jnp.asarray(images), "label": jnp.full((count,), -1, jnp.int32)}


def _steps(config, count=3):
    state = state_lib.create_train_state(config, jax.random.key(0))
    objective = Objective.of(config.model, config)
    step = jax.jit(functools.partial(state_lib.train_step, ema_decay=0.999, ema_warmup=True, objective=objective))
    # Compiled the cheap way (LLVM optimisations off): a few steps of a tiny model, where compiling dominates.
    step = compilation.compile_for_one_call(step, state, _batch(config, seed=0), jax.random.key(1))
    metrics = []
    for i in range(count):
        state, m = step(state, _batch(config, seed=i), jax.random.key(1))
        metrics.append({k: float(v) for k, v in m.items()})
    return state, metrics


# --- the maths against hand computations --------------------------------------------------------


def test_velocity_and_noise_give_the_same_clean_image_from_a_consistent_pair():
    rng = np.random.default_rng(0)
    images, noises = rng.normal(size=(2, 3, 4, 4, 3)).astype(np.float32)
    signal = np.array([0.3, 0.95, 0.02]).reshape(3, 1, 1, 1).astype(np.float32)
    noise = np.sqrt(1 - signal**2)
    noisy = signal * images + noise * noises
    v = objective_lib.velocity(images, noises, noise, signal)
    by_noise = Objective(prediction="noise").predictions(noises, noisy, noise, signal)
    by_velocity = Objective(prediction="velocity").predictions(v, noisy, noise, signal)
    for got in (by_noise, by_velocity):
        np.testing.assert_allclose(got[0], noises, atol=2e-4)
        np.testing.assert_allclose(got[1], images, atol=2e-4 / 0.02)
    np.testing.assert_allclose(by_velocity[1], by_noise[1], rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(by_velocity[1][:2], images[:2], atol=1e-5)  # no division by a small signal rate


@pytest.mark.parametrize(
    "prediction,loss,weighting,expected",
    [
        # SNR 0.25 (alpha 0.4472, sigma 0.8944) and 9 (alpha 0.9487, sigma 0.3162), gamma 5, k 1.
        ("noise", "mse", "min-snr", [0.25 / 0.25, 5 / 9]),
        ("velocity", "mse", "min-snr", [0.25 / 1.25, 5 / 10]),
        ("noise", "mse", "p2", [1 / 1.25, 1 / 10]),
        ("velocity", "mse", "p2", [0.25 / 1.25 / 1.25, 9 / 10 / 10]),
        ("noise", "mae", "min-snr", [1.0, (5 / 9) ** 0.5]),
    ],
)
def test_weights_match_a_hand_computation(prediction, loss, weighting, expected):
    snrs = np.array([0.25, 9.0]).reshape(2, 1, 1, 1)
    signal = np.sqrt(snrs / (1 + snrs))
    noise = np.sqrt(1 / (1 + snrs))
    weights = Objective(prediction=prediction, loss=loss, weighting=weighting).example_weights(noise, signal)
    np.testing.assert_allclose(np.asarray(weights).ravel(), expected, rtol=1e-5)
    assert Objective(prediction=prediction, loss=loss).example_weights(noise, signal) is None


def test_weighted_loss_is_the_batch_mean_of_weighted_example_means():
    rng = np.random.default_rng(1)
    shape = (3, 4, 4, 3)
    images, noises, outputs = (rng.normal(size=shape).astype(np.float32) for _ in range(3))
    signal = np.array([0.2, 0.6, 0.9], np.float32).reshape(3, 1, 1, 1)
    noise = np.sqrt(1 - signal**2)
    batch = NoisyBatch(images, noises, noise, signal, signal * images + noise * noises)
    objective = Objective(prediction="velocity", loss="mse", weighting="min-snr")
    per_example = ((outputs - objective.target(batch)) ** 2).mean(axis=(1, 2, 3))
    weights = np.minimum(signal**2 / noise**2, 5.0).ravel() / (signal**2 / noise**2 + 1).ravel()
    np.testing.assert_allclose(objective.loss_value(batch, outputs), (weights * per_example).mean(), rtol=1e-5)


def test_learning_rate_schedules():
    warm = tiny_config("train.warmup_steps=10", "train.learning_rate=0.01")
    schedule = state_lib.learning_rate(warm)
    np.testing.assert_allclose([schedule(0), schedule(5), schedule(10), schedule(50)], [0, 0.005, 0.01, 0.01])
    cosine = tiny_config('train.lr_schedule="cosine"', "train.warmup_steps=10", "train.learning_rate=0.01")
    schedule = state_lib.learning_rate(cosine, total_steps=110)
    np.testing.assert_allclose([schedule(10), schedule(60), schedule(110)], [0.01, 0.005, 0.0], atol=1e-7)
    fixed = tiny_config('train.lr_schedule="cosine"', "train.warmup_steps=10", "train.lr_decay_steps=110",
                        "train.learning_rate=0.01")
    np.testing.assert_allclose(state_lib.learning_rate(fixed, total_steps=20)(60), 0.005, rtol=1e-6)
    assert state_lib.learning_rate(tiny_config()) == tiny_config().train.learning_rate  # a float, as before
    with pytest.raises(ConfigError, match="max_steps"):
        state_lib.learning_rate(tiny_config('train.lr_schedule="cosine"', "train.max_steps=0"))


@pytest.mark.parametrize(
    "override,message",
    [
        ('model.prediction="x0"', "model.prediction"),
        ('train.loss_weighting="snr"', "train.loss_weighting"),
        ("model.attention_resolutions=[5]", "no UNet level is 5x5"),
        ("model.attention_heads=3", "must divide"),
        ("model.dropout=1.0", "model.dropout"),
        ("train.grad_clip=-1", "train.grad_clip"),
    ],
)
def test_bad_recipe_options_are_one_line_errors(override, message):
    extra = ["model.attention_resolutions=[8]"] if "heads" in override else []
    with pytest.raises(ConfigError, match=message):
        tiny_config(*extra, override)


# --- each option on a tiny model ----------------------------------------------------------------


@pytest.mark.parametrize("options", [
    pytest.param(EVERY_OPTION, id="every-option"),
    pytest.param(OTHER_VALUES, id="other-values", marks=pytest.mark.slow),
])
def test_options_train_sample_and_round_trip_through_a_checkpoint(options, tmp_path):
    from ddim.checkpoint import Checkpointer, load_ema

    config = tiny_config(*options)
    state, metrics = _steps(config, count=2)
    assert all(np.isfinite(v) for m in metrics for v in m.values())
    assert all("loss" in m for m in metrics)  # the optimised loss is reported when it is not the noise MAE
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=1)
    checkpointer.save(3, state_lib.state_to_dict(state), config)
    checkpointer.wait()
    checkpointer.close()
    loaded = load_ema(tmp_path)
    assert loaded.config == config
    model = DiffusionModel(loaded.config.model)
    images = run_once(lambda variables, key: process.generate(model, variables, key, 2, SamplingSpec(steps=2)),
                      loaded.variables, jax.random.key(0))
    assert images.shape == (2, 16, 16, 3) and bool(jnp.isfinite(images).all())


@pytest.mark.slow
def test_attention_and_every_block_start_as_the_plain_network():
    """Zero-initialised projections: a new option leaves the untrained network's output unchanged."""
    plain, extended = tiny_config(), tiny_config("model.attention_resolutions=[8, 16]",
                                                'model.embedding_injection="every-block"')
    x = uniform(1, (2, 16, 16, 3))
    outputs = []
    for config in (plain, extended):
        model = DiffusionModel(config.model)
        variables = run_once(lambda k: init_variables(model, k), jax.random.key(0))
        # A non-zero head, so the output depends on everything before it.
        params = jax.tree_util.tree_map_with_path(
            lambda p, a: a + 0.1 if "head" in jax.tree_util.keystr(p) else a, variables["params"])
        _, out = model.apply({**variables, "params": params}, x, jax.random.key(2), train=False)
        outputs.append(out)
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_the_default_objective_trains_bit_for_bit_as_before():
    """The Keras example's objective through ddim/objective.py gives the bits of the frozen old step."""
    from tests.legacy_train_step import LegacyDiffusionModel, legacy_train_step

    config = tiny_config()
    state = state_lib.create_train_state(config, jax.random.key(0))
    legacy_state = state.replace(apply_fn=LegacyDiffusionModel(config.model).apply)
    new = jax.jit(functools.partial(state_lib.train_step, ema_decay=0.999, ema_warmup=True))
    old = jax.jit(functools.partial(legacy_train_step, ema_decay=0.999, ema_warmup=True,
                                    update_ema=state_lib.update_ema))
    for i in range(3):
        batch = _batch(config, seed=i)
        state, metrics = new(state, batch, jax.random.key(1))
        legacy_state, legacy_metrics = old(legacy_state, batch["image"], jax.random.key(1))
        assert float(metrics["noise_loss"]) == float(legacy_metrics["noise_loss"])
        assert float(metrics["image_loss"]) == float(legacy_metrics["image_loss"])
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(legacy_state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
