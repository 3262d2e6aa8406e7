"""Distillation (ddim/distill/): the maths, the plan, the step on a tiny network, and ``ddim distill`` end to end."""

import dataclasses
import functools
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim.config import ConfigError
from ddim.distill import plan as plan_lib
from ddim.distill import targets
from ddim.distill import targets_consistency as consistency
from ddim.distill.step import StepSettings, create_student_state, distill_step, student_variables
from ddim.model import DiffusionModel, bind_denoiser, init_variables
from ddim.objective import Objective
from ddim.sampling import process
from ddim.spec import SamplingRules, SamplingSpec, SpecError
from tests.conftest import REPO, run_once, tiny_config

BATCH = 16


def _teacher(*overrides, scale=0.2):
    """A tiny teacher with random weights (its zero-initialised head made non-zero, each weight moved by ``scale``
    times a normal draw): any fixed denoiser can be distilled, and a random one gives targets that differ from step
    to step."""
    config = tiny_config(*overrides)
    model = DiffusionModel(config.model)
    variables = jax.device_get(run_once(lambda key: init_variables(model, key), jax.random.key(1)))

    def moved(params, key):
        leaves, tree = jax.tree.flatten(params)
        keys = jax.random.split(key, len(leaves))
        return jax.tree.unflatten(tree, [leaf + scale * jax.random.normal(key, leaf.shape)
                                         for key, leaf in zip(keys, leaves)])

    # In one program: leaf by leaf, op by op, each new shape compiles on its own (20 s on two cores).
    params = jax.device_get(run_once(moved, variables["params"], jax.random.key(2)))
    return config, model, {"params": params, "batch_stats": variables["batch_stats"]}


def _batches(seed=0, conditional=False):
    rng = np.random.default_rng(seed)
    while True:
        # Smooth colour fields: something image-like for the normaliser and the noise to act on.
        base = rng.uniform(0, 255, (BATCH, 4, 4, 3))
        images = np.repeat(np.repeat(base, 4, axis=1), 4, axis=2).astype(np.uint8)
        labels = rng.integers(0, 4, BATCH).astype(np.int32) if conditional else np.zeros(BATCH, np.int32)
        yield {"image": images, "label": labels}


def _distil(teacher_model, teacher_variables, config, phase, steps, conditional=False, final_state=False):
    student = DiffusionModel(plan_lib.student_model(teacher_model.config, config, phase))
    state = create_student_state(student, teacher_variables, config, phase, jax.random.key(3))
    settings = StepSettings.of(student, teacher_model, config, phase)
    step = jax.jit(lambda s, b, r: distill_step(s, teacher_variables, b, r, settings))
    batches = _batches(conditional=conditional)
    for _ in range(steps):
        state, _ = step(state, next(batches), jax.random.key(4))
    if final_state:
        return student, state
    return student, {"params": state.ema_params, "batch_stats": state.ema_batch_stats}


@functools.partial(jax.jit, static_argnums=0)
def _denoise(model, variables, noisy, noise_rates, signal_rates, cond=None):
    """``bind_denoiser(model, variables)`` compiled once per model and shapes: run op by op, a tiny UNet takes
    seconds a call."""
    return bind_denoiser(model, variables)(noisy, noise_rates, signal_rates, cond)


def _sample(model, variables, steps, cond=None, count=32, sampler="ddim"):
    spec = SamplingSpec(steps=steps, sampler=sampler)
    return np.asarray(process.generate(model, variables, jax.random.key(7), count, spec, cond=cond))


# --- the maths ----------------------------------------------------------------------------------------------------


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


# --- consistency distillation's maths ---------------------------------------------------------------------------


def test_a_velocity_student_is_the_consistency_parameterisation_and_returns_its_input_at_the_boundary():
    """Song et al.'s c_skip x + c_out F with sigma_data 1 and boundary 0, in the EDM variables z / alpha and
    sigma / alpha, is the image prediction of a velocity network (F = -v); at noise rate 0 it is the input."""
    _, model, variables = _teacher("model.prediction=velocity")
    denoise = functools.partial(_denoise, model, variables)
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
    _, model, variables = _teacher("model.prediction=velocity")  # wild predictions, far outside the pixels' range
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


