"""Continuous-time consistency distillation (Lu & Song 2024, sCD; ``distill.consistency_times = "tangent"``): the
tangent against hand computations and an exact consistency function, the step's loss on a tiny network, a run
stopped and resumed, and bad settings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim.config import ConfigError
from ddim.distill import targets_consistency as consistency
from ddim.distill.step import consistency_loss_fn
from ddim.model import DiffusionModel, bind_denoiser, init_variables
from ddim.objective import Objective
from tests.conftest import tiny_config

TANGENT = ('distill.consistency_times="tangent"',)


def test_the_schedules_rates_are_trigflows_angle_and_a_level_its_tangent():
    times = jnp.array([0.0, 0.5, 1.0])
    noise, signal = Objective().schedule(times)
    angle = jnp.arctan2(noise, signal)
    np.testing.assert_allclose(consistency.rates_of_angle(angle), (noise, signal), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(consistency.angle_of_level(consistency.level_of_rates(noise, signal)), angle, rtol=1e-5)
    assert consistency.rates_of_angle(jnp.float32(0.0)) == (0.0, 1.0)  # angle 0: the boundary


def test_the_velocity_of_a_velocity_network_is_its_output_and_dz_da_of_the_data_its_target():
    model = DiffusionModel(tiny_config("model.prediction=velocity").model)
    variables = init_variables(model, jax.random.key(0))
    rng = np.random.default_rng(0)
    z = jnp.asarray(rng.normal(size=(2, 16, 16, 3)), jnp.float32)
    angle = jnp.full((2, 1, 1, 1), 0.7, jnp.float32)
    noise_rates, signal_rates = consistency.rates_of_angle(angle)
    output = model.apply(variables, z, noise_rates**2, False, None, method=lambda m, *a: m.network(*a))
    velocity = consistency.velocity_of(lambda *a: bind_denoiser(model, variables)(*a, None))(z, angle)
    np.testing.assert_allclose(velocity, output, rtol=1e-4, atol=1e-5)
    images, noises = (jnp.asarray(rng.normal(size=(2, 16, 16, 3)), jnp.float32) for _ in range(2))
    # dz/da of z = cos(a) x + sin(a) eps, by a finite difference.
    step = 1e-3
    finite = ((jnp.cos(angle + step) * images + jnp.sin(angle + step) * noises)
              - (jnp.cos(angle - step) * images + jnp.sin(angle - step) * noises)) / (2 * step)
    np.testing.assert_allclose(consistency.data_velocity(images, noises, angle), finite, rtol=1e-2, atol=1e-3)


def test_the_tangent_is_the_total_derivative_along_the_path():
    """dF/da = dF/dz . dz/da + dF/da at fixed z, for F(z, a) = sin(a) z^2, by hand."""
    z = jnp.array([[0.5, -1.0, 2.0]])
    dz = jnp.array([[1.0, 3.0, -0.5]])
    angle = jnp.array([[0.3]])
    value, tangent = consistency.velocity_and_tangent(lambda z, a: jnp.sin(a) * z**2, z, angle, dz)
    np.testing.assert_allclose(value, np.sin(0.3) * np.square(z), rtol=1e-6)
    np.testing.assert_allclose(tangent, np.sin(0.3) * 2 * z * dz + np.cos(0.3) * np.square(z), rtol=1e-6)


def test_the_normalised_tangent_matches_a_hand_computation():
    velocity = jnp.array([[[[1.0, -2.0]]], [[[0.5, 0.0]]]])
    velocity_tangent = jnp.array([[[[0.2, 0.1]]], [[[-1.0, 3.0]]]])
    z = jnp.array([[[[0.3, 0.4]]], [[[2.0, -1.0]]]])
    dz = jnp.array([[[[0.0, 1.0]]], [[[1.5, 0.5]]]])
    angle = jnp.array([0.4, 1.2]).reshape(2, 1, 1, 1)
    got = np.asarray(consistency.tangent_target(velocity, velocity_tangent, z, dz, angle, 0.5, 0.1))
    for i in range(2):
        a = float(angle[i, 0, 0, 0])
        g = (-np.cos(a) ** 2 * (np.asarray(velocity[i]) - np.asarray(dz[i]))
             - 0.5 * np.sin(a) * np.cos(a) * (np.asarray(z[i]) + np.asarray(velocity_tangent[i])))
        np.testing.assert_allclose(got[i], g / (np.linalg.norm(g) + 0.1), rtol=1e-5)
    # The loss pulls the student's velocity towards F + g, with no gradient through the target.
    student = velocity * 0.0
    loss, grad = jax.value_and_grad(lambda s: consistency.tangent_loss(s, velocity, jnp.asarray(got)))(student)
    np.testing.assert_allclose(loss, np.mean(np.square(np.asarray(velocity) + got)), rtol=1e-5)
    np.testing.assert_allclose(grad, -2 * (np.asarray(velocity) + got) / velocity.size, rtol=1e-5)


def test_an_exact_consistency_function_has_no_tangent_and_at_the_boundary_it_is_velocity_distillation():
    """With one image ``x`` the ODE's velocity is ``F = (cos(a) z - x) / sin(a)`` and ``f = cos(a) z - sin(a) F = x``
    everywhere on the path: df/da = 0, so a student with that velocity gets no tangent at all."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(3, 4, 4, 3)), jnp.float32)
    eps = jnp.asarray(rng.normal(size=(3, 4, 4, 3)), jnp.float32)
    angle = jnp.array([0.4, 0.9, 1.4]).reshape(3, 1, 1, 1)

    def exact(z, a):
        return (jnp.cos(a) * z - x) / jnp.sin(a)

    z = jnp.cos(angle) * x + jnp.sin(angle) * eps
    dz = consistency.data_velocity(x, eps, angle)
    np.testing.assert_allclose(exact(z, angle), dz, rtol=1e-4, atol=1e-5)  # the path's own velocity
    velocity, tangent = consistency.velocity_and_tangent(exact, z, angle, dz)
    g = consistency.tangent_target(velocity, tangent, z, dz, angle, 1.0, 1e-3)
    assert float(jnp.max(jnp.abs(g))) < 1e-3
    # At the boundary (angle 0) the tangent is the normalised difference of the velocities: the student learns
    # the teacher's velocity there, as a diffusion model would.
    student, teacher = jnp.ones((1, 2, 2, 1)), jnp.zeros((1, 2, 2, 1))
    g = consistency.tangent_target(student, jnp.full_like(student, 7.0), z[:1, :2, :2, :1], teacher,
                                   jnp.zeros((1, 1, 1, 1)), 1.0, 0.1)
    np.testing.assert_allclose(g, -np.ones((1, 2, 2, 1)) / (2.0 + 0.1), rtol=1e-6)


