"""Consistency tuning (ECT's continuous levels and shrinking gap, iCT's pseudo-Huber distance and 1 / (t - r)
weighting): the maths against hand computations, a run stopped and resumed, and bad settings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim.config import ConfigError
from ddim.distill import targets_consistency as consistency
from ddim.distill.step import ConsistencySettings, consistency_loss_fn
from ddim.model import DiffusionModel, bind_denoiser, init_variables
from ddim.objective import Objective
from tests.conftest import tiny_config


def test_a_level_maps_to_variance_preserving_rates_and_back_with_the_boundary_at_zero():
    levels = jnp.array([0.0, 0.5, 1.0, 50.0])
    noise, signal = consistency.rates_of_level(levels)
    np.testing.assert_allclose(noise**2 + signal**2, 1.0, rtol=1e-6)
    assert (float(noise[0]), float(signal[0])) == (0.0, 1.0)  # the boundary: the image itself
    np.testing.assert_allclose(noise[2], np.sqrt(0.5), rtol=1e-6)  # level 1: as much noise as signal
    np.testing.assert_allclose(consistency.level_of_rates(noise, signal), levels, rtol=1e-5)
    # The schedule's own rates: level sigma / alpha.
    sigma, alpha = Objective().schedule(jnp.array(0.0))
    np.testing.assert_allclose(consistency.level_of_rates(sigma, alpha), np.sqrt(1 - 0.95**2) / 0.95, rtol=1e-5)


def test_the_student_returns_its_input_at_the_boundary_level():
    """At r = 0 the target is the pair's point itself: the image, whatever the network says."""
    model = DiffusionModel(tiny_config("model.prediction=velocity").model)
    variables = init_variables(model, jax.random.key(0))

    def denoise(z, noise_rates, signal_rates):
        return bind_denoiser(model, variables)(z, noise_rates, signal_rates, None)

    z = jnp.asarray(np.random.default_rng(0).normal(size=(2, 16, 16, 3)), jnp.float32)
    at_boundary = consistency.consistency_function(denoise, z, *consistency.rates_of_level(jnp.zeros((2, 1, 1, 1))))
    np.testing.assert_array_equal(at_boundary, z)
    images = z * 0.5
    np.testing.assert_array_equal(consistency.data_pair_point(images, z, jnp.zeros((2, 1, 1, 1))), images)


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_the_gap_shrinks_by_q_each_stage_as_ect_computes_it(stage):
    tau = jnp.array([0.4, 1.0, 5.0, 50.0])
    r = np.asarray(consistency.shrinking_gap_level(tau, stage, 2.0, lowest=0.33))
    expected = []
    for t in np.asarray(tau):
        n = 1 + 8 / (1 + np.exp(t / 2))  # 1 + 8 sigmoid(-t / 2)
        value = t * (1 - n / 2 ** (stage + 1))
        expected.append(0.0 if value < 0.33 else value)  # below the schedule's range: the boundary
    np.testing.assert_allclose(r, expected, rtol=1e-5)
    assert np.all(r < np.asarray(tau))


def test_at_stage_zero_low_levels_pair_with_the_boundary_and_later_stages_close_the_gap():
    tau = jnp.array([0.5, 2.0, 20.0])
    gaps = [np.asarray(tau - consistency.shrinking_gap_level(tau, s, 2.0, 0.33)) for s in range(5)]
    np.testing.assert_array_equal(gaps[0][:1], [0.5])  # n(0.5) > 2: r < 0, the boundary
    for wider, narrower in zip(gaps, gaps[1:]):
        assert np.all(narrower <= wider)
    np.testing.assert_allclose(gaps[4][2] * 32, 20 * (1 + 8 / (1 + np.exp(10))), rtol=1e-5)