# --- the plan -----------------------------------------------------------------------------------------------------


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


# --- the step on a tiny network ------------------------------------------------------------------------------------


CONDITIONAL = ("model.class_conditional=true", "model.num_classes=4", "model.embedding_injection=every-block",
               "model.class_embedding=adm")


def _noisy_with_classes(model, count=24, seed=5):
    """Noisy images at times across the schedule, each with a class (a quarter the null class)."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(count) % 5 - 1).astype(np.int32)  # -1 is the null class
    times = jnp.asarray(rng.uniform(0.05, 1.0, count), jnp.float32).reshape(-1, 1, 1, 1)
    noise_rates, signal_rates = model.objective.schedule(times)
    images = jnp.asarray(next(_batches(9))["image"][:1].repeat(count, 0), jnp.float32) / 127.5 - 1
    noisy = signal_rates * images + noise_rates * jnp.asarray(rng.normal(size=images.shape), jnp.float32)
    return noisy, noise_rates, signal_rates, labels


def _outputs(model, variables, noisy, noise_rates, signal_rates, labels, scale):
    cond = {"label": labels, "guidance": np.full(len(labels), scale, np.float32)}
    return np.asarray(_denoise(model, variables, noisy, noise_rates, signal_rates, cond)[0])


def test_a_first_stage_student_outputs_its_velocity_teachers_prediction_at_initialisation():
    """Teacher and student both predict velocity: the student, the teacher's weights plus a zero-initialised
    guidance embedding, outputs the teacher's guided prediction at guidance 1 and its conditional prediction at
    every other scale (what the zero embedding implies); stage one then learns the difference."""
    config, teacher, variables = _teacher(*CONDITIONAL, "model.prediction=velocity")
    phase = plan_lib.plan(config.model, config)[0]
    assert phase.kind == "guidance"
    student = DiffusionModel(plan_lib.student_model(config.model, config, phase))
    student_vars = student_variables(student, variables, jax.random.key(0))
    inputs = _noisy_with_classes(teacher)
    conditional = _outputs(teacher, variables, *inputs, 1.0)
    for scale in (0.0, 1.0, 1.5, 4.0):
        np.testing.assert_allclose(_outputs(student, student_vars, *inputs, scale), conditional, atol=2e-5,
                                   err_msg=f"guidance {scale}")
    guided = _outputs(teacher, variables, *inputs, 4.0)
    assert np.mean(np.abs(guided - conditional)) > 0.1  # what stage one has to teach at guidance 4
    # A noise teacher's weights read as velocity are another prediction altogether (why the teacher should
    # predict velocity too).
    noise_config, noise_teacher, noise_variables = _teacher(*CONDITIONAL)
    noise_phase = plan_lib.plan(noise_config.model, noise_config)[0]
    noise_student = DiffusionModel(plan_lib.student_model(noise_config.model, noise_config, noise_phase))
    mismatch = _outputs(noise_student, student_variables(noise_student, noise_variables, jax.random.key(0)),
                        *inputs, 1.0) - _outputs(noise_teacher, noise_variables, *inputs, 1.0)
    assert np.mean(np.abs(mismatch)) > 0.1


def test_the_weight_average_warms_up_at_a_phase_start_and_keeps_nothing_of_the_previous_phase():
    """ema_decay 0.999 over 20 steps would keep 98 % of the phase's first weights (its teacher's); warmed up, the
    average follows the student."""
    config, teacher, variables = _teacher("model.prediction=velocity", "distill.start_steps=2", "distill.end_steps=1",
                                          "distill.learning_rate=2e-3", f"distill.batch_size={BATCH}",
                                          "distill.ema_decay=0.999")
    (phase,) = plan_lib.plan(config.model, config)
    _, state = _distil(teacher, variables, config, phase, steps=20, final_state=True)
    start = jax.tree.leaves(variables["params"])
    moved = sum(float(np.sum((np.asarray(p) - s) ** 2)) for p, s in zip(jax.tree.leaves(state.params), start))
    lag = sum(float(np.sum((np.asarray(e) - np.asarray(p)) ** 2))
              for e, p in zip(jax.tree.leaves(state.ema_params), jax.tree.leaves(state.params)))
    assert moved > 0 and lag < 0.25 * moved, (lag, moved)


@pytest.mark.slow  # a learning run of tens of seconds; `pytest -m slow` runs it
@pytest.mark.parametrize("recipe, share", [
    # Song et al. 2023's: the teacher's 4-step grid, the squared error, equal weights.
    (('distill.consistency_times="grid"', 'distill.consistency_loss="squared"',
      'distill.consistency_weighting="uniform"'), 0.5),
    # Consistency tuning's continuous levels, three stages of its shrinking gap (0.57 of the distance measured).
    (("distill.consistency_stage_steps=50",), 0.7),
])
def test_a_consistency_student_maps_noise_to_its_teachers_sample_in_one_step(recipe, share):
    # A teacher of image-sized predictions (a wilder one sends its own ODE, and the targets, far from the data).
    config, teacher, variables = _teacher("model.prediction=velocity", "distill.method=consistency",
                                          "distill.start_steps=4", "distill.student_steps=[1, 2, 4]",
                                          "distill.learning_rate=2e-3", f"distill.batch_size={BATCH}",
                                          "distill.consistency_steps=150", *recipe, scale=0.1)
    (phase,) = plan_lib.plan(config.model, config)
    student, student_vars = _distil(teacher, variables, config, phase, steps=150)
    teacher_four = _sample(teacher, variables, 4)
    teacher_one = _sample(teacher, variables, 1)
    student_one = _sample(student, student_vars, 1, sampler="consistency")
    distance = np.mean((student_one - teacher_four) ** 2)
    baseline = np.mean((teacher_one - teacher_four) ** 2)  # also where the student started
    assert distance < share * baseline, (distance, baseline)
    two, four = (_sample(student, student_vars, k, sampler="consistency") for k in (2, 4))
    assert not np.array_equal(two, student_one) and not np.array_equal(four, two)


@pytest.mark.slow  # a learning run of tens of seconds; `pytest -m slow` runs it
def test_student_of_n_steps_matches_the_teachers_2n_steps_better_than_the_teachers_n_steps():
    config, teacher, variables = _teacher("model.prediction=velocity", "distill.start_steps=2", "distill.end_steps=1",
                                          "distill.learning_rate=2e-3", f"distill.batch_size={BATCH}")
    (phase,) = plan_lib.plan(config.model, config)
    assert (phase.kind, phase.student_steps) == ("round", 1)
    student, student_variables_ = _distil(teacher, variables, config, phase, steps=150)
    teacher_two = _sample(teacher, variables, 2)
    teacher_one = _sample(teacher, variables, 1)
    student_one = _sample(student, student_variables_, 1)
    distance = np.mean((student_one - teacher_two) ** 2)
    baseline = np.mean((teacher_one - teacher_two) ** 2)
    assert distance < 0.5 * baseline, (distance, baseline)


@pytest.mark.slow  # a learning run of tens of seconds; `pytest -m slow` runs it
def test_guidance_conditioned_student_follows_the_scale_it_is_given():
    config, teacher, variables = _teacher(
        "model.class_conditional=true", "model.num_classes=4", "model.embedding_injection=every-block",
        "model.class_embedding=adm", "model.prediction=velocity", "distill.start_steps=2", "distill.end_steps=1",
        "distill.learning_rate=2e-3", f"distill.batch_size={BATCH}", "distill.label_dropout=0")
    stage = plan_lib.plan(config.model, config)[0]
    assert stage.kind == "guidance"
    student, student_vars = _distil(teacher, variables, config, stage, steps=200, conditional=True)
    # Noisy images at the times stage one trains (the 2-step grid), each with a class.
    count, rng = 64, np.random.default_rng(5)
    labels = (np.arange(count) % 4).astype(np.int32)
    times = jnp.asarray(rng.choice([0.5, 1.0], count), jnp.float32).reshape(-1, 1, 1, 1)
    noise_rates, signal_rates = teacher.objective.schedule(times)
    images = jnp.asarray(next(_batches(9))["image"][:1].repeat(count, 0), jnp.float32) / 127.5 - 1
    noisy = signal_rates * images + noise_rates * jnp.asarray(rng.normal(size=images.shape), jnp.float32)

    def predicted(model, model_variables, scale):
        cond = {"label": labels, "guidance": np.full(count, scale, np.float32)}
        return np.asarray(model.apply(model_variables, noisy, noise_rates, signal_rates, False, cond,
                                      method=DiffusionModel.denoise)[1])

    def gap(a, b):
        return float(np.mean((a - b) ** 2))

    unguided, guided = predicted(teacher, variables, 1.0), predicted(teacher, variables, 3.0)
    at_one, at_three = predicted(student, student_vars, 1.0), predicted(student, student_vars, 3.0)
    assert gap(unguided, guided) > 0.1  # the teacher's guidance changes its prediction
    assert gap(at_one, unguided) < gap(at_three, unguided)
    assert gap(at_three, guided) < gap(at_one, guided)


# --- sampling a student --------------------------------------------------------------------------------------------


def test_a_students_rules_refuse_other_step_counts_samplers_and_scales():
    model = dataclasses.replace(tiny_config().model, distilled_steps=4, guidance_range=(0.0, 4.0))
    rules = SamplingRules.of(model, name="flowers-student")
    assert rules.resolve() == SamplingSpec(steps=4)
    assert rules.resolve(guidance=2.5).guidance == 2.5
    with pytest.raises(SpecError, match="distilled for 4 steps") as error:
        rules.resolve(steps=8)
    assert "--steps 4 only" in error.value.cli_message
    with pytest.raises(SpecError, match="deterministic DDIM"):
        rules.resolve(sampler="dpmpp-2m")
    with pytest.raises(SpecError, match="guidance scales 0 to 4"):
        rules.resolve(guidance=5.0)
    with pytest.raises(SpecError, match="cannot invert images"):
        rules.refuse_ode("invert images")


# --- ddim distill, end to end ---------------------------------------------------------------------------------------


def _ddim(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ddim.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


def _each_one_error_line(cases):
    """Every ``(args, message)`` command fails with one ``error:`` line holding ``message``, no traceback."""
    for args, message in cases:
        result = _ddim(*args, cwd=REPO)
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert lines[-1].startswith("error:") and message in lines[-1], result.stderr
        assert "Traceback" not in result.stderr


# Stage one's scales drawn uniformly up to 4: its 3 steps move the zero-initialised guidance embedding enough that
# the students' images tell scales apart.
PROGRESSIVE = ["distill.start_steps=4", "distill.end_steps=1", "distill.first_stage_steps=3", "distill.round_steps=2",
               "distill.batch_size=4", "train.eval_every=0", "train.checkpoint_every=2", "train.log_every=1",
               'distill.guidance_sampling="uniform"']


@pytest.fixture(scope="module")
def distilled(conditional_workdir, tmp_path_factory):
    """The tiny class-conditional model distilled from 4 steps to 1 (stage one, then two rounds)."""
    from ddim.distill import distill

    out = tmp_path_factory.mktemp("distilled")
    result = distill(conditional_workdir, out, overrides=PROGRESSIVE, log=lambda message: None)
    return out, result


def test_distill_writes_a_student_per_round_that_loads_and_samples_on_its_own_grid(distilled):
    import ddim

    out, result = distilled
    assert (result.start_step, result.final_step, result.interrupted) == (0, 7, False)
    assert sorted(result.students) == [1, 2, 4]
    for steps in (4, 2, 1):
        pipe = ddim.load(out / "students" / str(steps))
        assert pipe.config.model.distilled_steps == steps and pipe.config.model.guidance_input
        assert pipe.defaults == SamplingSpec(steps=steps)
    pipe = ddim.load(out / "students" / "2")
    images = pipe.generate(3, seed=0, classes="daisy", guidance=2.0)
    again = pipe.generate(3, seed=0, classes="daisy", guidance=2.0)
    assert images.shape == (3, 16, 16, 3) and np.array_equal(images, again)
    assert not np.array_equal(images, pipe.generate(3, seed=0, classes="daisy", guidance=0.0))
    with pytest.raises(SpecError, match="distilled for 2 steps"):
        pipe.generate(3, steps=4)
    records = [json.loads(line) for line in (out / "distill.jsonl").read_text().splitlines()]
    assert records[0]["teacher"].endswith("run") and {r.get("student_steps") for r in records[1:]} == {4, 2, 1}
    from ddim import onednn

    kernels = onednn.kernels("cpu", "float32")  # each stretch of training names what ran its convolutions
    assert all({key: record[key] for key in kernels} == kernels for record in records[1:])
    # What a student cannot do names the diffusion model it was distilled from.
    assert pipe.config.model.distilled_from == records[0]["teacher"]
    with pytest.raises(SpecError, match=f"distilled from \\({records[0]['teacher']}\\)"):
        pipe.invert(images)


def test_distill_again_has_nothing_to_do_and_a_changed_setting_is_refused(distilled, conditional_workdir):
    from ddim.distill import distill
    from ddim.train import TrainingError

    out, _ = distilled
    settings = PROGRESSIVE
    lines = []
    again = distill(conditional_workdir, out, overrides=settings, log=lines.append)
    assert (again.start_step, again.final_step) == (7, 7) and "nothing to do" in lines[-1]
    with pytest.raises(TrainingError, match="distill.round_steps is 3 but the run was started with 2"):
        distill(conditional_workdir, out, overrides=[*settings, "distill.round_steps=3"], log=lambda m: None)


def test_distill_command_errors_are_one_line(distilled, conditional_workdir, tmp_path):
    out, _ = distilled
    cases = [
        (["distill", "--workdir", conditional_workdir, "--out", tmp_path / "a", "--set", "distill.start_steps=6",
          "--set", "distill.end_steps=4"], "not reachable by halving"),
        (["distill", "--workdir", out / "students" / "2", "--out", tmp_path / "b"], "is a distilled student"),
        (["distill", "--out", tmp_path / "c"], "name one teacher"),
        (["sample", "--workdir", out / "students" / "1", "--steps", "2", "--out", tmp_path / "d"],
         "distilled for --steps 1 only"),
    ]
    _each_one_error_line(cases)


CONSISTENCY = ["distill.method=consistency", "distill.start_steps=4", "distill.student_steps=[1, 2, 4]",
               "distill.consistency_steps=3", "distill.batch_size=4", "train.eval_every=1", "train.checkpoint_every=2",
               "train.log_every=1", "train.grid_rows=1", "train.grid_cols=2"]


@pytest.fixture(scope="module")
def consistency_student(conditional_workdir, tmp_path_factory):
    """The tiny class-conditional model distilled into one consistency student of 1, 2 and 4 steps."""
    from ddim.distill import distill

    out = tmp_path_factory.mktemp("consistency")
    lines = []
    result = distill(conditional_workdir, out, overrides=CONSISTENCY, log=lines.append)
    return out, result, lines


def test_consistency_distillation_writes_one_student_that_samples_in_1_2_and_4_steps(consistency_student,
                                                                                      conditional_workdir):
    import ddim

    out, result, lines = consistency_student
    student = out / "students" / "consistency"
    assert (result.start_step, result.final_step, result.interrupted) == (0, 3, False)
    assert result.students == {1: student, 2: student, 4: student}
    assert any("warning: the teacher predicts noise" in line for line in lines)
    assert sorted(path.name for path in (out / "samples").glob("*.png"))  # the grids, with its own sampler
    pipe = ddim.load(student)
    model = pipe.config.model
    assert (model.distilled_steps, model.distilled_step_counts, model.distilled_sampler, model.prediction) == (
        4, (1, 2, 4), "consistency", "velocity")
    assert pipe.defaults == SamplingSpec(steps=4, sampler="consistency")
    images = {steps: pipe.generate(3, steps=steps, seed=0, classes="daisy", guidance=1.5) for steps in (1, 2, 4)}
    assert all(batch.shape == (3, 16, 16, 3) for batch in images.values())
    assert np.array_equal(images[2], pipe.generate(3, steps=2, seed=0, classes="daisy", guidance=1.5))
    assert not np.array_equal(images[1], images[2]) and not np.array_equal(images[2], images[4])
    with pytest.raises(SpecError, match="distilled for 1, 2, 4 steps"):
        pipe.generate(3, steps=3)
    with pytest.raises(SpecError, match="for consistency sampling on the uniform grid"):
        pipe.generate(3, steps=2, sampler="ddim")
    with pytest.raises(SpecError, match=f"distilled from \\({conditional_workdir.absolute()}\\)"):
        pipe.invert(images[1])
    frames = pipe.interpolate(pipe.latents(1, seed=0), pipe.latents(1, seed=1), frames=3, steps=1)  # its sampler
    assert frames.shape == (3, 16, 16, 3) and not np.array_equal(frames[0], frames[2])


def test_a_consistency_student_round_trips_through_its_checkpoint(consistency_student):
    """students/consistency holds the run's last state, and samples what those weights sample."""
    import ddim
    from ddim.checkpoint import Checkpointer, load_ema

    out, result, _ = consistency_student
    checkpointer = Checkpointer(out / "checkpoints")
    state = checkpointer.restore_state(result.final_step)
    checkpointer.close()
    loaded = load_ema(out / "students" / "consistency")
    assert loaded.step == result.final_step
    jax.tree.map(np.testing.assert_array_equal, loaded.variables["params"], state["ema_params"])
    pipe = ddim.load(out / "students" / "consistency")
    spec = SamplingSpec(steps=2, sampler="consistency", guidance=2.0)
    cond = {"label": np.zeros(3, np.int32), "guidance": np.full(3, 2.0, np.float32)}
    direct = process.generate(pipe.model, {"params": state["ema_params"], "batch_stats": state["ema_batch_stats"]},
                              jax.random.key(1), 3, spec, cond=cond)
    again = process.generate(pipe.model, pipe.variables, jax.random.key(1), 3, spec, cond=cond)
    np.testing.assert_array_equal(np.asarray(direct), np.asarray(again))


