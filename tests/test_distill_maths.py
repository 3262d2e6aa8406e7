"""Distillation's maths and plan (ddim/distill/): the targets and weights, the consistency function and the
teacher's ODE step, guidance draws, clipped sampling, the phases, bad settings and a student's sampling rules."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim.config import ConfigError
from ddim.distill import plan as plan_lib
from ddim.distill import targets
from ddim.distill import targets_consistency as consistency
from ddim.model import DiffusionModel
from ddim.objective import Objective
from ddim.sampling import process
from ddim.spec import SamplingRules, SamplingSpec, SpecError
from tests.conftest import tiny_config
from tests.distill_helpers import jit_denoise, tiny_teacher


# --- the maths ---------------------------------------------------------------------------------------------------


def test_one_step_target_is_the_image_whose_ddim_step_lands_on_the_teachers_point():
    objective = Objective()
    rng = np.random.default_rng(0)
    z_t, z_s = (jnp.asarray(rng.normal(size=(4, 8, 8, 3)), jnp.float32) for _ in range(2))
    t, s = jnp.full((4, 1, 1, 1), 0.75), jnp.full((4, 1, 1, 1), 0.5)
    rates_t, rates_s = objective.schedule(t), objective.schedule(s)
    image = targets.one_step_target(z_t, rates_t, z_s, rates_s)
    noise = (z_t - rates_t[1] * image) / rates_t[0]
    landed = rates_s[1] * image + rates_s[0] * noise  # DDIM eq. 12, eta 0
    np.testing.assert_allclose(landed, z_s, atol=1e-4)


def test_grid_times_are_the_students_grid():
    index, times = targets.grid_times(jax.random.key(0), 4000, 4)
    assert set(np.unique(index).tolist()) == {1, 2, 3, 4}
    np.testing.assert_allclose(np.unique(times), [0.25, 0.5, 0.75, 1.0])


def test_truncated_snr_weight_is_max_of_snr_and_one():
    predicted, target = jnp.zeros((2, 1, 1, 1)), jnp.ones((2, 1, 1, 1))
    noise_rates = jnp.array([0.9, 0.1]).reshape(2, 1, 1, 1)
    signal_rates = jnp.sqrt(1 - noise_rates**2)
    loss = targets.truncated_snr_loss(predicted, target, noise_rates, signal_rates)
    snr_low = 1 - 0.01  # SNR of the second example is 99, of the first below 1
    np.testing.assert_allclose(loss, (1.0 + snr_low / 0.01) / 2, rtol=1e-5)


def test_image_prediction_target_converts_both_ways():
    objective = Objective(prediction="image")
    rng = np.random.default_rng(0)
    images, noises = (jnp.asarray(rng.normal(size=(3, 4, 4, 3)), jnp.float32) for _ in range(2))
    noise_rates, signal_rates = objective.schedule(jnp.full((3, 1, 1, 1), 0.4))
    noisy = signal_rates * images + noise_rates * noises
    pred_noises, pred_images = objective.predictions(images, noisy, noise_rates, signal_rates)
    np.testing.assert_allclose(pred_images, images)
    np.testing.assert_allclose(pred_noises, noises, atol=1e-4)


# --- consistency distillation's maths ----------------------------------------------------------------------------


def test_a_velocity_student_is_the_consistency_parameterisation_and_returns_its_input_at_the_boundary():
    """Song et al.'s c_skip x + c_out F with sigma_data 1 and boundary 0, in the EDM variables z / alpha and
    sigma / alpha, is the image prediction of a velocity network (F = -v); at noise rate 0 it is the input."""
    _, model, variables = tiny_teacher("model.prediction=velocity")
    denoise = functools.partial(jit_denoise, model, variables)
    z = jnp.asarray(np.random.default_rng(0).normal(size=(3, 16, 16, 3)), jnp.float32)
    at_end = consistency.consistency_function(denoise, z, *consistency.boundary_rates(jnp.ones((3, 1, 1, 1))))
    np.testing.assert_array_equal(at_end, z)  # exactly, whatever the network outputs
    noise_rates, signal_rates = model.objective.schedule(jnp.full((3, 1, 1, 1), 0.3))
    velocity = jax.jit(lambda z, noise_powers: model.apply(variables, z, noise_powers, False, None,
                                                          method=lambda module, *args: module.network(*args)))(
        z, noise_rates**2)
    edm_sigma, edm_x = noise_rates / signal_rates, z / signal_rates
    c_skip, c_out = 1 / (edm_sigma**2 + 1), edm_sigma / jnp.sqrt(1 + edm_sigma**2)
    f = consistency.consistency_function(denoise, z, noise_rates, signal_rates)
    np.testing.assert_allclose(f, c_skip * edm_x + c_out * -velocity, atol=1e-5)
    assert float(jnp.mean(jnp.abs(f - z))) > 0.1  # elsewhere the network's output counts


def test_the_teachers_ode_step_lands_on_the_previous_time_and_at_the_boundary_on_its_image():
    objective = Objective()
    index = jnp.array([1, 2, 4])
    noise_rates, signal_rates = consistency.previous_rates(objective.schedule, index, 4)
    expected = objective.schedule(jnp.array([0.0, 0.25, 0.75]).reshape(-1, 1, 1, 1))
    np.testing.assert_array_equal(noise_rates[0], 0.0)
    np.testing.assert_array_equal(signal_rates[0], 1.0)
    np.testing.assert_allclose(noise_rates[1:], expected[0][1:])
    np.testing.assert_allclose(signal_rates[1:], expected[1][1:])
    x0 = jnp.linspace(-1.0, 1.0, 12).reshape(3, 1, 2, 2)  # all data one point per row: the exact denoiser

    def teacher(z, sigma, alpha):
        return (z - alpha * x0) / sigma, x0

    z_t = 0.5 * x0 + 0.8 * jnp.ones_like(x0)
    rates_t = (jnp.full((3, 1, 1, 1), 0.8), jnp.full((3, 1, 1, 1), 0.6))
    z_s = consistency.teacher_ode_step(teacher, z_t, rates_t, (noise_rates, signal_rates))
    np.testing.assert_allclose(z_s[0], x0[0])  # at the boundary: the teacher's image
    np.testing.assert_allclose(z_s[1:], signal_rates[1:] * x0[1:] + noise_rates[1:] * (z_t[1:] - 0.6 * x0[1:]) / 0.8,
                               rtol=1e-5)


def test_focused_guidance_draws_put_half_of_the_scales_where_they_are_sampled():
    uniform = np.asarray(targets.guidance_scales(jax.random.key(0), 20000, 0.0, 4.0))
    focused = np.asarray(targets.guidance_scales(jax.random.key(0), 20000, 0.0, 4.0, (1.0, 2.0)))
    assert uniform.min() >= 0 and uniform.max() <= 4 and focused.min() >= 0 and focused.max() <= 4
    assert abs(np.mean((uniform >= 1) & (uniform <= 2)) - 0.25) < 0.02
    assert abs(np.mean((focused >= 1) & (focused <= 2)) - (0.5 + 0.5 * 0.25)) < 0.02


def test_clipped_sampling_keeps_the_image_prediction_in_the_pixels_range_and_the_step_consistent():
    """SamplingSpec.clip, to be measured on the students: each image prediction within what [0, 1] normalises to,
    and the noise prediction the one that, with it, gives the input back."""
    _, model, variables = tiny_teacher("model.prediction=velocity")  # wild predictions, far outside the pixels' range
    z = jnp.asarray(np.random.default_rng(0).normal(size=(4, 16, 16, 3)), jnp.float32)
    rates = model.objective.schedule(jnp.full((4, 1, 1, 1), 0.5))
    _, plain = process.spec_denoiser(model, variables, SamplingSpec())(z, *rates)
    noises, images = process.spec_denoiser(model, variables, SamplingSpec(clip=True))(z, *rates)
    ends = np.asarray(model.apply(variables, jnp.array([0.0, 1.0]).reshape(2, 1, 1, 1) * jnp.ones((2, 1, 1, 3)),
                                  method=DiffusionModel.normalize))
    assert np.any(plain < ends[0] - 0.1) and np.any(plain > ends[1] + 0.1)
    assert np.all(images >= ends[0] - 1e-6) and np.all(images <= ends[1] + 1e-6)
    np.testing.assert_allclose(rates[1] * images + rates[0] * noises, z, atol=1e-5)
    assert SamplingSpec(steps=4, clip=True).cli_options() == ["--steps", "4", "--clip"]
    assert "--clip" not in SamplingSpec().cli_options(skip_defaults=False)
    assert "clip" not in SamplingSpec().to_dict() and SamplingSpec(clip=True).to_dict()["clip"] is True


# --- the plan ----------------------------------------------------------------------------------------------------


def test_rounds_halve_the_steps_down_to_the_target():
    teacher = tiny_config("model.class_conditional=true").model
    config = tiny_config("distill.start_steps=16", "distill.end_steps=2", "distill.round_steps=5",
                         "distill.first_stage_steps=7")
    phases = plan_lib.plan(teacher, config)
    assert [(p.kind, p.teacher_steps, p.student_steps) for p in phases] == [
        ("guidance", 16, 16), ("round", 16, 8), ("round", 8, 4), ("round", 4, 2)]
    assert [(p.start, p.end) for p in phases] == [(0, 7), (7, 12), (12, 17), (17, 22)]
    student = plan_lib.student_model(teacher, config, phases[-1])
    assert (student.distilled_steps, student.guidance_input, student.prediction) == (2, True, "velocity")
    # An unconditional teacher that already predicts the student's target needs no stage one.
    unconditional = tiny_config("model.prediction=velocity").model
    assert [p.kind for p in plan_lib.plan(unconditional, config)] == ["round"] * 3


def test_consistency_distillation_is_one_phase_whose_student_samples_with_every_count():
    teacher = tiny_config("model.class_conditional=true").model
    config = tiny_config("distill.method=consistency", "distill.start_steps=16", "distill.consistency_steps=9",
                         "distill.student_steps=[4, 1, 2]")
    (phase,) = plan_lib.plan(teacher, config)
    assert (phase.kind, phase.start, phase.end, phase.grid_steps, phase.student_name) == (
        "consistency", 0, 9, 16, "consistency")
    student = plan_lib.student_model(teacher, config, phase, "pretrained:teacher")
    assert (student.distilled_steps, student.distilled_step_counts, student.distilled_sampler) == (
        4, (1, 2, 4), "consistency")
    assert (student.prediction, student.guidance_input, student.distilled_from) == (
        "velocity", True, "pretrained:teacher")
    rules = SamplingRules.of(student)
    assert rules.defaults == SamplingSpec(steps=4, sampler="consistency") and rules.step_counts == (1, 2, 4)
    assert rules.resolve(steps=1).steps == 1
    with pytest.raises(SpecError, match="distilled for 1, 2, 4 steps"):
        rules.resolve(steps=3)
    with pytest.raises(SpecError, match="consistency sampling on the uniform grid"):
        rules.resolve(sampler="ddim")
    with pytest.raises(SpecError, match=r"use the diffusion model it was distilled from \(pretrained:teacher\)"):
        rules.refuse_ode("invert images")
    with pytest.raises(SpecError, match="for consistency students"):
        SamplingRules.of(teacher).resolve(sampler="consistency")


@pytest.mark.parametrize("overrides,message", [
    (("distill.start_steps=12", "distill.end_steps=4"), "not reachable by halving distill.start_steps \\(12\\); "
                                                        "reachable: 6, 3"),
    (("distill.start_steps=8", "distill.end_steps=8"), "not reachable by halving"),
    (("distill.prediction=noise",), "distill.prediction must be one of"),
    (("distill.guidance_min=3", "distill.guidance_max=2"), "guidance_min <= distill.guidance_max"),
    (("distill.method=consistency", "distill.start_steps=6"), "must be different step counts that divide "
                                                              "distill.start_steps \\(6: 1, 2, 3, 6\\)"),
    (("distill.method=consistency", 'distill.prediction="image"'), "needs distill.prediction \"velocity\""),
    (("distill.guidance_focus=[1, 5]",), "guidance_focus must be \\[lowest, highest\\] within"),
    (("distill.method=bogus",), "distill.method must be one of"),
])
def test_bad_distillation_settings_are_one_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(*overrides)


def test_a_distilled_student_is_no_teacher():
    student = dataclasses.replace(tiny_config().model, distilled_steps=4)
    with pytest.raises(ConfigError, match="is a distilled student \\(4 steps\\), not a diffusion model"):
        plan_lib.check_teacher(student, "the teacher x")
    consistency = dataclasses.replace(student, distilled_sampler="consistency")
    with pytest.raises(ConfigError, match="is a distilled student \\(4 steps\\), not a diffusion model"):
        plan_lib.check_teacher(consistency, "the teacher x", tiny_config("distill.start_steps=4"))


def test_a_progressive_student_is_halved_further_from_its_own_step_count():
    teacher = tiny_config("model.class_conditional=true").model
    config = tiny_config("distill.start_steps=8", "distill.end_steps=4", "distill.round_steps=5",
                         "distill.first_stage_steps=7")
    first = plan_lib.plan(teacher, config)
    student = plan_lib.student_model(teacher, config, first[-1], "pretrained:teacher")
    further = tiny_config("distill.start_steps=4", "distill.end_steps=1", "distill.round_steps=3")
    plan_lib.check_teacher(student, "the teacher x", further)
    # No stage one: the student takes guidance as an input and predicts velocity already.
    phases = plan_lib.plan(student, further)
    assert [(p.kind, p.teacher_steps, p.student_steps, p.start) for p in phases] == [
        ("round", 4, 2, 0), ("round", 2, 1, 3)]
    last = plan_lib.student_model(student, further, phases[-1], "runs/x/students/4")
    assert (last.distilled_steps, last.guidance_range, last.distilled_from) == (1, (0.0, 4.0), "pretrained:teacher")
    for overrides, message in [
        (("distill.start_steps=8",), "progressive student of 4 steps, and its rounds go on from there: set "
                                     "distill.start_steps=4"),
        (("distill.start_steps=4", 'distill.prediction="image"'), "predicts velocity, which its rounds keep"),
        (("distill.start_steps=4", "distill.guidance_max=5"), "distilled for guidance 0 to 4: distill.guidance_min"),
        (("distill.start_steps=4", "distill.method=consistency"), "is a distilled student \\(4 steps\\)"),
    ]:
        with pytest.raises(ConfigError, match=message):
            plan_lib.check_teacher(student, "the teacher x", tiny_config(*overrides))


# --- sampling a student ------------------------------------------------------------------------------------------


def test_a_students_rules_refuse_other_step_counts_samplers_and_scales():
    model = dataclasses.replace(tiny_config().model, distilled_steps=4, guidance_range=(0.0, 4.0))
    rules = SamplingRules.of(model, name="flowers-student")
    assert rules.resolve() == SamplingSpec(steps=4)
    assert rules.resolve(guidance=2.5).guidance == 2.5
    with pytest.raises(SpecError, match="distilled for 4 steps") as error:
        rules.resolve(steps=8)
    assert "--steps 4 only" in error.value.cli_message
    with pytest.raises(SpecError, match="distilled for DDIM steps on the uniform grid only"):
        rules.resolve(sampler="dpmpp-2m")
    with pytest.raises(SpecError, match="leave out sampler and spacing"):
        rules.resolve(spacing="logsnr")
    assert rules.resolve(eta=0.5) == SamplingSpec(steps=4, eta=0.5)  # its DDIM steps take fresh noise
    with pytest.raises(SpecError, match="guidance scales 0 to 4"):
        rules.resolve(guidance=5.0)
    with pytest.raises(SpecError, match="cannot invert images"):
        rules.refuse_ode("invert images")
