"""The training loop (ddim/train/loop.py) and its periodic actions (ddim/train/actions.py):
outputs, NaN guard, interruption, crashes, exact resume and the best-KID checkpoint."""

import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim.train import actions, loop, steps
from ddim.train import state as state_lib
from ddim.checkpoint import Checkpointer, checkpoint_dir
from tests.conftest import mock_flowers, tiny_config


def test_training_writes_checkpoints_tensorboard_and_grid(trained_workdir):
    checkpointer = Checkpointer(checkpoint_dir(trained_workdir))
    assert checkpointer.all_steps() == [4, 6]
    assert list((trained_workdir / "tensorboard").glob("events.out.tfevents.*"))
    assert list((trained_workdir / "samples").glob("step_*.png"))
    config = checkpointer.restore_config(6)
    assert config.model.widths == (8, 16)
    checkpointer.close()


def _params(workdir, step):
    checkpointer = Checkpointer(checkpoint_dir(workdir))
    state = checkpointer.restore_state(step)
    checkpointer.close()
    return state


def test_resume_gives_the_same_result_as_an_uninterrupted_run(tmp_path):
    with mock_flowers():
        straight = loop.train(tiny_config("train.max_steps=7"), tmp_path / "straight", log=lambda m: None)
        first = loop.train(tiny_config("train.max_steps=3"), tmp_path / "resumed", log=lambda m: None)
        second = loop.train(tiny_config("train.max_steps=7"), tmp_path / "resumed", log=lambda m: None)
    assert (first.final_step, second.start_step, second.final_step) == (3, 3, 7)
    a, b = _params(tmp_path / "straight", 7), _params(tmp_path / "resumed", 7)
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert straight.last_metrics == second.last_metrics


def test_resume_refuses_a_different_model(trained_workdir, tmp_path):
    import shutil

    workdir = tmp_path / "copy"
    shutil.copytree(trained_workdir, workdir)
    with mock_flowers(), pytest.raises(actions.TrainingError, match="model.widths"):
        loop.train(tiny_config("model.widths=[8, 8]", "train.max_steps=8"), workdir, log=lambda m: None)


def _patched_steps(monkeypatch, after_step):
    """Wrap the compiled train step to call ``after_step(step_number)`` after each step."""
    real = state_lib.compiled_steps
    counter = {"n": 0}

    def fake(config, mesh=None, source=None):
        step_fn, eval_fn = real(config, mesh, source)

        def wrapped(state, batch, rng):
            state, metrics = step_fn(state, batch, rng)
            counter["n"] += 1
            return state, after_step(counter["n"], metrics)

        return wrapped, eval_fn

    monkeypatch.setattr(state_lib, "compiled_steps", fake)


@pytest.mark.slow
def test_non_finite_loss_stops_with_a_clear_error_and_keeps_the_good_checkpoint(tmp_path, monkeypatch):
    def poison(n, metrics):
        return {**metrics, "noise_loss": jnp.float32(jnp.nan)} if n == 6 else metrics

    _patched_steps(monkeypatch, poison)
    with mock_flowers(), pytest.raises(actions.TrainingError, match=r"non-finite loss at step 6.*last good checkpoint is step 4"):
        loop.train(tiny_config("train.max_steps=8"), tmp_path, log=lambda m: None)
    checkpointer = Checkpointer(checkpoint_dir(tmp_path))
    assert checkpointer.all_steps() == [4]
    state = checkpointer.restore_state(4)
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state))
    checkpointer.close()


@pytest.mark.slow
def test_sigterm_saves_and_stops_then_resumes(tmp_path, monkeypatch):
    def terminate(n, metrics):
        if n == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    _patched_steps(monkeypatch, terminate)
    with mock_flowers():
        result = loop.train(tiny_config("train.max_steps=8", "train.eval_every=0"), tmp_path, log=lambda m: None)
    assert result.interrupted and result.final_step == 3
    assert Checkpointer(checkpoint_dir(tmp_path)).latest_step() == 3
    monkeypatch.undo()
    with mock_flowers():
        resumed = loop.train(tiny_config("train.max_steps=8", "train.eval_every=0"), tmp_path, log=lambda m: None)
    assert (resumed.start_step, resumed.final_step, resumed.interrupted) == (3, 8, False)