def test_consistency_command_errors_are_one_line(consistency_student, conditional_workdir, tmp_path):
    out, _, _ = consistency_student
    student = out / "students" / "consistency"
    cases = [
        (["distill", "--workdir", conditional_workdir, "--out", tmp_path / "a", "--method", "bogus"],
         "--method must be one of progressive, consistency"),
        (["distill", "--workdir", conditional_workdir, "--out", tmp_path / "b", "--method", "consistency", "--set",
          "distill.start_steps=4", "--set", "distill.student_steps=[1, 3]"],
         "must be different step counts that divide"),
        (["sample", "--workdir", student, "--steps", "3", "--out", tmp_path / "c"],
         "distilled for --steps 1, 2, 4 only"),
        (["sample", "--workdir", conditional_workdir, "--sampler", "consistency", "--out", tmp_path / "d"],
         "--sampler consistency is for consistency students"),
    ]
    _each_one_error_line(cases)
    assert not (tmp_path / "b").exists()  # refused before anything is written


def _stop_at_call(monkeypatch, count: int) -> None:
    """SIGTERM (as a stop request) in the ``count``-th distillation step of the next run."""
    import os
    import signal

    from ddim.distill import loop

    real, calls = loop.compiled_step, {"n": 0}

    def stopping(settings_, mesh):
        step = real(settings_, mesh)

        def wrapped(*args):
            calls["n"] += 1
            if calls["n"] == count:
                os.kill(os.getpid(), signal.SIGTERM)
            return step(*args)

        return wrapped

    monkeypatch.setattr(loop, "compiled_step", stopping)


