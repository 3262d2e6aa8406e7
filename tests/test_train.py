"""Training (ddim/train.py): the step's updates, learning, NaN guard, interruption and exact resume."""

import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim import train as train_lib
from ddim.checkpoint import Checkpointer, checkpoint_dir
from tests.conftest import mock_flowers, tiny_config


def _images(seed, n=8, size=16):
    return np.asarray(jax.random.randint(jax.random.key(seed), (n, size, size, 3), 0, 256), np.uint8)


def _copy(tree):
    return jax.tree.map(np.array, tree)


def test_ema_decay_warms_up():
    decays = [float(train_lib.ema_decay_at(s, 0.999, True)) for s in (0, 1, 10, 100, 10_000)]
    assert decays[0] == pytest.approx(0.1) and decays[1] == pytest.approx(2 / 11)
    assert decays == sorted(decays) and decays[-1] == pytest.approx(0.999)
    assert float(train_lib.ema_decay_at(0, 0.999, False)) == pytest.approx(0.999)


def test_one_train_step_updates_params_ema_and_batch_stats():
    config = tiny_config()
    state = train_lib.create_train_state(config, jax.random.key(0))
    before = _copy(train_lib.state_to_dict(state))
    step_fn, _ = train_lib.compiled_steps(config.train.ema_decay, True)
    state, metrics = step_fn(state, _images(1), jax.random.key(1))
    after = _copy(train_lib.state_to_dict(state))
    assert int(state.step) == 1
    assert np.isfinite(float(metrics["noise_loss"])) and np.isfinite(float(metrics["image_loss"]))
    # Step 1: only the zero-initialised head gets a gradient (nothing flows back through zeros).
    assert np.abs(after["params"]["network"]["head"]["kernel"]).min() > 0
    # Step 2: with a non-zero head every parameter gets a gradient, and Adam moves each one.
    state2, _ = step_fn(state, _images(2), jax.random.key(1))
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


def test_loss_goes_down_on_a_tiny_config():
    config = tiny_config("train.learning_rate=3e-3")
    state = train_lib.create_train_state(config, jax.random.key(0))
    step_fn, _ = train_lib.compiled_steps(config.train.ema_decay, True)
    data = [_smooth_images(i) for i in range(4)]
    losses = []
    for step in range(40):
        state, metrics = step_fn(state, data[step % 4], jax.random.key(0))
        losses.append(float(metrics["noise_loss"]))
    assert np.mean(losses[-8:]) < 0.8 * np.mean(losses[:8]), losses