@pytest.mark.slow
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
        loop.train(config, tmp_path, log=lambda m: None)
    assert len(unfinished) == 10 and max(unfinished) <= steps.MAX_STEPS_AHEAD


@pytest.mark.slow
def test_crash_while_logging_saves_the_state(tmp_path, monkeypatch):
    """A failure right after a metrics fetch (nothing pending) still saves the intact state."""

    def broken_log(*args, **kwargs):
        raise OSError("simulated logging failure")

    monkeypatch.setattr(actions.LogTrainMetrics, "run", broken_log)
    with mock_flowers(), pytest.raises(OSError, match="simulated logging failure"):
        loop.train(tiny_config("train.max_steps=8", "train.eval_every=0"), tmp_path, log=lambda m: None)
    assert Checkpointer(checkpoint_dir(tmp_path)).latest_step() == 1  # the log's first report: after step 1


@pytest.mark.slow
def test_crash_saves_the_last_finite_state(tmp_path, monkeypatch):
    real_batches = loop.data_lib.train_batches

    def failing_batches(*args, **kwargs):
        for n, batch in enumerate(real_batches(*args, **kwargs)):
            if n == 3:
                raise OSError("simulated input pipeline crash")
            yield batch

    monkeypatch.setattr(loop.data_lib, "train_batches", failing_batches)
    with mock_flowers(), pytest.raises(OSError, match="simulated input pipeline crash"):
        loop.train(tiny_config("train.max_steps=8", "train.eval_every=0"), tmp_path, log=lambda m: None)
    # Three steps ran before the crash and their losses were finite: that state is saved.
    assert Checkpointer(checkpoint_dir(tmp_path)).latest_step() == 3


@pytest.mark.slow
def test_kid_monitor_logs_kid_and_keeps_the_best_checkpoint(tmp_path):
    """KID during training, with a small *random* feature network injected in place of InceptionV3
    (the real monitor refuses to run without the InceptionV3 weights)."""
    from tests.test_evaluation import tiny_extractor

    overrides = ["train.kid_images=8", "train.kid_steps=2", "train.eval_every=1", "train.max_steps=8"]
    with mock_flowers():
        loop.train(tiny_config(*overrides), tmp_path, log=lambda m: None, kid_extractor_factory=tiny_extractor)
    # Orbax keeps one step in best/: the one whose saved KID is lowest.
    best = Checkpointer(tmp_path / "best", keep=1, best_metric="kid")
    (step,) = best.all_steps()
    assert step in (4, 8) and np.isfinite(best.metrics(step)["kid"])
    kids = _scalars(tmp_path, "val/kid")
    assert set(kids) == {4, 8} and best.metrics(step)["kid"] == pytest.approx(min(kids.values()))
    best.close()
    assert list((tmp_path / "eval_cache").glob("real_*.npz"))
    # `ddim sample --checkpoint <workdir>/best` loads it.
    import ddim

    assert ddim.load(tmp_path / "best").step == step


@pytest.mark.slow
def test_kid_monitor_without_weights_warns_and_trains_on(tmp_path, monkeypatch):
    monkeypatch.setenv("DDIM_INCEPTION_WEIGHTS", str(tmp_path / "missing.h5"))
    messages = []
    with mock_flowers():
        result = loop.train(tiny_config("train.kid_images=8", "train.max_steps=2"), tmp_path / "run",
                                 log=messages.append)
    assert result.final_step == 2
    assert any(m.startswith("warning: KID monitoring is off") for m in messages), messages
    # The log: the first step timed on its own line, the rate from the steps after it only.
    steps = [m for m in messages if m.startswith("step ")]
    assert "(first step" in steps[0] and "img/s" not in steps[0] and steps[-1].endswith(" img/s"), messages



def _scalars(workdir, tag) -> dict[int, float]:
    """The TensorBoard scalar ``tag`` of a run: ``{step: value}``."""
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = {}
    for path in sorted((workdir / "tensorboard").glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(path), size_guidance={"tensors": 0})
        accumulator.Reload()
        for event in accumulator.Tensors(tag) if tag in accumulator.Tags()["tensors"] else []:
            values[event.step] = float(tf.make_ndarray(event.tensor_proto))
    return values