@pytest.mark.slow
def test_a_stopped_consistency_distillation_resumes_to_the_same_student(conditional_workdir, tmp_path, monkeypatch):
    from ddim.checkpoint import load_ema
    from ddim.distill import distill

    settings = [*CONSISTENCY[:3], "distill.consistency_steps=5", "distill.batch_size=4", "train.eval_every=0",
                "train.checkpoint_every=100"]
    distill(conditional_workdir, tmp_path / "straight", overrides=settings, log=lambda m: None)
    _stop_at_call(monkeypatch, 3)
    stopped = distill(conditional_workdir, tmp_path / "resumed", overrides=settings, log=lambda m: None)
    assert stopped.interrupted and stopped.final_step == 3 and not stopped.students
    monkeypatch.undo()
    resumed = distill(conditional_workdir, tmp_path / "resumed", overrides=settings, log=lambda m: None)
    assert (resumed.start_step, resumed.final_step, sorted(resumed.students)) == (3, 5, [1, 2, 4])

    def final(root):
        return load_ema(root / "students" / "consistency").variables["params"]

    jax.tree.map(np.testing.assert_array_equal, final(tmp_path / "straight"), final(tmp_path / "resumed"))


@pytest.mark.slow
def test_a_stopped_distillation_resumes_to_the_same_students(conditional_workdir, tmp_path, monkeypatch):
    from ddim.checkpoint import Checkpointer
    from ddim.distill import distill

    settings = ["distill.start_steps=2", "distill.end_steps=1", "distill.first_stage_steps=3",
                "distill.round_steps=3", "distill.batch_size=4", "train.eval_every=0", "train.checkpoint_every=100"]
    distill(conditional_workdir, tmp_path / "straight", overrides=settings, log=lambda m: None)
    _stop_at_call(monkeypatch, 4)  # the first step of the round: stage one's student is out, the round is not
    stopped = distill(conditional_workdir, tmp_path / "resumed", overrides=settings, log=lambda m: None)
    assert stopped.interrupted and stopped.final_step == 4 and sorted(stopped.students) == [2]
    monkeypatch.undo()
    resumed = distill(conditional_workdir, tmp_path / "resumed", overrides=settings, log=lambda m: None)
    assert (resumed.start_step, resumed.final_step, sorted(resumed.students)) == (4, 6, [1, 2])

    def final(root):
        checkpointer = Checkpointer(root / "students" / "1" / "checkpoints")
        state = checkpointer.restore_state(6)
        checkpointer.close()
        return state["ema_params"]

    jax.tree.map(np.testing.assert_array_equal, final(tmp_path / "straight"), final(tmp_path / "resumed"))


