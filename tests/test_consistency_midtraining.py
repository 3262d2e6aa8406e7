"""Consistency mid-training (ddim/distill/bank.py, the "midtraining" phase): the plan, the loss against a hand
computation, the banked trajectories against the teacher's guided DDIM samples, the bank's storage and draws, a run
end to end, a stopped run's resume, and bad settings."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim.distill import bank as bank_lib
from ddim.distill import plan as plan_lib
from ddim.distill import targets_consistency as consistency
from ddim.sampling import process
from ddim.spec import SamplingSpec
from tests.conftest import tiny_config
from tests.distill_helpers import distil_recording_starts, each_one_error_line, stop_at_call, tiny_teacher


def test_midtraining_is_a_phase_before_consistency_distillation_and_the_steps_count_on():
    teacher = tiny_config("model.class_conditional=true").model
    plain = tiny_config("distill.method=consistency", "distill.start_steps=16", "distill.consistency_steps=9")
    assert [(p.kind, p.start, p.end) for p in plan_lib.plan(teacher, plain)] == [("consistency", 0, 9)]
    config = tiny_config("distill.method=consistency", "distill.start_steps=16", "distill.consistency_steps=9",
                         "distill.consistency_midtraining_steps=5")
    middle, final = plan_lib.plan(teacher, config)
    assert [(p.kind, p.start, p.end, p.grid_steps, p.student_name) for p in (middle, final)] == [
        ("midtraining", 0, 5, 16, "midtraining"), ("consistency", 5, 14, 16, "consistency")]
    assert not middle.delivers_student and final.delivers_student
    assert middle.describe() == "consistency mid-training on the teacher's 16-step trajectories"
    # The same student network and sampling: the consistency phase starts from the mid-trained weights.
    assert plan_lib.student_model(teacher, config, middle) == plan_lib.student_model(teacher, config, final)


def test_the_midtraining_loss_is_the_mean_squared_distance_to_the_trajectories_ends():
    predicted = jnp.array([[[[1.0, 2.0]]], [[[0.0, -1.0]]]])  # two "images" of two numbers
    ends = jnp.array([[[[1.0, 0.0]]], [[[3.0, 3.0]]]])
    np.testing.assert_allclose(float(consistency.midtraining_loss(predicted, ends)), (0 + 4 + 9 + 16) / 4, rtol=1e-6)


CONDITIONAL = ("model.class_conditional=true", "model.num_classes=4")


def _settings(**changes):
    settings = bank_lib.BankSettings("teacher", 2, size=6, grid_steps=3, batch_size=4, seed=0,
                                     guidance=(0.0, 4.0, 1.0, 2.0), label_dropout=0.25, image_shape=(16, 16, 3))
    return dataclasses.replace(settings, **changes)


@pytest.fixture(scope="module")
def solved():
    """A tiny class-conditional teacher's bank of 6 trajectories on a 3-step grid, solved 4 at a time (a velocity
    teacher of image-sized predictions: a noise one's last step divides by a signal rate of 0.02)."""
    _, teacher, variables = tiny_teacher(*CONDITIONAL, "model.prediction=velocity", scale=0.1)
    settings = _settings()
    bank = bank_lib.solve(teacher, variables, settings, lambda indices: np.asarray(indices) % 4, num_images=10)
    return teacher, variables, settings, bank