def test_levels_are_log_normal_inside_the_schedules_range():
    levels = np.asarray(consistency.sample_levels(jax.random.key(0), 20000, -0.4, 2.0, 0.33, 50.0)).ravel()
    assert levels.min() >= 0.33 * (1 - 1e-6) and levels.max() <= 50.0 * (1 + 1e-6)
    # The truncated normal's median in log space: between the cut points, above the untruncated -0.4.
    median = float(np.median(np.log(levels)))
    assert -0.4 < median < 1.0
    # As many draws below e^-0.4 as a normal truncated at ln 0.33 puts there (about 21 %).
    below = float(np.mean(np.log(levels) < -0.4))
    assert 0.15 < below < 0.27, below


def test_the_pseudo_huber_loss_with_inverse_gap_weights_matches_a_hand_computation():
    a = jnp.array([[[[1.0, 2.0]]], [[[0.0, 0.0]]]])  # two "images" of two numbers
    b = jnp.array([[[[1.0, 0.0]]], [[[3.0, 4.0]]]])
    t, r = jnp.array([2.0, 1.0]).reshape(2, 1, 1, 1), jnp.array([1.5, 0.0]).reshape(2, 1, 1, 1)
    c = 0.5
    first = (np.sqrt(4.0 + c * c) - c) / 0.5  # |d| = 2, gap 0.5
    second = (np.sqrt(25.0 + c * c) - c) / 1.0  # |d| = 5, gap 1
    loss = consistency.tuning_loss(a, b, t, r, huber_c=c, inverse_gap=True)
    np.testing.assert_allclose(float(loss), (first + second) / 2, rtol=1e-6)
    plain = consistency.tuning_loss(a, b, t, r, huber_c=None, inverse_gap=False)
    # The 2023 recipe's loss: the mean squared error over every number.
    np.testing.assert_allclose(float(plain), float(consistency.consistency_loss(a, b)), rtol=1e-6)
    np.testing.assert_allclose(float(plain), (4 + 9 + 16) / 4, rtol=1e-6)


def test_the_huber_constant_scales_with_the_square_root_of_the_images_size():
    config = tiny_config("distill.method=consistency", *TUNE)
    settings = ConsistencySettings.of(config.distill, (32, 32, 3))
    np.testing.assert_allclose(settings.huber_c, 0.00108 * np.sqrt(3072), rtol=1e-6)
    squared = tiny_config("distill.method=consistency")  # the default: the squared error
    assert ConsistencySettings.of(squared.distill, (32, 32, 3)).huber_c is None


TUNE = ('distill.consistency_times="continuous"', 'distill.consistency_loss="pseudo-huber"',
        'distill.consistency_weighting="inverse-gap"')
"""Consistency tuning's settings (the defaults are Song et al. 2023's recipe)."""


def _loss_parts(*overrides, step=0):
    """The loss of a consistency tuning step (``overrides`` changing its parts) for a tiny velocity student."""
    config = tiny_config("model.prediction=velocity", "distill.method=consistency", "distill.start_steps=4",
                         "distill.consistency_stage_steps=2", *TUNE, *overrides)
    from tests.distill_helpers import consistency_step_inputs

    settings, params, bound, state, images, noises = consistency_step_inputs(config, step)
    loss_fn = consistency_loss_fn(settings, state, bound(params), bound, images, noises, jax.random.key(3))
    return float(loss_fn(params))


def test_each_part_of_the_recipe_changes_the_loss_and_the_2023_recipe_is_still_reachable():
    new = _loss_parts()
    old = _loss_parts('distill.consistency_times="grid"', 'distill.consistency_loss="squared"',
                      'distill.consistency_weighting="uniform"')
    parts = [_loss_parts('distill.consistency_times="grid"'), _loss_parts('distill.consistency_loss="squared"'),
             _loss_parts('distill.consistency_weighting="uniform"'), _loss_parts('distill.consistency_pair="data"'),
             _loss_parts('distill.consistency_levels="schedule"')]
    assert all(np.isfinite([new, old, *parts])) and len({new, old, *parts}) == 7
    # A later stage draws the same levels with a narrower gap: another loss.
    assert _loss_parts(step=4) != new


