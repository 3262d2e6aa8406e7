"""benchmarks.release.rebuild: a bundled model rebuilt from its recipe, stage by stage, resumed and skipped.

The smoke rebuild runs the flowers64 recipe's whole chain on a tiny model (TFDS mock data exported to a folder,
a few training and distillation steps, a few samples scored by the tiny random network in place of the FID
Inception: each command a child process of tests/rebuild_worker.py); the other tests use recipes written here, of
cheap commands.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest

from benchmarks.release import device, recipe_files, rebuild, stage_commands
from benchmarks.release.bundle_steps import defaults_options, run_seconds, sweep_words
from benchmarks.release.recipe_files import PLACEHOLDER, RebuildError, expand, load_recipe, recipe_names
from ddim.pretrained.bundle_record import setting_of, setting_values
from tests.conftest import REPO
from tests.docs_helpers import parse_command


@pytest.fixture
def mock_commands(monkeypatch):
    """Every command of a rebuild run by tests/rebuild_worker.py: on TFDS mock data, with the tiny random network
    in place of ``ddim eval``'s standard FID network (no weights needed)."""
    monkeypatch.setattr(stage_commands, "python_module",
                        lambda module, args: [sys.executable, "-m", "tests.rebuild_worker", module, *args])


def one_error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, text
    return lines[0]


def test_the_smoke_rebuild_runs_the_whole_chain_then_skips_every_stage(tmp_path, mock_commands, capsys,
                                                                       monkeypatch):
    monkeypatch.delenv("DDIM_PRETRAINED_DIR", raising=False)
    out = tmp_path / "rebuild"
    assert rebuild.main(["flowers64", "--out", str(out), "--smoke"]) == 0
    first = capsys.readouterr().out
    stages = [stage.name for stage in load_recipe("flowers64").stages]
    for stage in stages:
        marker = json.loads((out / "stages" / f"{stage}.json").read_text())
        assert marker["complete"] and marker["device"] == "cpu" and marker["seconds"] >= 0
        assert f"stage {stage}: done in " in first
    from ddim.pretrained import find

    teacher, student = find("flowers64", out / "bundles"), find("flowers64-2step", out / "bundles")
    assert teacher.config.model.prediction == "velocity" and teacher.weights_dtype == "float16"
    assert student.config.model.distilled_steps == 2
    for manifest, stage in ((teacher, "defaults"), (student, "student-defaults")):
        record = manifest.record
        chosen = json.loads((out / "stages" / f"{stage}.json").read_text())["result"]
        assert record["defaults"] == chosen and record["recipe"] == "python -m benchmarks.release.rebuild flowers64 --smoke"
        # The defaults are the setting of lowest FID among the sweep's lines.
        sweep = [score for score in record["scores"] if score["num"] == 6]
        best = min(sweep, key=lambda score: score["fid"])
        assert {key: best[key] for key in chosen} == chosen and record["guidance"].startswith(f"{best['guidance']:g},")
        assert all(score["fid"] is not None and score["class_accuracy"] is not None for score in record["scores"])
        assert record["hardware"].startswith("a ") and "CPU" in record["hardware"] and record["wall_time"]
        lines = (out / "results" / Path(record["scores"][0]["source"]).name).read_text().splitlines()
        assert len(lines) >= len(record["scores"])
        assert {json.loads(line)["checkpoint"] for line in lines} == {f"pretrained:{manifest.name}"}
    assert len([score for score in teacher.record["scores"] if score["num"] == 6]) >= 2

    assert rebuild.main(["flowers64", "--out", str(out), "--smoke"]) == 0
    second = capsys.readouterr().out
    assert [line.split(":")[0] for line in second.splitlines() if "done earlier, skipped" in line] == \
        [f"stage {stage}" for stage in stages]
    assert "flowers64: 0 stage(s) run" in second and "done in" not in second


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in recipe_names() if name != "flowers64"])
def test_the_smoke_of_every_other_recipe_runs_its_chain(name, tmp_path, mock_commands, monkeypatch):
    """flowers32-noise's chain as flowers64's without the student; flowers32's fine-tunes the bundled flowers32-noise;
    flowers32-4step's distils it; flowers32-consistency's distils flowers32 into one student for 1, 2 and 4 steps and times it;
    flowers64-velocity's fine-tunes the bundled flowers64 into a bundle of the same name; flowers64-consistency's
    distils the bundled flowers64 as flowers32-consistency's does flowers32, and times the student."""
    monkeypatch.delenv("DDIM_PRETRAINED_DIR", raising=False)
    assert rebuild.main([name, "--out", str(tmp_path), "--smoke"]) == 0
    from ddim.pretrained import find

    [bundle] = [stage.record["model"] for stage in load_recipe(name).stages if stage.kind == "record"]
    manifest = find(bundle, tmp_path / "bundles")
    assert manifest.record["defaults"] and manifest.record["scores"] and manifest.weights_dtype == "float16"
    if name.endswith("-consistency"):  # defaults chosen among the 2-step settings, and the words name only those
        assert manifest.record["defaults"]["steps"] == 2 and manifest.config.model.prediction == "velocity"
        assert "the lowest FID of 4 settings" in manifest.record["guidance"]
        assert {score["steps"] for score in manifest.record["scores"]} == {1, 2, 4}
    if name in ("flowers32", "flowers32-consistency", "flowers64-consistency"):  # these time `ddim sample` with the bundle made, into the record
        timing = manifest.record["sample_time"]
        assert timing["command"] == f"ddim sample --pretrained {bundle} --num 16 --out DIR"
        assert len(timing["wall_seconds"]) == 2 and timing["source"] == "docs/results/cli-timing.jsonl"


