"""``ddim distill`` (progressive) end to end on the tiny class-conditional model: a student per round that loads
and samples on its own grid, a second run, one-line errors, a stopped run's resume, the distillation benchmark,
the web page and a bundled student."""

import json

import jax
import numpy as np
import pytest

from ddim.spec import SamplingSpec, SpecError
from tests.distill_helpers import each_one_error_line, stop_at_call


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
    # Its DDIM steps take eta (fresh noise each step); its sampler and grid are fixed.
    stochastic = pipe.generate(3, seed=0, classes="daisy", guidance=2.0, eta=0.5)
    assert stochastic.shape == images.shape and not np.array_equal(stochastic, images)
    assert np.array_equal(stochastic, pipe.generate(3, seed=0, classes="daisy", guidance=2.0, eta=0.5))
    for other in ({"sampler": "dpmpp-2m"}, {"spacing": "logsnr"}):
        with pytest.raises(SpecError, match="distilled for DDIM steps on the uniform grid only"):
            pipe.generate(3, **other)
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


def test_a_progressive_student_is_halved_further(distilled, tmp_path):
    import ddim
    from ddim.distill import distill

    out, _ = distilled
    further = [item for item in PROGRESSIVE if not item.startswith("distill.start_steps=")]
    result = distill(out / "students" / "2", tmp_path / "further", overrides=[*further, "distill.start_steps=2"],
                     log=lambda message: None)
    assert (result.start_step, result.final_step, sorted(result.students)) == (0, 2, [1])  # one round, no stage one
    records = [json.loads(line) for line in (tmp_path / "further" / "distill.jsonl").read_text().splitlines()]
    assert [record.get("phase") for record in records[1:]] == ["round"]
    student = ddim.load(tmp_path / "further" / "students" / "1")
    original = ddim.load(out / "students" / "1").config.model.distilled_from
    assert student.config.model.distilled_steps == 1 and student.config.model.distilled_from == original
    assert student.config.name == ddim.load(out / "students" / "2").config.name  # no second "-distilled"
    assert student.generate(2, seed=0, classes="daisy", guidance=2.0).shape == (2, 16, 16, 3)


def test_distill_command_errors_are_one_line(distilled, conditional_workdir, tmp_path):
    out, _ = distilled
    cases = [
        (["distill", "--workdir", conditional_workdir, "--out", tmp_path / "a", "--set", "distill.start_steps=6",
          "--set", "distill.end_steps=4"], "not reachable by halving"),
        (["distill", "--workdir", out / "students" / "2", "--out", tmp_path / "b"],
         "is a progressive student of 2 steps, and its rounds go on from there: set distill.start_steps=2"),
        (["distill", "--out", tmp_path / "c"], "name one teacher"),
        (["sample", "--workdir", out / "students" / "1", "--steps", "2", "--out", tmp_path / "d"],
         "distilled for --steps 1 only"),
        (["sample", "--workdir", out / "students" / "1", "--spacing", "karras", "--out", tmp_path / "e"],
         "leave out --sampler and --spacing"),
    ]
    each_one_error_line(cases)


@pytest.mark.slow
def test_a_stopped_distillation_resumes_to_the_same_students(conditional_workdir, tmp_path, monkeypatch):
    from ddim.checkpoint import Checkpointer
    from ddim.distill import distill

    settings = ["distill.start_steps=2", "distill.end_steps=1", "distill.first_stage_steps=3",
                "distill.round_steps=3", "distill.batch_size=4", "train.eval_every=0", "train.checkpoint_every=100"]
    distill(conditional_workdir, tmp_path / "straight", overrides=settings, log=lambda m: None)
    stop_at_call(monkeypatch, 4)  # the first step of the round: stage one's student is out, the round is not
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
    from tests.tiny_fid import tiny_extractor

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
    assert blocks["sample-eta"].visible and not blocks["sample-sampler"].interactive


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
    assert "samples with 2 DDIM steps of one network pass each" in lines
    monkeypatch.setenv("DDIM_PRETRAINED_DIR", str(tmp_path))
    pipe = ddim.load("pretrained:tiny-2step")
    assert pipe.defaults == SamplingSpec(steps=2) and pipe.generate(2, seed=0).shape == (2, 16, 16, 3)
    with pytest.raises(SpecError, match="distilled for 2 steps"):
        pipe.generate(2, steps=20)