@pytest.mark.parametrize("override, message", [
    ('distill.consistency_times="fixed"', "distill.consistency_times must be one of 'continuous', 'grid', 'tangent'"),
    ('distill.consistency_pair="both"', "distill.consistency_pair must be one of 'teacher', 'data'"),
    ('distill.consistency_levels="uniform"', "distill.consistency_levels must be one of 'log-normal', 'schedule'"),
    ("distill.consistency_gap_base=1.0", "distill.consistency_gap_base must be > 1"),
    ("distill.consistency_stage_steps=0", "distill.consistency_stage_steps must be >= 1"),
    ("distill.consistency_time_std=0", "distill.consistency_time_std must be > 0"),
    ("distill.consistency_huber_c=-1", "distill.consistency_huber_c must be >= 0"),
])
def test_bad_consistency_settings_are_refused(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        tiny_config("distill.method=consistency", override)


TUNING = ["distill.method=consistency", "distill.start_steps=4", "distill.student_steps=[1, 2, 4]",
          "distill.consistency_steps=5", "distill.consistency_stage_steps=2", "distill.batch_size=4",
          "train.eval_every=0", "train.checkpoint_every=100", *TUNE]


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["teacher", "data"])
def test_a_stopped_tuning_run_resumes_in_its_stage_to_the_same_student(conditional_workdir, tmp_path, monkeypatch,
                                                                       pair):
    """Stopped at step 3 (the second stage of the gap), resumed: the student an unstopped run makes."""
    from tests.distill_helpers import stopped_and_resumed_student

    stopped_and_resumed_student(conditional_workdir, tmp_path, monkeypatch,
                                [*TUNING, f'distill.consistency_pair="{pair}"'], stop=3, total=5)


def test_bad_tuning_settings_are_one_error_line_before_anything_is_written(conditional_workdir, tmp_path):
    from tests.distill_helpers import each_one_error_line as _each_one_error_line

    cases = [
        (["distill", "--workdir", conditional_workdir, "--out", tmp_path / "a", "--method", "consistency", "--set",
          'distill.consistency_loss="l1"'], "distill.consistency_loss must be one of 'pseudo-huber', 'squared'"),
        (["distill", "--workdir", conditional_workdir, "--out", tmp_path / "b", "--method", "consistency", "--set",
          "distill.consistency_gap_base=0.5"], "distill.consistency_gap_base must be > 1"),
    ]
    _each_one_error_line(cases)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_ablation_gives_each_variant_the_steps_its_cpu_seconds_buy(tmp_path):
    """Variants of one kind of step train alike; ECT's own pairs (no teacher pass) train for more steps and sCD's
    (a Jacobian-vector product more) for fewer; mid-training
    and its bank come out of the cmt variant's consistency steps."""
    import json
    from types import SimpleNamespace

    from benchmarks.studies import consistency_ablation as ablation

    costs = {"teacher": 1.2, "data": 0.5, "tangent": 1.6, "midtraining": 0.6, "bank": 0.3}
    (tmp_path / ablation.COSTS).write_text(json.dumps(costs))
    args = SimpleNamespace(steps=1000, teacher="pretrained:flowers32", config="consistency32")
    steps = ablation.steps_of(args, tmp_path)
    assert steps["tune"] == steps["cd2023"] == steps["tune-grid"] == 1000 and steps["tune-data"] == 2400
    assert steps["scd"] == 750  # the tangent's product through the student costs a third more a step
    # 1,200 CPU seconds, less 1,024 trajectories of 0.3 s and 250 steps of 0.6 s: 742.8 s, 619 steps of 1.2 s.
    assert (ablation.CMT_BANK_SIZE, ablation.CMT_MIDTRAINING_STEPS, steps["cmt"]) == (1024, 250, 620)
    assert "distill.consistency_midtraining_steps=250" in ablation.VARIANTS["cmt"][1]
    with pytest.raises(SystemExit, match="do not cover the cmt variant's banking and mid-training"):
        ablation.cmt_steps(300, costs)
    assert ablation.teacher_options("pretrained:flowers32") == ["--pretrained", "flowers32"]
    assert ablation.teacher_options("runs/teacher") == ["--workdir", "runs/teacher"]
