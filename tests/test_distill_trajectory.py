"""The trajectory phase of progressive distillation (``distill.trajectory_steps``): the plan, the target against
the DDIM step it must make, the bank's draws at the student's grid times, a run end to end, a finished run that adds
it, and bad settings."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim import diffusion
from ddim.distill import bank as bank_lib
from ddim.distill import plan as plan_lib
from ddim.distill import targets
from ddim.model import DiffusionModel
from ddim.objective import Objective
from tests.conftest import tiny_config
from tests.distill_helpers import distil_recording_starts, each_one_error_line, tiny_teacher


def test_the_trajectory_phase_comes_after_the_last_round_and_samples_as_its_student():
    teacher = tiny_config("model.class_conditional=true", "model.prediction=velocity").model
    config = tiny_config("distill.start_steps=8", "distill.end_steps=2", "distill.first_stage_steps=3",
                         "distill.round_steps=4", "distill.trajectory_steps=5")
    phases = plan_lib.plan(teacher, config)
    assert [(p.kind, p.student_steps, p.start, p.end, p.grid_steps) for p in phases] == [
        ("guidance", 8, 0, 3, 8), ("round", 4, 3, 7, 4), ("round", 2, 7, 11, 2), ("trajectory", 2, 11, 16, 8)]
    last_round, final = phases[-2:]
    assert (final.student_name, final.delivers_student) == ("trajectory", True)
    assert final.describe() == "the 2-step student on the teacher's 8-step trajectories"
    # The same network, steps and sampler as the round's student, which it starts from.
    assert plan_lib.student_model(teacher, config, final) == plan_lib.student_model(teacher, config, last_round)
    without = tiny_config("distill.start_steps=8", "distill.end_steps=2", "distill.first_stage_steps=3",
                          "distill.round_steps=4")
    assert [p.kind for p in plan_lib.plan(teacher, without)] == ["guidance", "round", "round"]


def test_a_student_teacher_is_refused_the_trajectory_phase_which_banks_a_diffusion_models_path():
    import dataclasses

    from ddim.config import ConfigError

    teacher = tiny_config("model.class_conditional=true", "model.prediction=velocity").model
    config = tiny_config("distill.start_steps=4", "distill.end_steps=2", "distill.trajectory_steps=5")
    student = plan_lib.student_model(teacher, config, plan_lib.plan(teacher, config)[-1])
    halving = dataclasses.replace(config, distill=dataclasses.replace(config.distill, start_steps=2, end_steps=1))
    with pytest.raises(ConfigError, match="distill.trajectory_steps banks the diffusion model's own path"):
        plan_lib.check_teacher(student, "the teacher runs/x/students/2", halving)


def test_a_prediction_at_the_trajectory_target_steps_onto_the_paths_next_point_and_ends_at_its_end():
    schedule = Objective.of(tiny_config().model).schedule
    rng = np.random.default_rng(0)
    z_t, z_s = (jnp.asarray(rng.normal(size=(2, 4, 4, 3)), jnp.float32) for _ in range(2))
    t = jnp.array([1.0, 0.5]).reshape(-1, 1, 1, 1)  # a 2-step grid: its first time, then its last
    rates_t, rates_s = schedule(t), schedule(t - 0.5)
    target = targets.trajectory_target(z_t, rates_t, z_s, rates_s, jnp.array([False, True]))
    # The DDIM step (eq. 12, eta 0) with the target as its image prediction lands on the path's next point ...
    noise = (z_t[:1] - rates_t[1][:1] * target[:1]) / rates_t[0][:1]
    landed = diffusion.ddim_step(target[:1], noise, rates_s[0][:1], rates_s[1][:1])
    np.testing.assert_allclose(np.asarray(landed), np.asarray(z_s[:1]), atol=1e-4)
    # ... and at the grid's last time the prediction is the sample: the path's end itself.
    np.testing.assert_array_equal(np.asarray(target[1]), np.asarray(z_s[1]))


def test_the_grid_batches_hold_the_paths_points_at_the_students_times_and_resume_exactly():
    size, steps, shape = 5, 4, (4, 4, 3)
    rng = np.random.default_rng(1)
    bank = bank_lib.Bank(rng.normal(size=(size, steps, *shape)).astype(np.float16),
                         rng.normal(size=(size, *shape)).astype(np.float32), np.arange(size, dtype=np.int32),
                         np.linspace(1.0, 3.0, size).astype(np.float32))
    draws = bank_lib.grid_batches(bank, 0, 6, 0, 2)
    first, second, third = next(draws), next(draws), next(draws)
    resumed = next(bank_lib.grid_batches(bank, 0, 6, 2, 2))
    assert all(np.array_equal(third[key], resumed[key]) for key in third)
    assert not all(np.array_equal(first[key], second[key]) for key in first)
    assert set(first) == {"state", "next", "index", "noise", "end", "label", "guidance"}
    for batch in (first, second, third):
        for i, index in enumerate(batch["index"]):
            k = int(batch["label"][i])  # the labels number the trajectories here
            assert batch["guidance"][i] == bank.guidance[k]
            # The student's time index/2 is the bank's point 2 * index of 4: at [k, 2 * index - 1].
            np.testing.assert_array_equal(batch["state"][i], bank.states[k, 2 * index - 1].astype(np.float32))
            following = bank.ends[k] if index == 1 else bank.states[k, 1].astype(np.float32)
            np.testing.assert_array_equal(batch["next"][i], following)
            # The rollout's pair: the path's start (its point at t = 1) and its end.
            np.testing.assert_array_equal(batch["noise"][i], bank.states[k, steps - 1].astype(np.float32))
            np.testing.assert_array_equal(batch["end"][i], bank.ends[k])
    assert {1, 2} <= set(np.concatenate([first["index"], second["index"], third["index"]]).tolist())
    with pytest.raises(ValueError, match="not part of the bank's 4-step grid"):
        next(bank_lib.grid_batches(bank, 0, 6, 0, 3))


TRAJECTORY = ["distill.start_steps=4", "distill.end_steps=2", "distill.first_stage_steps=2", "distill.round_steps=2",
              "distill.trajectory_steps=3", "distill.consistency_bank_size=6", "distill.batch_size=4",
              "train.eval_every=0", "train.checkpoint_every=100"]


def test_a_run_with_the_trajectory_phase_tunes_the_last_rounds_student_on_the_banked_path(conditional_workdir,
                                                                                          tmp_path):
    from ddim.checkpoint import load_ema

    result, lines, starts = distil_recording_starts(conditional_workdir, tmp_path, TRAJECTORY)
    students = tmp_path / "students"
    assert result.final_step == 7
    assert result.students == {4: students / "4", 2: students / "trajectory"}
    tuned, round_student = load_ema(students / "trajectory"), load_ema(students / "2")
    assert tuned.step == 7 and tuned.config.model == round_student.config.model
    assert tuned.config.model.distilled_steps == 2
    # It starts from the round's student and moves away from it.
    jax.tree.map(np.testing.assert_array_equal, starts["trajectory"], round_student.variables["params"])
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()), tuned.variables["params"],
                                         round_student.variables["params"]))
    assert max(moved) > 0
    assert any(line.startswith("banked 6 trajectories in") for line in lines)
    records = [json.loads(line) for line in (tmp_path / "distill.jsonl").read_text().splitlines()[1:]]
    # Stage one and the round of 2 steps each, then the bank's solving and the trajectory phase's 3 steps.
    assert [(r["phase"], r["from_step"], r["to_step"]) for r in records] == [
        ("guidance", 0, 2), ("round", 2, 4), ("trajectory", 4, 4), ("trajectory", 4, 7)]
    with np.load(tmp_path / "trajectories.npz") as stored:  # the teacher's 4-step path, not a student's 2
        assert stored["states"].shape == (6, 4, 16, 16, 3)


def test_a_finished_run_adds_the_trajectory_phase_and_refuses_other_changes(conditional_workdir, tmp_path):
    from ddim.distill import distill
    from ddim.errors import UserError

    rounds = [setting for setting in TRAJECTORY if not setting.startswith("distill.trajectory_steps")]
    finished = distill(conditional_workdir, tmp_path, overrides=rounds, log=lambda line: None)
    assert finished.final_step == 4 and finished.students[2] == tmp_path / "students" / "2"
    with pytest.raises(UserError, match="distill.round_steps is 3 but the run was started with 2"):
        distill(conditional_workdir, tmp_path, overrides=[*TRAJECTORY, "distill.round_steps=3"], log=lambda line: None)
    # The phase's own settings may be chosen when it is added.
    extended = distill(conditional_workdir, tmp_path, overrides=[*TRAJECTORY, "distill.trajectory_learning_rate=3e-4",
                                                                  "distill.trajectory_rollout=0.5"], log=lambda line: None)
    assert (extended.start_step, extended.final_step) == (4, 7)
    assert extended.students[2] == tmp_path / "students" / "trajectory"


def test_the_trajectory_phase_starts_at_its_own_learning_rate_and_the_rounds_at_theirs():
    from ddim.distill.step import optimizer

    teacher = tiny_config("model.class_conditional=true", "model.prediction=velocity").model
    config = tiny_config("distill.start_steps=4", "distill.end_steps=2", "distill.trajectory_steps=5",
                         "distill.learning_rate=3e-3", "distill.trajectory_learning_rate=5e-4")

    def first_step_size(phase):  # Adam's first step moves each weight by its learning rate, whatever the gradient
        tx = optimizer(config.distill, phase)
        params = jnp.zeros(3)
        updates, _ = tx.update(jnp.array([0.2, -4.0, 1.0]), tx.init(params), params)
        return np.abs(np.asarray(updates))

    *rounds, final = plan_lib.plan(teacher, config)
    assert final.kind == "trajectory"
    for phase in rounds:
        np.testing.assert_allclose(first_step_size(phase), 3e-3, rtol=1e-4)
    np.testing.assert_allclose(first_step_size(final), 5e-4, rtol=1e-4)


@pytest.mark.parametrize("rollout", [0, 1])
def test_a_trajectory_step_lowers_the_loss_on_a_fixed_batch(rollout):
    from ddim.distill.step import StepSettings, create_student_state, trajectory_step

    config = tiny_config("model.class_conditional=true", "model.num_classes=4", "model.prediction=velocity",
                         "distill.start_steps=4", "distill.end_steps=2", "distill.trajectory_steps=100",
                         "distill.trajectory_learning_rate=2e-3", f"distill.trajectory_rollout={rollout}",
                         "distill.round_steps=1", "distill.first_stage_steps=1")
    _, teacher, variables = tiny_teacher("model.class_conditional=true", "model.num_classes=4",
                                         "model.prediction=velocity", scale=0.1)
    phase = plan_lib.plan(teacher.config, config)[-1]
    student = DiffusionModel(plan_lib.student_model(teacher.config, config, phase))
    state = create_student_state(student, variables, config, phase, jax.random.key(0))
    settings = StepSettings.of(student, teacher, config, phase)
    rng = np.random.default_rng(2)
    batch = {name: rng.normal(size=(4, 16, 16, 3)).astype(np.float32) for name in ("state", "next", "noise", "end")}
    batch.update(index=np.array([1, 2, 1, 2], np.int32), label=np.array([0, 1, -1, 3], np.int32),
                 guidance=np.array([1.0, 2.0, 3.0, 1.5], np.float32))
    step = jax.jit(lambda s: trajectory_step(s, None, batch, None, settings))
    losses = []
    for _ in range(16):
        state, metrics = step(state)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.85 * losses[0], losses


@pytest.mark.parametrize("steps", [1, 2, 4])
def test_the_students_own_sample_in_the_rollout_is_the_samplers(steps):
    from ddim import samplers

    def denoise(z, noise_rates, signal_rates):  # any smooth function of its inputs stands in for a network
        images = jnp.tanh(0.7 * z + signal_rates) * (1.0 - 0.5 * noise_rates)
        return (z - signal_rates * images) / noise_rates, images

    noise = jax.random.normal(jax.random.key(3), (3, 8, 8, 3))
    expected = samplers.run(denoise, diffusion.cosine_schedule, noise, samplers.UniformGrid(steps), "ddim").pred_images
    sample = targets.student_sample(denoise, diffusion.cosine_schedule, noise, steps)
    np.testing.assert_allclose(np.asarray(sample), np.asarray(expected), atol=1e-5)


def test_the_rollout_term_adds_its_weight_times_the_samples_error_against_the_paths_end():
    from ddim.distill.step import StepSettings, create_student_state, trajectory_step
    from ddim.model import bind_denoiser

    overrides = ("model.class_conditional=true", "model.num_classes=4", "model.prediction=velocity",
                 "distill.start_steps=4", "distill.end_steps=2", "distill.trajectory_steps=100",
                 "distill.round_steps=1", "distill.first_stage_steps=1")
    _, teacher, variables = tiny_teacher(*overrides[:3], scale=0.1)
    rng = np.random.default_rng(4)
    batch = {name: rng.normal(size=(4, 16, 16, 3)).astype(np.float32) for name in ("state", "next", "noise")}
    batch.update(index=np.array([1, 2, 1, 2], np.int32), label=np.array([0, 1, -1, 3], np.int32),
                 guidance=np.array([1.0, 2.0, 3.0, 1.5], np.float32))

    def first_loss(weight, end):
        config = tiny_config(*overrides, f"distill.trajectory_rollout={weight}")
        phase = plan_lib.plan(teacher.config, config)[-1]
        student = DiffusionModel(plan_lib.student_model(teacher.config, config, phase))
        state = create_student_state(student, variables, config, phase, jax.random.key(0))
        settings = StepSettings.of(student, teacher, config, phase)
        denoise = bind_denoiser(student, {"params": state.params, "batch_stats": state.batch_stats})
        cond = {"label": batch["label"], "guidance": batch["guidance"]}
        sample = targets.student_sample(lambda z, n, s: denoise(z, n, s, cond), student.objective.schedule,
                                        batch["noise"], 2)
        _, metrics = trajectory_step(state, None, dict(batch, end=end(np.asarray(sample))), None, settings)
        return float(metrics["loss"])

    points_only = first_loss(0.0, lambda sample: sample + 5.0)
    # The student's own sample as the path's end: nothing to add; 0.1 away everywhere: weight * 0.01.
    assert first_loss(0.5, lambda sample: sample) == pytest.approx(points_only, rel=1e-5)
    assert first_loss(0.5, lambda sample: sample + 0.1) == pytest.approx(points_only + 0.5 * 0.01, rel=1e-4)


def test_bad_trajectory_settings_are_one_error_line_before_anything_is_written(conditional_workdir, tmp_path):
    teacher = ["distill", "--workdir", conditional_workdir]
    cases = [
        ([*teacher, "--out", tmp_path / "a", "--set", "distill.trajectory_steps=-1"],
         "distill.trajectory_steps must be >= 0, got -1"),
        ([*teacher, "--out", tmp_path / "b", "--method", "consistency", "--set", "distill.trajectory_steps=5"],
         "distill.trajectory_steps is for distill.method \"progressive\""),
        ([*teacher, "--out", tmp_path / "c", "--set", "distill.trajectory_steps=5", "--set",
          "distill.consistency_bank_size=8", "--set", "distill.batch_size=16"],
         "distill.consistency_bank_size (8) must be at least distill.batch_size (16)"),
        ([*teacher, "--out", tmp_path / "d", "--set", "distill.trajectory_steps=5", "--set",
          "distill.trajectory_learning_rate=0"], "distill.trajectory_learning_rate must be > 0, got 0"),
        ([*teacher, "--out", tmp_path / "e", "--set", "distill.trajectory_rollout=1"],
         "distill.trajectory_rollout weighs a term of the trajectory phase"),
        ([*teacher, "--out", tmp_path / "f", "--set", "distill.trajectory_steps=5", "--set",
          "distill.trajectory_rollout=-1"], "it must be >= 0, and 0 without distill.trajectory_steps; got -1"),
    ]
    each_one_error_line(cases)
    assert not any((tmp_path / name).exists() for name in "abcdef")
