"""The periodic actions' interface (ddim/train/actions.py): triggers, the metrics buffer, the best checkpoint."""

import jax
import numpy as np
import pytest

from ddim.checkpoint import Checkpointer
from ddim.train import actions
from ddim.train import state as state_lib
from tests.conftest import tiny_config


def _info(step, total=20, per_epoch=8, stopping=False):
    return actions.StepInfo(step, total, per_epoch, state=None, stopping=stopping)


def test_every_fires_on_steps_epochs_the_end_and_a_stop():
    every = actions.Every(steps=3, epochs=2, at_end=True, on_stop=False)
    fired = [s for s in range(1, 21) if every(_info(s))]
    # Steps 3, 6, ...; epoch ends 16 (epoch 2; 8 is epoch 1, odd); the last step 20.
    assert fired == [3, 6, 9, 12, 15, 16, 18, 20]
    assert not actions.Every(at_end=False)(_info(20))
    assert actions.Every(on_stop=True, at_end=False)(_info(5, stopping=True))
    assert [s for s in range(1, 21) if actions.Every()(_info(s))] == [20]


def test_metrics_buffer_fetches_averages_and_refuses_non_finite_losses():
    buffer = actions.MetricsBuffer()
    for loss in (1.0, 2.0, 3.0):
        buffer.append({"noise_loss": np.float32(loss)})
    buffer.fetch(3)
    assert buffer.pending == [] and len(buffer.fetched) == 3
    buffer.append({"noise_loss": np.float32(5.0)})
    assert buffer.take_mean(4) == {"noise_loss": pytest.approx(2.75)}
    assert buffer.take_mean(4) == {} and buffer.last_mean == {"noise_loss": pytest.approx(2.75)}
    buffer.append({"noise_loss": np.float32(1.0)})
    buffer.append({"noise_loss": np.float32(np.nan)})
    with pytest.raises(actions.TrainingError, match="non-finite loss at step 6"):
        buffer.fetch(6)


def test_kid_monitor_compares_with_the_best_saved_kid(tmp_path):
    """``best/`` as orbax writes it, with the metric."""
    config = tiny_config("train.kid_images=8")
    state_dict = state_lib.state_to_dict(state_lib.create_train_state(config, jax.random.key(0)))
    fresh = actions.KidMonitor(config, tmp_path / "fresh", model=None, extractor=None, real_features=None)
    assert fresh.best == float("inf")
    fresh.finish(None, None)

    best = Checkpointer(tmp_path / "new" / "best", keep=1, best_metric="kid")
    for step, kid in ((4, 0.5), (8, 0.25)):
        best.save(step, state_dict, config, metrics={"kid": kid})
    best.close()
    monitor = actions.KidMonitor(config, tmp_path / "new", model=None, extractor=None, real_features=None)
    assert monitor.best == 0.25 and monitor.best_checkpoints.all_steps() == [8]
    monitor.finish(None, None)
    import ddim

    assert ddim.load(tmp_path / "new" / "best").step == 8


def test_train_log_rates_the_images_its_steps_trained_and_times_the_first_step_apart():
    """img/s: the images of the steps between two reports (the run's own batch: a distilled student's is
    [distill]'s) over the seconds those steps took; the first step (compiling) has a line of its own."""
    import io

    from ddim.summary import Progress

    config = tiny_config("model.distilled_steps=4", "distill.batch_size=4", "train.log_every=4")
    assert (config.step_batch_size, config.train.batch_size) == (4, 8)
    buffer, stream = actions.MetricsBuffer(), io.StringIO()
    log = actions.LogTrainMetrics(config, buffer, Progress(20, 0, stream=stream))
    # The loop's training seconds after each step: the first took 9 s (compiling), the others 0.5 s each.
    seconds = {1: 9.0, **{step: 9.0 + 0.5 * (step - 1) for step in range(2, 21)}}
    reports = {}
    for step in range(1, 9):
        buffer.append({"loss": np.float32(1.0)})
        info = actions.StepInfo(step, 20, 100, state=None, train_seconds=seconds[step])
        if log.due(info):
            reports[step] = log.run(info)
    assert sorted(reports) == [1, 4, 8]
    assert reports[1].message.startswith("step 1/20 loss=1 (first step 9.0 s")
    assert "img/s" not in reports[1].message and "train/images_per_second" not in reports[1].scalars
    # 3 steps of 4 images in 1.5 s, then 4 in 2 s: 8 img/s (the waits for the device, here tiny, count in).
    for step in (4, 8):
        rate = reports[step].scalars["train/images_per_second"]
        assert rate == pytest.approx(8.0, rel=0.05) and reports[step].message.endswith(f"{rate:.1f} img/s")


def test_counts_in_log_lines_agree_with_their_nouns():
    from ddim.summary import plural

    assert plural(1, "step/epoch") == "1 step/epoch" and plural(3, "step/epoch") == "3 steps/epoch"
    assert plural(1, "step") == "1 step" and plural(0, "step") == "0 steps"


def test_kid_warning_without_weights_names_what_ddim_train_takes(monkeypatch, tmp_path):
    """ddim train has no --inception-weights: the warning names the config key it sets with --set, and the
    environment variable."""
    from ddim.evaluation import keras_inception

    monkeypatch.delenv(keras_inception.WEIGHTS_ENV, raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))

    def offline():
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(keras_inception, "_download_weights", offline)
    messages = []
    config = tiny_config("train.kid_images=8", "train.eval_every=1")
    assert actions.KidMonitor.create(config, tmp_path / "run", model=None, say=messages.append) is None
    (warning,) = messages
    assert warning.startswith("warning: KID monitoring is off: InceptionV3 weights not found: KID monitoring needs")
    assert "pass --set train.inception_weights=PATH, or set DDIM_INCEPTION_WEIGHTS=PATH" in warning
    assert "--inception-weights" not in warning
    # A file named in the config that is not there: named by its key too.
    config = tiny_config("train.kid_images=8", "train.eval_every=1", f'train.inception_weights="{tmp_path}/x.h5"')
    actions.KidMonitor.create(config, tmp_path / "run", model=None, say=messages.append)
    assert f"{tmp_path}/x.h5 (from train.inception_weights) does not exist" in messages[-1]