@pytest.mark.slow  # a learning run of tens of seconds; `pytest -m slow` runs it
def test_the_distillation_benchmark_scores_students_beside_their_teacher_once(distilled, conditional_workdir, tmp_path,
                                                                              capsys):
    from benchmarks.studies import distill
    from tests.test_evaluation import tiny_extractor

    out, _ = distilled
    args = ["--students", str(out), "--teacher", str(conditional_workdir), "--out", str(tmp_path), "--num", "4",
            "--guidance", "1", "2", "--student-steps", "2", "--teacher-path", "2", "--teacher-guidance", "1.5", "2"]
    rows = distill.main(args, feature_extractor_factory=tiny_extractor)
    students = [row for row in rows if row["model"] == "student"]
    assert {(row["steps"], row["guidance"], row["passes"]) for row in students} == {(2, 1.0, 2), (2, 2.0, 2)}
    teacher = {(row["passes"], row["steps"], row["sampler"], row["guidance"]) for row in rows
               if row["model"] == "teacher"}
    assert teacher == {(2, 2, "ddim", 1.0), (2, 1, "ddim", 1.5), (2, 2, "dpmpp-2m", 1.0), (2, 1, "dpmpp-2m", 1.5),
                       (4, 2, "ddim", 1.5), (4, 2, "ddim", 2.0), (20, 20, "ddim", None)}
    # at the student's passes (guided at the first scale), its path at both scales, its defaults
    assert "| student | 2 | 2 | ddim/uniform |" in capsys.readouterr().out
    again = distill.main(args, feature_extractor_factory=tiny_extractor)  # nothing left to score
    assert len(again) == len(rows)
    assert len((tmp_path / "distill.jsonl").read_text().splitlines()) == len(rows)
    assert set(distill.find_students(out)) == {1, 2, 4}  # stage one's student (4 steps) and each round's


