"""Distillation (ddim/distill/): the maths, the plan, the step on a tiny network, and ``ddim distill`` end to end."""

import dataclasses
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
from ddim.distill.step import StepSettings, create_student_state, distill_step, student_variables
from ddim.model import DiffusionModel, init_variables
from ddim.objective import Objective
from ddim.sampling import process
from ddim.spec import SamplingRules, SamplingSpec, SpecError
from tests.conftest import REPO, run_once, tiny_config

BATCH = 16


def _teacher(*overrides):
    """A tiny teacher with random weights (its zero-initialised head made non-zero): any fixed denoiser can be
    distilled, and a random one gives targets that differ from step to step."""
    config = tiny_config(*overrides)
    model = DiffusionModel(config.model)
    variables = jax.device_get(run_once(lambda key: init_variables(model, key), jax.random.key(1)))
    leaves, tree = jax.tree.flatten(variables["params"])
    keys = jax.random.split(jax.random.key(2), len(leaves))
    params = jax.tree.unflatten(tree, [leaf + 0.2 * jax.random.normal(key, leaf.shape) for key, leaf in zip(keys, leaves)])
    return config, model, {"params": params, "batch_stats": variables["batch_stats"]}


def _batches(seed=0, conditional=False):
    rng = np.random.default_rng(seed)
    while True:
        # Smooth colour fields: something image-like for the normaliser and the noise to act on.
        base = rng.uniform(0, 255, (BATCH, 4, 4, 3))
        images = np.repeat(np.repeat(base, 4, axis=1), 4, axis=2).astype(np.uint8)
        labels = rng.integers(0, 4, BATCH).astype(np.int32) if conditional else np.zeros(BATCH, np.int32)
        yield {"image": images, "label": labels}


def _distil(teacher_model, teacher_variables, config, phase, steps, conditional=False):
    student = DiffusionModel(plan_lib.student_model(teacher_model.config, config, phase))
    state = create_student_state(student, teacher_variables, config, phase, jax.random.key(3))
    settings = StepSettings.of(student, teacher_model, config, phase)
    step = jax.jit(lambda s, b, r: distill_step(s, teacher_variables, b, r, settings))
    batches = _batches(conditional=conditional)
    for _ in range(steps):
        state, _ = step(state, next(batches), jax.random.key(4))
    return student, {"params": state.ema_params, "batch_stats": state.ema_batch_stats}


def _sample(model, variables, steps, cond=None, count=32):
    return np.asarray(process.generate(model, variables, jax.random.key(7), count, SamplingSpec(steps=steps), cond=cond))


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


@pytest.mark.parametrize("overrides,message", [
    (("distill.start_steps=12", "distill.end_steps=4"), "not reachable by halving distill.start_steps \\(12\\); "
                                                        "reachable: 6, 3"),
    (("distill.start_steps=8", "distill.end_steps=8"), "not reachable by halving"),
    (("distill.prediction=noise",), "distill.prediction must be one of"),
    (("distill.guidance_min=3", "distill.guidance_max=2"), "guidance_min <= distill.guidance_max"),
])
def test_bad_distillation_settings_are_one_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(*overrides)


def test_a_distilled_student_is_no_teacher():
    student = dataclasses.replace(tiny_config().model, distilled_steps=4)
    with pytest.raises(ConfigError, match="is a distilled student \\(4 steps\\), not a diffusion model"):
        plan_lib.check_teacher(student, "the teacher x")


# --- the step on a tiny network ------------------------------------------------------------------------------------


def test_student_starts_as_its_teacher_with_a_zero_guidance_embedding():
    config, model, variables = _teacher("model.class_conditional=true", "model.num_classes=4",
                                        "model.embedding_injection=every-block", "model.class_embedding=adm")
    phase = plan_lib.plan(config.model, config)[0]
    student = DiffusionModel(plan_lib.student_model(config.model, config, phase))
    merged = student_variables(student, variables, jax.random.key(0))
    kernel = merged["params"]["network"]["guidance"]["project"]["kernel"]
    assert not np.any(kernel)
    np.testing.assert_array_equal(merged["params"]["network"]["stem"]["kernel"],
                                  variables["params"]["network"]["stem"]["kernel"])


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