def write_recipe(root: Path, name: str, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{name}.toml").write_text(text)
    return root


CHEAP = '''
name = "cheap"
about = "two stages of cheap commands"

[settings]
config = "smoke"
bad = "/nowhere/missing.toml"

[smoke]
bad = "smoke"

[[stage]]
name = "first"
about = "one command"
run = "ddim pretrained list --json"

[[stage]]
name = "second"
about = "a command that passes, then one that fails without --smoke"
run = ["ddim pretrained list --json", "ddim train --config {bad} --workdir {out}/run --set train.max_steps=0"]
smoke_run = ["ddim pretrained list --json"]
'''


def test_a_failed_stage_is_one_error_line_and_resumes_at_its_first_command_not_done(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(recipe_files, "RECIPES", write_recipe(tmp_path / "recipes", "cheap", CHEAP))
    monkeypatch.setenv("DDIM_PRETRAINED_DIR", str(tmp_path / "no-bundles"))
    out = tmp_path / "out"
    assert rebuild.main(["cheap", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert "missing.toml" in one_error_line(captured.err)  # the stage's own line, and no second one
    assert "stage second failed (exit 1)" in captured.err and "the same rebuild command resumes it" in captured.err
    marker = json.loads((out / "stages" / "second.json").read_text())
    assert not marker["complete"] and [c["command"] for c in marker["commands"]] == ["ddim pretrained list --json"]
    assert json.loads((out / "stages" / "first.json").read_text())["complete"]

    assert rebuild.main(["cheap", "--out", str(out)]) == 1  # again: the first stage and command are not repeated
    captured = capsys.readouterr()
    assert "stage first: done earlier, skipped" in captured.out
    assert "[1/2] done earlier: ddim pretrained list --json" in captured.out
    assert "missing.toml" in one_error_line(captured.err)


@pytest.mark.parametrize("args, message", [
    (["flowers65", "--out", "{tmp}/out"], "no recipe for 'flowers65' (recipes: cheap)"),
    (["cheap", "--out", "{tmp}/file/out"], "cannot write to --out"),
    (["cheap", "--out", "{tmp}/out", "--until", "third"], "recipe cheap has no stage 'third'"),
    (["cheap", "--out", "{tmp}/out", "--set", "dtype=bfloat16"], "--set dtype: recipe cheap has no such setting"),
    (["cheap", "--out", "{tmp}/out", "--set", "dtype"], "is not of the form KEY=VALUE"),
])
def test_bad_input_is_one_error_line(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(recipe_files, "RECIPES", write_recipe(tmp_path / "recipes", "cheap", CHEAP))
    (tmp_path / "file").write_text("a file, not a directory")
    assert rebuild.main([arg.format(tmp=tmp_path) for arg in args]) == 1
    assert message in one_error_line(capsys.readouterr().err)


def test_an_out_directory_keeps_one_rebuild_and_until_stops_after_a_stage(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(recipe_files, "RECIPES", write_recipe(tmp_path / "recipes", "cheap", CHEAP))
    monkeypatch.setenv("DDIM_PRETRAINED_DIR", str(tmp_path / "no-bundles"))
    out = tmp_path / "out"
    assert rebuild.main(["cheap", "--out", str(out), "--smoke", "--until", "first"]) == 0
    assert not (out / "stages" / "second.json").exists()
    assert rebuild.main(["cheap", "--out", str(out), "--smoke"]) == 0  # the smoke's second stage passes
    assert json.loads((out / "stages" / "second.json").read_text())["complete"]
    capsys.readouterr()
    assert rebuild.main(["cheap", "--out", str(out)]) == 1  # not a smoke: another rebuild
    assert "holds a rebuild of cheap (smoke, settings {}), not this one" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("text, message", [
    (CHEAP.replace("ddim train", "rm -rf"), "a command is `ddim ...` or `python -m benchmarks.KIND.NAME ...`"),
    (CHEAP.replace("ddim train", "python benchmarks/speed/bench.py"), "a command is `ddim ...` or `python -m"),
    (CHEAP.replace("ddim train", "python -m benchmarks.speed.nothing"), "no module benchmarks.speed.nothing"),
    (CHEAP.replace("{bad}", "{worse}"), "{worse} is no setting"),
    (CHEAP.replace('name = "second"', 'name = "first"'), "needs stages of distinct names"),
    (CHEAP + '\n[[stage]]\nname = "third"\n', "stage 'third' needs one of run, choose, record"),
    (CHEAP.replace('bad = "smoke"', 'worse = "smoke"'), "[smoke] sets worse, which [settings] lacks"),
])
def test_a_bad_recipe_is_refused_before_anything_runs(text, message, tmp_path):
    root = write_recipe(tmp_path / "recipes", "cheap", text)
    with pytest.raises(RebuildError) as error:
        load_recipe("cheap", root)
    assert message in str(error.value)


@pytest.mark.parametrize("name", recipe_names())
@pytest.mark.parametrize("smoke", [False, True], ids=["gpu", "smoke"])
def test_every_recipe_names_its_settings_and_its_ddim_commands_parse(name, smoke, tmp_path):
    recipe = load_recipe(name)
    build = rebuild.Rebuild(recipe, tmp_path, smoke)
    values = {**build.values(), **{stage.name: "--steps 20 --sampler ddim --spacing uniform --eta 0 --guidance 2"
                                   for stage in recipe.stages if stage.kind == "choose"}}
    commands = [expand(command, values) for stage in recipe.stages for command in
                (stage.smoke_run if smoke and stage.smoke_run else stage.run)]
    assert commands and not [command for command in commands if PLACEHOLDER.search(command)]
    for command in commands:
        module, args = recipe_files.command_module(command)
        if module == "ddim.cli":
            parse_command(args)  # an unknown option or a bad value raises
        else:
            assert (REPO / (module.replace(".", "/") + ".py")).is_file(), command
    for stage in recipe.stages:
        if stage.kind == "record":
            assert stage.record["model"] and recipe.stage(stage.record["defaults"]).kind == "choose"
            assert all(recipe.stage(trained).kind == "run" for trained in stage.record["trained"])
            # The timing runs before the record gives the bundle its defaults: it is told them, or it would time
            # the plain setting and the record would call that the defaults' time.
            for command in (command for command in commands if "benchmarks.speed.cli_timing" in command):
                words = shlex.split(command)
                assert words[words.index("--sample-options") + 1] == values[stage.record["defaults"]], command


def test_the_flowers64_recipe_trains_a_velocity_model_120_epochs_in_two_stages(tmp_path):
    recipe = load_recipe("flowers64")
    values = rebuild.Rebuild(recipe, tmp_path).values()
    train = [expand(command, values) for stage in recipe.stages if stage.name.startswith("train")
             for command in stage.run]
    assert len(train) == 2 and all("model.prediction=velocity" in command for command in train)
    assert all("train.num_epochs=120" in command and "train.lr_decay_steps=61200" in command for command in train)
    assert train[0].endswith("train.max_steps=30600") and train[1].endswith("train.max_steps=61200")
    bf16 = rebuild.Rebuild(recipe, tmp_path, overrides={"dtype": "bfloat16"}).values()
    assert "model.dtype=bfloat16" in expand(recipe.stage("train-1").run[0], bf16)


def test_sweep_words_and_defaults_options():
    lines = [{"num": 1000, "steps": 20, "sampler": "ddim", "spacing": "uniform", "eta": 0.0, "guidance": g, "fid": f}
             for g, f in ((1.0, 50.0), (2.0, 39.2), (3.0, 41.2))]
    best = setting_of(lines[1])
    assert setting_values(best) == {"steps": 20, "sampler": "ddim", "spacing": "uniform", "eta": 0.0, "guidance": 2.0}
    assert sweep_words(best, lines) == (
        "2, the lowest FID of 3 settings (1,000 samples each): 20 steps of ddim (uniform grid), guidance 2, FID 39.2; "
        "against 20 steps of ddim (uniform grid), guidance 3: 41.2; 20 steps of ddim (uniform grid), guidance 1: 50.0")
    assert defaults_options(setting_values(best)) == ["--steps", "20", "--sampler", "ddim", "--spacing",
                                                              "uniform", "--eta", "0", "--guidance", "2"]


def test_a_stopped_command_keeps_its_time_in_the_stage(tmp_path, monkeypatch):
    """A long run stopped and resumed counts every stretch of it, not only the one that finished."""
    monkeypatch.setattr(recipe_files, "RECIPES", write_recipe(tmp_path / "recipes", "cheap", CHEAP))
    monkeypatch.setenv("DDIM_PRETRAINED_DIR", str(tmp_path / "no-bundles"))
    clock = iter(range(0, 10_000, 10))  # every reading of the clock 10 s after the last
    monkeypatch.setattr(rebuild.time, "perf_counter", lambda: float(next(clock)))
    out = tmp_path / "out"
    assert rebuild.main(["cheap", "--out", str(out)]) == 1
    marker = json.loads((out / "stages" / "second.json").read_text())
    assert not marker["complete"] and [c["seconds"] for c in marker["commands"]] == [10.0]
    assert marker["seconds"] == 20.0  # the passed command's 10 s and the failed one's


def test_choose_takes_the_best_setting_of_one_step_count_when_asked(tmp_path, monkeypatch):
    build = rebuild.Rebuild(load_recipe("flowers32"), tmp_path).bundle_steps
    lines = [{"num": 1000, "steps": steps, "sampler": "consistency", "spacing": "uniform", "guidance": g, "fid": fid}
             for steps, g, fid in ((4, 1.5, 30.0), (4, 2.0, 31.0), (2, 1.5, 34.0), (2, 2.0, 33.0), (1, 1.5, 45.0))]
    monkeypatch.setattr(build, "eval_lines", lambda name: lines)
    assert build.choose({"model": "m", "num": "1000"})["steps"] == 4
    assert build.choose({"model": "m", "num": "1000", "steps": "2"}) == {
        "steps": 2, "sampler": "consistency", "spacing": "uniform", "eta": 0.0, "guidance": 2.0}
    with pytest.raises(RebuildError, match="no ddim eval of m with 1000 samples of 8 steps"):
        build.choose({"model": "m", "num": "1000", "steps": "8"})
    # The record's words on the sweep name the settings chosen among, the same lines.
    assert [line["fid"] for line in build.candidates({"num": "1000", "steps": "2"}, lines)] == [34.0, 33.0]
    chosen = setting_of(build.choose({"model": "m", "num": "1000", "steps": "2"}))
    assert "of 2 settings" in sweep_words(chosen, build.candidates({"num": "1000", "steps": "2"}, lines))


def test_run_seconds_add_up_a_runs_stretches(tmp_path):
    records = tmp_path / "distill.jsonl"
    records.write_text('{"teacher": "pretrained:flowers32", "teacher_step": 3000}\n'
                       '{"phase": "consistency", "from_step": 0, "to_step": 374, "seconds": 257.5}\n'
                       '{"phase": "consistency", "from_step": 374, "to_step": 16000, "seconds": 10045.5}\n')
    assert run_seconds(records) == 10303.0
    with pytest.raises(RebuildError, match="no run records"):
        run_seconds(tmp_path / "missing.jsonl")


def child_running(monkeypatch, code: str, device_too: bool = False) -> None:
    """Every command of a rebuild run as ``python -c CODE`` instead (and the question for the device, too)."""
    real = stage_commands.python_module

    def python_module(module, args):
        asks_device = module == "benchmarks.release.device"
        return [sys.executable, "-c", code] if device_too or not asks_device else real(module, args)

    monkeypatch.setattr(stage_commands, "python_module", python_module)


def test_a_command_runs_in_a_child_with_the_stages_directory_and_environment(tmp_path, capsys, monkeypatch):
    """The child has the stage's working directory and variables (and the repository on PYTHONPATH); the rebuild's
    own stay as they were. Its stderr passes through, and an ``error:`` line in it is noted."""
    child_running(monkeypatch, "import os, sys; print('in', os.getcwd(), os.environ['STAGE_SETTING'], "
                               "os.environ['PYTHONPATH'].split(os.pathsep)[0], file=sys.stderr); "
                               "print('error: it went wrong', file=sys.stderr); sys.exit(3)")
    monkeypatch.delenv("STAGE_SETTING", raising=False)
    before = os.getcwd()
    outcome = stage_commands.run_command("ddim env", tmp_path / "stage", {"STAGE_SETTING": "on"})
    assert (outcome.code, outcome.printed_error, outcome.stop_requested) == (3, True, False)
    assert capsys.readouterr().err.splitlines() == [f"in {tmp_path / 'stage'} on {REPO}", "error: it went wrong"]
    assert os.getcwd() == before and "STAGE_SETTING" not in os.environ

    child_running(monkeypatch, "raise SystemExit('a message of its own')")  # no error line: the rebuild says one
    assert not stage_commands.run_command("ddim env", tmp_path, {}).printed_error
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(RebuildError, match="cannot work in"):
        stage_commands.run_command("ddim env", tmp_path / "taken", {})


def test_a_command_on_a_terminal_writes_to_a_terminal(tmp_path, monkeypatch):
    """With a terminal as the rebuild's stderr, the child's is a pseudo-terminal (progress bars stay bars)."""

    class Terminal:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return True

        def write(self, text):
            self.text += text

        def flush(self):
            pass

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    child_running(monkeypatch, "import sys; print(sys.stderr.isatty(), file=sys.stderr); "
                               "print('error: on a terminal', file=sys.stderr)")
    outcome = stage_commands.run_command("ddim env", tmp_path, {})
    assert outcome.code == 0 and outcome.printed_error
    assert terminal.text.splitlines() == ["True", "error: on a terminal"]  # a terminal ends lines with \r\n


def test_a_stop_of_the_rebuild_stops_its_command_and_the_rebuild(tmp_path, capsys, monkeypatch):
    """Ctrl-C (SIGINT) to the rebuild reaches the command (in a session of its own, it gets it from the rebuild
    alone), which stops with 130; the stage is marked stopped and the rebuild says how to resume it."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be set in the main thread")
    mark = tmp_path / "started"
    child_running(monkeypatch, f"import pathlib, time; pathlib.Path({str(mark)!r}).touch(); time.sleep(120)")
    monkeypatch.setattr(recipe_files, "RECIPES", write_recipe(tmp_path / "recipes", "cheap", CHEAP))

    def interrupt_once_started():
        deadline = time.monotonic() + 60
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    handler = signal.getsignal(signal.SIGINT)
    sender = threading.Thread(target=interrupt_once_started)
    sender.start()
    started = time.monotonic()
    assert rebuild.main(["cheap", "--out", str(tmp_path / "out")]) == 130
    sender.join()
    assert time.monotonic() - started < 60
    assert "stage first stopped (exit 130)" in one_error_line(capsys.readouterr().err)
    assert not json.loads((tmp_path / "out" / "stages" / "first.json").read_text())["complete"]
    assert signal.getsignal(signal.SIGINT) is handler  # this process's own handler is back


def test_the_device_is_what_a_command_sees(monkeypatch):
    """The rebuild asks a child process (as its commands are) for the device and hardware of the records."""
    probed = device.probe()
    assert probed == device.current_device()
    assert str(probed) == "cpu" and probed.hardware.startswith(f"a {os.cpu_count()}-core CPU (")
    child_running(monkeypatch, "import sys; print('error: no device', file=sys.stderr); sys.exit(1)", device_too=True)
    with pytest.raises(RebuildError, match="cannot tell the device .exit 1.: error: no device"):
        device.probe()