@pytest.mark.slow  # a learning run of tens of seconds; `pytest -m slow` runs it
def test_the_distillation_benchmark_scores_a_consistency_student_and_clipped_sampling(consistency_student,
                                                                                     conditional_workdir, tmp_path,
                                                                                     capsys):
    from benchmarks.studies import distill
    from tests.test_evaluation import tiny_extractor

    out, _, _ = consistency_student
    args = ["--students", str(out), "--teacher", str(conditional_workdir), "--out", str(tmp_path), "--num", "4",
            "--guidance", "1.5", "--student-steps", "1", "--teacher-path", "--teacher-num", "4", "--clip"]
    rows = distill.main(args, feature_extractor_factory=tiny_extractor)
    students = {(row["steps"], row["sampler"], row["clip"]) for row in rows if row["model"] == "student"}
    assert students == {(1, "consistency", False), (1, "consistency", True)}
    printed = capsys.readouterr().out
    assert "| student | 1 | 1 | consistency/uniform clipped |" in printed
    assert "- consistency: 3 optimiser steps" in printed


@pytest.mark.slow  # a learning run of tens of seconds; `pytest -m slow` runs it
def test_the_distillation_benchmark_measures_what_a_step_of_each_kind_costs(conditional_workdir, tmp_path, capsys):
    from benchmarks.studies import distill

    config = tmp_path / "tiny.toml"
    config.write_text("[distill]\nstart_steps = 4\nbatch_size = 4\n")
    rows = distill.main(["--teacher", str(conditional_workdir), "--step-cost", str(config)])
    assert [row["kind"] for row in rows] == ["guidance", "round", "consistency"]
    assert all(row["cpu_seconds"] > 0 for row in rows)
    assert "- consistency: " in capsys.readouterr().out