def test_the_banked_trajectories_end_at_the_teachers_guided_ddim_samples_of_their_noise(solved):
    teacher, variables, settings, bank = solved
    assert bank.states.shape == (6, 3, 16, 16, 3) and bank.states.dtype == np.float16
    assert bank.ends.shape == (6, 16, 16, 3) and bank.ends.dtype == np.float32
    assert set(bank.labels.tolist()) <= {-1, 0, 1, 2, 3} and np.all((bank.guidance >= 0) & (bank.guidance <= 4))
    spec = SamplingSpec(steps=3)

    @jax.jit
    def sample(noise, labels, guidance):  # ddim sample's path: the teacher's guided 3-step DDIM
        return process.reverse_process(teacher, variables, noise, process.time_grid(teacher, spec), spec,
                                       cond={"label": labels, "guidance": guidance}).pred_images

    for batch, kept in enumerate((4, 2)):  # the second batch is padded with the first rows: two are kept
        rows = np.arange(4 * batch, 4 * batch + 4) % 6
        noise = jax.random.normal(bank_lib.noise_key(settings, batch), (4, 16, 16, 3), jnp.float32)
        np.testing.assert_array_equal(bank.states[rows[:kept], -1], np.asarray(noise, np.float16)[:kept])  # t = 1
        expected = np.asarray(sample(noise, bank.labels[rows], bank.guidance[rows]))
        np.testing.assert_allclose(bank.ends[rows[:kept]], expected[:kept], rtol=1e-4, atol=1e-4)
    assert float(np.mean(np.abs(bank.states[:, 0].astype(np.float32) - bank.ends))) > 0.01  # t = 1/3 is no end


def test_a_stored_bank_is_read_only_with_the_same_settings_and_never_half_written(solved, tmp_path, monkeypatch):
    _, _, settings, bank = solved
    path = tmp_path / "trajectories.npz"
    assert bank_lib.load(path, settings) == (None, "")
    bank_lib.save(path, bank, settings)
    read, why = bank_lib.load(path, settings)
    assert why == "" and all(np.array_equal(a, b) for a, b in zip(read, bank))
    assert bank_lib.load(path, _settings(size=8)) == (None, "was made with other settings")
    assert bank_lib.load(path, _settings(teacher="another")) == (None, "was made with other settings")
    assert json.loads(str(np.load(path)["settings"]))["grid_steps"] == 3

    def failing(file, **arrays):
        file.write(b"PK half a bank")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", failing)
    with pytest.raises(OSError, match="disk full"):
        bank_lib.save(tmp_path / "other.npz", bank, settings)
    assert not (tmp_path / "other.npz").exists()  # only the temporary file holds the half
    path.write_bytes(b"PK truncated")
    assert bank_lib.load(path, settings)[1].startswith("cannot be read")


def test_a_bank_stopped_while_solved_keeps_its_parts_and_solves_only_the_rest(solved, tmp_path, monkeypatch):
    teacher, variables, settings, bank = solved
    big = _settings(size=10)  # three batches of 4, the last padded
    whole = bank_lib.solve(teacher, variables, big, lambda indices: np.asarray(indices) % 4, num_images=10)
    parts, path = tmp_path / "trajectories.parts", tmp_path / "trajectories.npz"
    monkeypatch.setattr(bank_lib, "PART_SECONDS", 0.0)  # a part after every batch
    calls = []

    def stop_after_two(done, seconds):
        calls.append(done)
        if len(calls) == 3:  # the rows read (none), then two batches
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bank_lib.solve(teacher, variables, big, lambda indices: np.asarray(indices) % 4, 10, parts,
                       on_batch=stop_after_two)
    assert calls == [0, 4, 8]
    assert sorted(p.name for p in parts.iterdir()) == ["part-0000000-0000004.npz", "part-0000004-0000008.npz",
                                                       "settings.json"]
    solved_batches = []
    real_solver = bank_lib.trajectory_solver(teacher, big.grid_steps)
    monkeypatch.setattr(bank_lib, "trajectory_solver", lambda *args: lambda *batch: (
        solved_batches.append(batch[2].shape[0]), real_solver(*batch))[1])
    progress = []
    resumed = bank_lib.solve(teacher, variables, big, lambda indices: np.asarray(indices) % 4, 10, parts,
                             on_batch=lambda done, seconds: progress.append((done, seconds)))
    assert solved_batches == [4] and [done for done, _ in progress] == [8, 10]  # only the last batch solved again
    assert progress[0][1] > 0 and progress[1][1] >= progress[0][1]  # the earlier parts' seconds count on
    assert all(np.array_equal(a, b) for a, b in zip(resumed, whole))
    bank_lib.save(path, resumed, big, parts)
    assert not parts.exists() and bank_lib.load(path, big)[1] == ""
    # Parts of other settings are not read, and the first part written replaces them.
    bank_lib.write_part(parts, settings, 0, 4, bank.states, bank.ends, 1.0)
    assert bank_lib.read_parts(parts, big, np.empty_like(whole.states), np.empty_like(whole.ends)) == (0, 0.0)
    bank_lib.write_part(parts, big, 0, 4, whole.states, whole.ends, 1.0)
    assert (parts / "settings.json").read_text() == big.to_json()