def _smooth_images(seed):
    """Learnable structure: smooth colour gradients rather than white noise."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, 16)
    images = rng.uniform(0.2, 1, (8, 1, 1, 3)) * (ramp[None, :, None, None] + ramp[None, None, :, None]) / 2
    return (images * 255).astype(np.uint8)


def test_eval_step_uses_ema_weights_and_is_deterministic():
    config = tiny_config()
    state = train_lib.create_train_state(config, jax.random.key(0))
    _, eval_fn = train_lib.compiled_steps(config.train.ema_decay, True)
    a = eval_fn(state, _images(2), jax.random.key(3))
    b = eval_fn(state, _images(2), jax.random.key(3))
    assert float(a["noise_loss"]) == float(b["noise_loss"])
    # The untrained EMA model predicts zero noise: the MAE of standard normal noise, ~0.8.
    assert float(a["noise_loss"]) == pytest.approx(np.sqrt(2 / np.pi), abs=0.05)


def test_training_writes_checkpoints_tensorboard_and_grid(trained_workdir):
    checkpointer = Checkpointer(checkpoint_dir(trained_workdir))
    assert checkpointer.all_steps() == [4, 6]
    assert list((trained_workdir / "tensorboard").glob("events.out.tfevents.*"))
    assert list((trained_workdir / "samples").glob("step_*.png"))
    config = checkpointer.restore_config(6)
    assert config.model.widths == [8, 16]
    checkpointer.close()


def _params(workdir, step):
    checkpointer = Checkpointer(checkpoint_dir(workdir))
    state = checkpointer.restore_state(step)
    checkpointer.close()
    return state


def test_resume_gives_the_same_result_as_an_uninterrupted_run(tmp_path):
    with mock_flowers():
        straight = train_lib.train(tiny_config("train.max_steps=7"), tmp_path / "straight", log=lambda m: None)
        first = train_lib.train(tiny_config("train.max_steps=3"), tmp_path / "resumed", log=lambda m: None)
        second = train_lib.train(tiny_config("train.max_steps=7"), tmp_path / "resumed", log=lambda m: None)
    assert (first.final_step, second.start_step, second.final_step) == (3, 3, 7)
    a, b = _params(tmp_path / "straight", 7), _params(tmp_path / "resumed", 7)
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert straight.last_metrics == second.last_metrics


def test_resume_refuses_a_different_model(trained_workdir, tmp_path):
    import shutil

    workdir = tmp_path / "copy"
    shutil.copytree(trained_workdir, workdir)
    with mock_flowers(), pytest.raises(train_lib.TrainingError, match="model.widths"):
        train_lib.train(tiny_config("model.widths=[8, 8]", "train.max_steps=8"), workdir, log=lambda m: None)


def _patched_steps(monkeypatch, after_step):
    """Wrap the compiled train step to call ``after_step(step_number)`` after each step."""
    real = train_lib.compiled_steps
    counter = {"n": 0}

    def fake(decay, warmup, mesh=None):
        step_fn, eval_fn = real(decay, warmup, mesh)

        def wrapped(state, images, rng):
            state, metrics = step_fn(state, images, rng)
            counter["n"] += 1
            return state, after_step(counter["n"], metrics)

        return wrapped, eval_fn

    monkeypatch.setattr(train_lib, "compiled_steps", fake)


def test_non_finite_loss_stops_with_a_clear_error_and_keeps_the_good_checkpoint(tmp_path, monkeypatch):
    def poison(n, metrics):
        return {**metrics, "noise_loss": jnp.float32(jnp.nan)} if n == 6 else metrics

    _patched_steps(monkeypatch, poison)
    with mock_flowers(), pytest.raises(train_lib.TrainingError, match=r"non-finite loss at step 6.*last good checkpoint is step 4"):
        train_lib.train(tiny_config("train.max_steps=8"), tmp_path, log=lambda m: None)
    checkpointer = Checkpointer(checkpoint_dir(tmp_path))
    assert checkpointer.all_steps() == [4]
    state = checkpointer.restore_state(4)
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state))
    checkpointer.close()


def test_sigterm_saves_and_stops_then_resumes(tmp_path, monkeypatch):
    def terminate(n, metrics):
        if n == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    _patched_steps(monkeypatch, terminate)
    with mock_flowers():
        result = train_lib.train(tiny_config("train.max_steps=8", "train.eval_every=0"), tmp_path, log=lambda m: None)
    assert result.interrupted and result.final_step == 3
    assert Checkpointer(checkpoint_dir(tmp_path)).latest_step() == 3
    monkeypatch.undo()
    with mock_flowers():
        resumed = train_lib.train(tiny_config("train.max_steps=8", "train.eval_every=0"), tmp_path, log=lambda m: None)
    assert (resumed.start_step, resumed.final_step, resumed.interrupted) == (3, 8, False)


def test_python_stays_at_most_two_steps_ahead_of_the_device(tmp_path, monkeypatch):
    """Async dispatch is bounded, so Ctrl-C is seen within a couple of steps, not `log_every`."""
    big = jnp.ones((1024, 1024), jnp.float32) / 1024.0
    # ~0.1 s of device work per step, far slower than the host loop's dispatch.
    slow = jax.jit(lambda loss: loss + 0.0 * jax.lax.fori_loop(0, 8, lambda i, a: a @ a, big)[0, 0])
    outputs, unfinished = [], []

    def record(n, metrics):
        unfinished.append(sum(not out.is_ready() for out in outputs))
        metrics = {**metrics, "noise_loss": slow(metrics["noise_loss"])}
        outputs.append(metrics["noise_loss"])
        return metrics

    _patched_steps(monkeypatch, record)
    with mock_flowers():
        config = tiny_config("train.max_steps=10", "train.log_every=100", "train.checkpoint_every=100",
                             "train.eval_every=0")
        train_lib.train(config, tmp_path, log=lambda m: None)
    assert len(unfinished) == 10 and max(unfinished) <= train_lib.MAX_STEPS_AHEAD


def test_crash_while_logging_saves_the_state(tmp_path, monkeypatch):
    """A failure right after a metrics fetch (nothing pending) still saves the intact state."""

    def broken_log(*args, **kwargs):
        raise OSError("simulated logging failure")

    monkeypatch.setattr(train_lib, "_log_metrics", broken_log)
    with mock_flowers(), pytest.raises(OSError, match="simulated logging failure"):
        train_lib.train(tiny_config("train.max_steps=8", "train.eval_every=0"), tmp_path, log=lambda m: None)
    assert Checkpointer(checkpoint_dir(tmp_path)).latest_step() == 2


def test_crash_saves_the_last_finite_state(tmp_path, monkeypatch):
    real_batches = train_lib.data_lib.train_batches

    def failing_batches(*args, **kwargs):
        for n, batch in enumerate(real_batches(*args, **kwargs)):
            if n == 3:
                raise OSError("simulated input pipeline crash")
            yield batch

    monkeypatch.setattr(train_lib.data_lib, "train_batches", failing_batches)
    with mock_flowers(), pytest.raises(OSError, match="simulated input pipeline crash"):
        train_lib.train(tiny_config("train.max_steps=8", "train.eval_every=0"), tmp_path, log=lambda m: None)
    # Three steps ran before the crash and their losses were finite: that state is saved.
    assert Checkpointer(checkpoint_dir(tmp_path)).latest_step() == 3


def test_kid_monitor_logs_kid_and_keeps_the_best_checkpoint(tmp_path):
    """KID during training, with a small *random* feature network injected in place of InceptionV3
    (the real monitor refuses to run without the InceptionV3 weights)."""
    import json

    from tests.test_evaluation import tiny_extractor

    overrides = ["train.kid_images=8", "train.kid_steps=2", "train.eval_every=1", "train.max_steps=8"]
    with mock_flowers():
        train_lib.train(tiny_config(*overrides), tmp_path, log=lambda m: None, kid_extractor_factory=tiny_extractor)
    best = json.loads((tmp_path / "best" / "best.json").read_text())
    assert best["step"] in (4, 8) and np.isfinite(best["kid"])
    assert Checkpointer(tmp_path / "best").all_steps() == [best["step"]]
    assert list((tmp_path / "eval_cache").glob("real_*.npz"))


def test_kid_monitor_without_weights_warns_and_trains_on(tmp_path, monkeypatch):
    monkeypatch.setenv("DDIM_INCEPTION_WEIGHTS", str(tmp_path / "missing.h5"))
    messages = []
    with mock_flowers():
        result = train_lib.train(tiny_config("train.kid_images=8", "train.max_steps=2"), tmp_path / "run",
                                 log=messages.append)
    assert result.final_step == 2
    assert any(m.startswith("warning: KID monitoring is off") for m in messages), messages