def _tangent_loss(*overrides, step=0):
    config = tiny_config("model.prediction=velocity", "distill.method=consistency", "distill.start_steps=4",
                         "distill.consistency_tangent_warmup=4", *TANGENT, *overrides)
    from tests.distill_helpers import consistency_step_inputs

    settings, params, bound, state, images, noises = consistency_step_inputs(config, step)
    teacher = bind_denoiser(DiffusionModel(config.model), init_variables(DiffusionModel(config.model),
                                                                         jax.random.key(5)))
    loss_fn = consistency_loss_fn(settings, state, lambda z, n, s: teacher(z, n, s, None), bound, images, noises,
                                  jax.random.key(3))
    loss, grads = jax.value_and_grad(loss_fn)(params)
    return float(loss), grads


def test_the_steps_loss_is_finite_with_a_gradient_and_the_warm_up_and_the_pair_change_it():
    loss, grads = _tangent_loss()
    assert np.isfinite(loss) and loss > 0
    assert any(float(jnp.abs(leaf).sum()) > 0 for leaf in jax.tree.leaves(grads))
    warm, _ = _tangent_loss(step=4)  # the tangent's second term at full weight
    data, _ = _tangent_loss('distill.consistency_pair="data"')
    grid, _ = _tangent_loss('distill.consistency_times="grid"')
    assert len({loss, warm, data, grid}) == 4


@pytest.mark.parametrize("override, message", [
    ("distill.consistency_tangent_c=0", "distill.consistency_tangent_c must be > 0"),
    ("distill.consistency_tangent_warmup=-1", "distill.consistency_tangent_warmup must be >= 0"),
    ('distill.consistency_loss="pseudo-huber"', 'distill.consistency_times "tangent" has its own loss'),
    ('distill.consistency_weighting="inverse-gap"', 'distill.consistency_times "tangent" has its own loss'),
])
def test_bad_tangent_settings_are_refused(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        tiny_config("distill.method=consistency", *TANGENT, override)


RUN = ["distill.method=consistency", "distill.start_steps=4", "distill.student_steps=[1, 2, 4]",
       "distill.consistency_steps=4", "distill.consistency_tangent_warmup=2", "distill.batch_size=4",
       "train.eval_every=0", "train.checkpoint_every=100", *TANGENT]


@pytest.mark.slow
def test_a_stopped_tangent_run_resumes_to_the_same_student_which_samples(conditional_workdir, tmp_path, monkeypatch):
    """Stopped at step 2 (the end of the warm-up), resumed: the student an unstopped run makes, sampling in 1 and 2
    steps with guidance."""
    import ddim
    from tests.distill_helpers import stopped_and_resumed_student

    student = stopped_and_resumed_student(conditional_workdir, tmp_path, monkeypatch, RUN, stop=2, total=4)
    pipe = ddim.load(student)
    for steps in (1, 2):
        images = pipe.generate(2, steps=steps, guidance=1.5, seed=0)
        assert images.shape[0] == 2 and np.isfinite(np.asarray(images, np.float32)).all()


def test_bad_tangent_settings_are_one_error_line_before_anything_is_written(conditional_workdir, tmp_path):
    from tests.distill_helpers import each_one_error_line

    each_one_error_line([
        (["distill", "--workdir", conditional_workdir, "--out", tmp_path / "a", "--method", "consistency", "--set",
          'distill.consistency_times="tangent"', "--set", "distill.consistency_tangent_c=0"],
         "distill.consistency_tangent_c must be > 0"),
        (["distill", "--workdir", conditional_workdir, "--out", tmp_path / "b", "--method", "consistency", "--set",
          'distill.consistency_times="tangent"', "--set", 'distill.consistency_loss="pseudo-huber"'],
         'distill.consistency_times "tangent" has its own loss'),
    ])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_tangent_study_writes_each_angles_parts(conditional_workdir, tmp_path):
    import json

    from benchmarks.studies import tangent_parts

    out = tmp_path / "parts.jsonl"
    tangent_parts.main(["--model", str(conditional_workdir), "--angles", "0.5", "1.2", "--num", "2", "--out", str(out)])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["angle"] for line in lines] == [0.5, 1.2]
    for line in lines:
        values = [line[key] for key in ("velocity", "input_part", "angle_part", "exact_angle_part", "state")]
        assert all(np.isfinite(values)) and all(value > 0 for value in values)