def test_banking_says_a_line_at_every_tenth_with_the_time_left():
    from ddim.distill.loop import BankingProgress

    lines = []
    progress = BankingProgress(100, lines.append)
    progress(40, 600.0)  # rows read from parts: said once, and not counted in the estimate
    for done in range(44, 101, 4):
        progress(done, 600.0 + (done - 40) * 30.0)
    assert lines[0] == "banking resumed: 40 of 100 trajectories were solved before"
    assert lines[1:] == ["banked 52 of 100 trajectories in 16 min, about 24 min left",
                         "banked 60 of 100 trajectories in 20 min, about 20 min left",
                         "banked 72 of 100 trajectories in 26 min, about 14 min left",
                         "banked 80 of 100 trajectories in 30 min, about 10 min left",
                         "banked 92 of 100 trajectories in 36 min, about 4 min left"]  # the whole: its own line
    assert progress.seconds == 2400.0


def test_each_steps_batch_is_drawn_from_the_seed_and_the_step(solved):
    _, _, _, bank = solved
    from_zero = bank_lib.batches(bank, 0, 5, 0)
    first, second, third = next(from_zero), next(from_zero), next(from_zero)
    resumed = next(bank_lib.batches(bank, 0, 5, 2))
    assert all(np.array_equal(third[key], resumed[key]) for key in third)
    assert not all(np.array_equal(first[key], second[key]) for key in first)
    assert first["state"].shape == (5, 16, 16, 3) and first["state"].dtype == np.float32
    assert set(first) == {"state", "index", "end", "label", "guidance"}
    assert np.all((first["index"] >= 1) & (first["index"] <= 3))
    for i, n in enumerate(first["index"]):  # a banked point, with its trajectory's end, class and scale
        (k,) = [k for k in range(6) if np.array_equal(first["end"][i], bank.ends[k])]
        np.testing.assert_array_equal(first["state"][i], bank.states[k, n - 1].astype(np.float32))
        assert (first["label"][i], first["guidance"][i]) == (bank.labels[k], bank.guidance[k])


MIDTRAINING = ["distill.method=consistency", "distill.start_steps=4", "distill.student_steps=[1, 2, 4]",
               "distill.consistency_midtraining_steps=3", "distill.consistency_bank_size=6",
               "distill.consistency_steps=2", "distill.batch_size=4", "train.eval_every=0",
               "train.checkpoint_every=100"]


@pytest.fixture(scope="module")
def midtrained(conditional_workdir, tmp_path_factory):
    """The tiny class-conditional model distilled with 3 steps of mid-training, then 2 of consistency distillation;
    the weights each phase started from."""
    out = tmp_path_factory.mktemp("midtrained")
    result, lines, starts = distil_recording_starts(conditional_workdir, out, MIDTRAINING)
    return out, result, lines, starts


