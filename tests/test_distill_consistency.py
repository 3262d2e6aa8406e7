"""``ddim distill --method consistency`` end to end on the tiny class-conditional model: one student that samples
in 1, 2 and 4 steps, its checkpoint, one-line errors, a stopped run's resume and the distillation benchmark."""

import jax
import numpy as np
import pytest

from ddim.sampling import process
from ddim.spec import SamplingSpec, SpecError
from tests.distill_helpers import each_one_error_line, stop_at_call


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
        (["sample", "--workdir", student, "--eta", "0.5", "--out", tmp_path / "e"],
         "--sampler consistency takes no --eta: it draws fresh noise at every step itself; leave out --eta"),
    ]
    each_one_error_line(cases)
    assert not (tmp_path / "b").exists()  # refused before anything is written


@pytest.mark.slow
def test_a_stopped_consistency_distillation_resumes_to_the_same_student(conditional_workdir, tmp_path, monkeypatch):
    from ddim.checkpoint import load_ema
    from ddim.distill import distill

    settings = [*CONSISTENCY[:3], "distill.consistency_steps=5", "distill.batch_size=4", "train.eval_every=0",
                "train.checkpoint_every=100"]
    distill(conditional_workdir, tmp_path / "straight", overrides=settings, log=lambda m: None)
    stop_at_call(monkeypatch, 3)
    stopped = distill(conditional_workdir, tmp_path / "resumed", overrides=settings, log=lambda m: None)
    assert stopped.interrupted and stopped.final_step == 3 and not stopped.students
    monkeypatch.undo()
    resumed = distill(conditional_workdir, tmp_path / "resumed", overrides=settings, log=lambda m: None)
    assert (resumed.start_step, resumed.final_step, sorted(resumed.students)) == (3, 5, [1, 2, 4])

    def final(root):
        return load_ema(root / "students" / "consistency").variables["params"]

    jax.tree.map(np.testing.assert_array_equal, final(tmp_path / "straight"), final(tmp_path / "resumed"))


@pytest.mark.slow  # a learning run of tens of seconds; `pytest -m slow` runs it
def test_the_distillation_benchmark_scores_a_consistency_student_and_clipped_sampling(consistency_student,
                                                                                     conditional_workdir, tmp_path,
                                                                                     capsys):
    from benchmarks.studies import distill
    from tests.tiny_fid import tiny_extractor

    out, _, _ = consistency_student
    args = ["--students", str(out), "--teacher", str(conditional_workdir), "--out", str(tmp_path), "--num", "4",
            "--guidance", "1.5", "--student-steps", "1", "--teacher-path", "--teacher-num", "4", "--clip"]
    rows = distill.main(args, feature_extractor_factory=tiny_extractor)
    students = {(row["steps"], row["sampler"], row["clip"]) for row in rows if row["model"] == "student"}
    assert students == {(1, "consistency", False), (1, "consistency", True)}
    printed = capsys.readouterr().out
    assert "| student | 1 | 1 | consistency/uniform clipped |" in printed
    assert "- consistency: 3 optimiser steps" in printed
