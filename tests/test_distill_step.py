"""The distillation step on a tiny network (ddim/distill/step.py): a first-stage student at initialisation, the
weight average at a phase's start, and (slow) short learning runs of each kind of student."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim.distill import plan as plan_lib
from ddim.distill.step import student_variables
from ddim.model import DiffusionModel
from tests.distill_helpers import BATCH, distil, image_batches, jit_denoise, sample_images, tiny_teacher


CONDITIONAL = ("model.class_conditional=true", "model.num_classes=4", "model.embedding_injection=every-block",
               "model.class_embedding=adm")


def _noisy_with_classes(model, count=24, seed=5):
    """Noisy images at times across the schedule, each with a class (a quarter the null class)."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(count) % 5 - 1).astype(np.int32)  # -1 is the null class
    times = jnp.asarray(rng.uniform(0.05, 1.0, count), jnp.float32).reshape(-1, 1, 1, 1)
    noise_rates, signal_rates = model.objective.schedule(times)
    images = jnp.asarray(next(image_batches(9))["image"][:1].repeat(count, 0), jnp.float32) / 127.5 - 1
    noisy = signal_rates * images + noise_rates * jnp.asarray(rng.normal(size=images.shape), jnp.float32)
    return noisy, noise_rates, signal_rates, labels


def _outputs(model, variables, noisy, noise_rates, signal_rates, labels, scale):
    cond = {"label": labels, "guidance": np.full(len(labels), scale, np.float32)}
    return np.asarray(jit_denoise(model, variables, noisy, noise_rates, signal_rates, cond)[0])


def test_a_first_stage_student_outputs_its_velocity_teachers_prediction_at_initialisation():
    """Teacher and student both predict velocity: the student, the teacher's weights plus a zero-initialised
    guidance embedding, outputs the teacher's guided prediction at guidance 1 and its conditional prediction at
    every other scale (what the zero embedding implies); stage one then learns the difference."""
    config, teacher, variables = tiny_teacher(*CONDITIONAL, "model.prediction=velocity")
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
    noise_config, noise_teacher, noise_variables = tiny_teacher(*CONDITIONAL)
    noise_phase = plan_lib.plan(noise_config.model, noise_config)[0]
    noise_student = DiffusionModel(plan_lib.student_model(noise_config.model, noise_config, noise_phase))
    mismatch = _outputs(noise_student, student_variables(noise_student, noise_variables, jax.random.key(0)),
                        *inputs, 1.0) - _outputs(noise_teacher, noise_variables, *inputs, 1.0)
    assert np.mean(np.abs(mismatch)) > 0.1


def test_the_weight_average_warms_up_at_a_phase_start_and_keeps_nothing_of_the_previous_phase():
    """ema_decay 0.999 over 20 steps would keep 98 % of the phase's first weights (its teacher's); warmed up, the
    average follows the student."""
    config, teacher, variables = tiny_teacher("model.prediction=velocity", "distill.start_steps=2", "distill.end_steps=1",
                                          "distill.learning_rate=2e-3", f"distill.batch_size={BATCH}",
                                          "distill.ema_decay=0.999")
    (phase,) = plan_lib.plan(config.model, config)
    _, state = distil(teacher, variables, config, phase, steps=20, final_state=True)
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
    (("distill.consistency_stage_steps=50", 'distill.consistency_times="continuous"',
      'distill.consistency_loss="pseudo-huber"', 'distill.consistency_weighting="inverse-gap"'), 0.7),
])
def test_a_consistency_student_maps_noise_to_its_teachers_sample_in_one_step(recipe, share):
    # A teacher of image-sized predictions (a wilder one sends its own ODE, and the targets, far from the data).
    config, teacher, variables = tiny_teacher("model.prediction=velocity", "distill.method=consistency",
                                          "distill.start_steps=4", "distill.student_steps=[1, 2, 4]",
                                          "distill.learning_rate=2e-3", f"distill.batch_size={BATCH}",
                                          "distill.consistency_steps=150", *recipe, scale=0.1)
    (phase,) = plan_lib.plan(config.model, config)
    student, student_vars = distil(teacher, variables, config, phase, steps=150)
    teacher_four = sample_images(teacher, variables, 4)
    teacher_one = sample_images(teacher, variables, 1)
    student_one = sample_images(student, student_vars, 1, sampler="consistency")
    distance = np.mean((student_one - teacher_four) ** 2)
    baseline = np.mean((teacher_one - teacher_four) ** 2)  # also where the student started
    assert distance < share * baseline, (distance, baseline)
    two, four = (sample_images(student, student_vars, k, sampler="consistency") for k in (2, 4))
    assert not np.array_equal(two, student_one) and not np.array_equal(four, two)


@pytest.mark.slow  # a learning run of tens of seconds; `pytest -m slow` runs it
def test_student_of_n_steps_matches_the_teachers_2n_steps_better_than_the_teachers_n_steps():
    config, teacher, variables = tiny_teacher("model.prediction=velocity", "distill.start_steps=2", "distill.end_steps=1",
                                          "distill.learning_rate=2e-3", f"distill.batch_size={BATCH}")
    (phase,) = plan_lib.plan(config.model, config)
    assert (phase.kind, phase.student_steps) == ("round", 1)
    student, student_variables_ = distil(teacher, variables, config, phase, steps=150)
    teacher_two = sample_images(teacher, variables, 2)
    teacher_one = sample_images(teacher, variables, 1)
    student_one = sample_images(student, student_variables_, 1)
    distance = np.mean((student_one - teacher_two) ** 2)
    baseline = np.mean((teacher_one - teacher_two) ** 2)
    assert distance < 0.5 * baseline, (distance, baseline)


@pytest.mark.slow  # a learning run of tens of seconds; `pytest -m slow` runs it
def test_guidance_conditioned_student_follows_the_scale_it_is_given():
    config, teacher, variables = tiny_teacher(
        "model.class_conditional=true", "model.num_classes=4", "model.embedding_injection=every-block",
        "model.class_embedding=adm", "model.prediction=velocity", "distill.start_steps=2", "distill.end_steps=1",
        "distill.learning_rate=2e-3", f"distill.batch_size={BATCH}", "distill.label_dropout=0")
    stage = plan_lib.plan(config.model, config)[0]
    assert stage.kind == "guidance"
    student, student_vars = distil(teacher, variables, config, stage, steps=200, conditional=True)
    # Noisy images at the times stage one trains (the 2-step grid), each with a class.
    count, rng = 64, np.random.default_rng(5)
    labels = (np.arange(count) % 4).astype(np.int32)
    times = jnp.asarray(rng.choice([0.5, 1.0], count), jnp.float32).reshape(-1, 1, 1, 1)
    noise_rates, signal_rates = teacher.objective.schedule(times)
    images = jnp.asarray(next(image_batches(9))["image"][:1].repeat(count, 0), jnp.float32) / 127.5 - 1
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