def test_the_web_page_takes_a_student_at_its_own_steps(distilled):
    import ddim
    from ddim.ui.checks import ANY_CLASS
    from ddim.ui.page import build_page
    from ddim.ui.workbench import Workbench

    out, _ = distilled
    bench = Workbench(ddim.load(out / "students" / "2"))
    result = bench.sample(2, 2, 0, class_name=ANY_CLASS, guidance=1.5)
    assert result.images.shape == (2, 16, 16, 3) and "--guidance 1.5" in result.command
    with pytest.raises(SpecError, match="distilled for 2 steps"):
        bench.sample(2, 4, 0, class_name=ANY_CLASS, guidance=1.5)
    blocks = {block.elem_id: block for block in build_page(bench).blocks.values() if block.elem_id}
    assert {"sample-run", "trajectory-run", "inpaint-run"} <= set(blocks)
    assert not {"edit-run", "reconstruct-run"} & set(blocks)  # no ODE to run part way or backwards
    steps = blocks["sample-steps"]
    assert (steps.value, steps.interactive) == (2, False)
    assert (blocks["sample-guidance"].minimum, blocks["sample-guidance"].maximum) == (0.0, 4.0)


def test_a_bundled_student_records_its_distillation_and_samples_at_its_own_steps(distilled, tmp_path, monkeypatch):
    import ddim
    from ddim.pretrained import export_checkpoint
    from ddim.pretrained.render import describe

    out, _ = distilled
    manifest = export_checkpoint(out / "students" / "2", "tiny-2step", root=tmp_path, fid=50.0,
                                 fid_protocol="tiny", recipe="ddim distill ...")
    # Images seen count the student's batches ([distill]), not its teacher's ([train]).
    assert manifest.record["batch_size"] == 4 and manifest.record["images_seen"] == 4 * manifest.record["steps"]
    lines = "\n".join(describe(manifest))
    assert "guidance scale (0 to 4) as an input" in lines
    assert "samples with 2 deterministic DDIM steps of one network pass each" in lines
    monkeypatch.setenv("DDIM_PRETRAINED_DIR", str(tmp_path))
    pipe = ddim.load("pretrained:tiny-2step")
    assert pipe.defaults == SamplingSpec(steps=2) and pipe.generate(2, seed=0).shape == (2, 16, 16, 3)
    with pytest.raises(SpecError, match="distilled for 2 steps"):
        pipe.generate(2, steps=20)