def test_consistency_distillation_starts_from_the_mid_trained_student_and_writes_the_one_student(midtrained):
    from ddim.checkpoint import load_ema

    out, result, lines, starts = midtrained
    assert (result.final_step, result.students) == (5, {n: out / "students" / "consistency" for n in (1, 2, 4)})
    student = load_ema(out / "students" / "midtraining")
    assert (student.step, student.config.model.distilled_sampler) == (3, "consistency")
    jax.tree.map(np.testing.assert_array_equal, starts["consistency"], student.variables["params"])
    assert any(line.startswith("banked 6 trajectories in") for line in lines)
    records = [json.loads(line) for line in (out / "distill.jsonl").read_text().splitlines()[1:]]
    assert [(r["phase"], r["from_step"], r["to_step"], r.get("banked_trajectories")) for r in records] == [
        ("midtraining", 0, 0, 6), ("midtraining", 0, 3, None), ("consistency", 3, 5, None)]
    with np.load(out / "trajectories.npz") as stored:
        assert stored["states"].shape == (6, 4, 16, 16, 3) and stored["ends"].shape == (6, 16, 16, 3)
    assert not (out / "trajectories.parts").exists()  # written while solving, gone with the whole bank


def test_a_run_stopped_in_and_at_the_end_of_midtraining_resumes_to_the_same_student(midtrained, conditional_workdir,
                                                                                    tmp_path, monkeypatch):
    from ddim.checkpoint import load_ema
    from ddim.distill import distill

    lines = []
    stop_at_call(monkeypatch, 2)
    stopped = distill(conditional_workdir, tmp_path, overrides=MIDTRAINING, log=lines.append)
    assert stopped.interrupted and stopped.final_step == 2 and not stopped.students
    monkeypatch.undo()
    stop_at_call(monkeypatch, 1)  # the next step is mid-training's last: stopped before its student is written
    stopped = distill(conditional_workdir, tmp_path, overrides=MIDTRAINING, log=lines.append)
    assert stopped.interrupted and stopped.final_step == 3
    assert any(line.startswith("read 6 banked trajectories") for line in lines)
    monkeypatch.undo()
    resumed = distill(conditional_workdir, tmp_path, overrides=MIDTRAINING, log=lines.append)
    assert (resumed.start_step, resumed.final_step, sorted(resumed.students)) == (3, 5, [1, 2, 4])
    # Solved once, read on the resume in mid-training.
    assert sum(line.startswith("banked 6 trajectories") for line in lines) == 1

    def final(root):
        return load_ema(root / "students" / "consistency").variables["params"]

    jax.tree.map(np.testing.assert_array_equal, final(midtrained[0]), final(tmp_path))


def test_bad_midtraining_settings_are_one_error_line_before_anything_is_written(conditional_workdir, tmp_path):
    teacher = ["distill", "--workdir", conditional_workdir]
    cases = [
        ([*teacher, "--out", tmp_path / "a", "--method", "consistency", "--set",
          "distill.consistency_midtraining_steps=-1"], "distill.consistency_midtraining_steps must be >= 0, got -1"),
        ([*teacher, "--out", tmp_path / "b", "--method", "consistency", "--set",
          "distill.consistency_midtraining_steps=5", "--set", "distill.consistency_bank_size=8", "--set",
          "distill.batch_size=16"], "distill.consistency_bank_size (8) must be at least distill.batch_size (16)"),
        ([*teacher, "--out", tmp_path / "c", "--method", "progressive", "--set",
          "distill.consistency_midtraining_steps=5"],
         "distill.consistency_midtraining_steps is for distill.method \"consistency\""),
    ]
    each_one_error_line(cases)
    assert not any((tmp_path / name).exists() for name in "abc")


def test_the_ablation_measures_a_mid_training_step_and_a_banked_trajectory(conditional_workdir, tmp_path):
    """The cmt variant's costs, measured on the tiny model as the ablation measures them on flowers32."""
    from benchmarks.studies import consistency_ablation as ablation

    config = tmp_path / "tiny.toml"
    config.write_text("[distill]\nmethod = \"consistency\"\nstart_steps = 4\nstudent_steps = [1, 2, 4]\n"
                      "batch_size = 4\n")
    teacher = str(conditional_workdir)
    midtraining = ablation.step_cost(teacher, str(config), ["distill.consistency_midtraining_steps=1"], repeats=1,
                                     steps=1)
    trajectory = ablation.bank_cost(teacher, str(config), repeats=1)
    assert midtraining > 0 and trajectory > 0