@pytest.fixture(scope="module")
def distilled(conditional_workdir, tmp_path_factory):
    """The tiny class-conditional model distilled from 4 steps to 1 (stage one, then two rounds)."""
    from ddim.distill import distill

    out = tmp_path_factory.mktemp("distilled")
    result = distill(conditional_workdir, out, overrides=[
        "distill.start_steps=4", "distill.end_steps=1", "distill.first_stage_steps=3", "distill.round_steps=2",
        "distill.batch_size=4", "train.eval_every=0", "train.checkpoint_every=2", "train.log_every=1"],
        log=lambda message: None)
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


def test_distill_again_has_nothing_to_do_and_a_changed_setting_is_refused(distilled, conditional_workdir):
    from ddim.distill import distill
    from ddim.train import TrainingError

    out, _ = distilled
    settings = ["distill.start_steps=4", "distill.end_steps=1", "distill.first_stage_steps=3",
                "distill.round_steps=2", "distill.batch_size=4", "train.eval_every=0", "train.checkpoint_every=2",
                "train.log_every=1"]
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
    for args, message in cases:
        result = _ddim(*args, cwd=REPO)
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert lines[-1].startswith("error:") and message in lines[-1], result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_stopped_distillation_resumes_to_the_same_students(conditional_workdir, tmp_path, monkeypatch):
    import os
    import signal

    from ddim.checkpoint import Checkpointer
    from ddim.distill import distill, loop

    settings = ["distill.start_steps=2", "distill.end_steps=1", "distill.first_stage_steps=3",
                "distill.round_steps=3", "distill.batch_size=4", "train.eval_every=0", "train.checkpoint_every=100"]
    distill(conditional_workdir, tmp_path / "straight", overrides=settings, log=lambda m: None)
    real, calls = loop.compiled_step, {"n": 0}

    def stopping(settings_, mesh):
        step = real(settings_, mesh)

        def wrapped(*args):
            calls["n"] += 1
            if calls["n"] == 4:  # the first step of the round: stage one's student is out, the round is not
                os.kill(os.getpid(), signal.SIGTERM)
            return step(*args)

        return wrapped

    monkeypatch.setattr(loop, "compiled_step", stopping)
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


def test_the_distillation_benchmark_scores_students_beside_their_teacher_once(distilled, conditional_workdir, tmp_path,
                                                                              capsys):
    from tests.test_bench import load_benchmark
    from tests.test_evaluation import tiny_extractor

    bench = load_benchmark("distill")
    out, _ = distilled
    args = ["--students", str(out), "--teacher", str(conditional_workdir), "--out", str(tmp_path), "--num", "4",
            "--guidance", "1", "2", "--student-steps", "2"]
    rows = bench.main(args, feature_extractor_factory=tiny_extractor)
    students = [row for row in rows if row["model"] == "student"]
    assert {(row["steps"], row["guidance"], row["passes"]) for row in students} == {(2, 1.0, 2), (2, 2.0, 2)}
    teacher = {(row["passes"], row["steps"], row["sampler"], row["guidance"]) for row in rows
               if row["model"] == "teacher"}
    assert teacher == {(2, 2, "ddim", 1.0), (2, 1, "ddim", 1.5), (2, 2, "dpmpp-2m", 1.0), (2, 1, "dpmpp-2m", 1.5),
                       (20, 20, "ddim", None)}  # at the student's passes, then the teacher's own defaults
    assert "| student | 2 | 2 | ddim/uniform |" in capsys.readouterr().out
    again = bench.main(args, feature_extractor_factory=tiny_extractor)  # nothing left to score
    assert len(again) == len(rows)
    assert len((tmp_path / "distill.jsonl").read_text().splitlines()) == len(rows)


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
    from ddim.pretrained.record import describe

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
