"""The command line through typer's CliRunner: end to end, and one clear line for bad input."""

import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ddim.cli import app
from tests.conftest import CONFIGS, TINY, mock_flowers

runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def assert_one_line_error(result, text, code=1):
    assert result.exit_code == code, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and text in lines[0], result.output


def test_help_is_instant_and_imports_no_heavy_library():
    code = "import sys, ddim.cli; print(sorted(m for m in ('jax', 'tensorflow', 'flax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    result = invoke("--help")
    assert result.exit_code == 0 and "train" in result.output and "sample" in result.output


def test_train_then_sample_end_to_end(tmp_path):
    workdir = tmp_path / "run"
    overrides = [arg for item in TINY for arg in ("--set", item)]
    with mock_flowers():
        result = invoke("train", "--config", CONFIGS / "smoke.toml", "--workdir", workdir, *overrides,
                        "--set", "train.max_steps=4")
    assert result.exit_code == 0, result.output
    assert "trained to step 4" in result.output
    out = tmp_path / "samples"
    result = invoke("sample", "--workdir", workdir, "--steps", 2, "--num", 3, "--batch-size", 2, "--out", out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["0000.png", "0001.png", "0002.png", "grid.png"]
    # Samplers at few steps were compared at 32x32 only: a 16x16 model gets no tip.
    assert not [line for line in result.output.splitlines() if line.startswith("tip:")], result.output
    # Running again into the same directory must not overwrite without --overwrite ...
    before = (out / "0000.png").read_bytes()
    result = invoke("sample", "--workdir", workdir, "--steps", 2, "--num", 3, "--out", out)
    assert_one_line_error(result, "already exists")
    # ... and with it, the same seed gives the same pixels.
    result = invoke("sample", "--workdir", workdir, "--steps", 2, "--num", 3, "--out", out, "--overwrite")
    assert result.exit_code == 0 and (out / "0000.png").read_bytes() == before
    # Another sampler and spacing: other pixels from the same seed.
    result = invoke("sample", "--workdir", workdir, "--steps", 2, "--num", 3, "--out", out, "--overwrite",
                    "--sampler", "dpmpp-2m", "--spacing", "karras")
    assert result.exit_code == 0 and (out / "0000.png").read_bytes() != before


def test_sample_defaults_to_the_newest_run(trained_workdir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(trained_workdir, tmp_path / "runs" / "smoke")
    result = invoke("sample", "--steps", 1, "--num", 2, "--out", "samples", "--no-grid")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["0000.png", "0001.png"]


def test_unknown_config_key(tmp_path):
    result = invoke("train", "--config", CONFIGS / "smoke.toml", "--workdir", tmp_path, "--set", "train.bogus=1")
    assert_one_line_error(result, "unknown config key 'train.bogus'")


def test_missing_config_file(tmp_path):
    result = invoke("train", "--config", tmp_path / "missing.toml", "--workdir", tmp_path)
    assert_one_line_error(result, "config file not found")


def test_missing_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    result = invoke("sample", "--workdir", tmp_path / "empty", "--out", tmp_path / "out")
    assert_one_line_error(result, "no checkpoints in")
    result = invoke("sample", "--workdir", tmp_path / "typo", "--out", tmp_path / "out")
    assert_one_line_error(result, "does not exist")
    result = invoke("sample", "--checkpoint", tmp_path / "nope", "--out", tmp_path / "out")
    assert_one_line_error(result, "checkpoint not found")


def test_no_runs_at_all(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDIM_PRETRAINED_DIR", str(tmp_path / "no-bundled-models"))  # nor a model to fall back to
    assert_one_line_error(invoke("sample", "--out", "x"), "no checkpoints found under runs/")


@pytest.mark.parametrize(
    "args,text",
    [
        (["--steps", "0"], "--steps must be >= 1"),
        (["--num", "0"], "--num must be >= 1"),
        (["--batch-size", "-3"], "--batch-size must be >= 1"),
        (["--eta", "-1"], "--eta must be >= 0"),
        (["--sampler", "euler"], "unknown --sampler 'euler' (choose from ddim, dpmpp-2m, dpmpp-3m, consistency)"),
        (["--spacing", "cosine"], "unknown --spacing 'cosine' (choose from uniform, logsnr, karras)"),
        (["--sampler", "dpmpp-2m", "--eta", "0.5"], "--eta > 0 needs --sampler ddim"),
    ],
)
def test_non_positive_arguments(trained_workdir, tmp_path, args, text):
    result = invoke("sample", "--workdir", trained_workdir, "--out", tmp_path / "out", *args)
    assert_one_line_error(result, text, code=2)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args,text",
    [
        (["sample", "--nope"], "no such option: --nope ("),
        (["sample", "--steps", "abc"], "invalid value for '--steps'"),
        (["sample", "--steps"], "option '--steps' requires an argument"),
        (["bogus"], "no such command 'bogus'"),
        (["pretrained", "export"], "missing option '--checkpoint'"),
        (["--nope"], "no such option: --nope"),
    ],
)
def test_option_parsing_errors_are_one_line(args, text):
    result = invoke(*args)
    assert_one_line_error(result, text, code=2)
    assert result.output.count("\n") == 1 and "\u256d" not in result.output, result.output  # no boxed panel
    if args[:2] == ["sample", "--nope"]:
        assert result.output.rstrip().endswith("sample --help)"), result.output  # where to look


def test_help_still_prints_with_one_line_errors():
    result = invoke("sample", "--help")
    assert result.exit_code == 0 and "--steps" in result.output and "error:" not in result.output
    result = invoke()  # no arguments: the command list
    assert "sample" in result.output and "error:" not in result.output


HELP_SCREEN_LINES = 60  # two screens of 30 lines


def help_at_80_columns(*command: str) -> list[str]:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80, result.output
    return lines


def test_sample_help_fits_two_screens_at_80_columns_with_every_docs_link_whole():
    import re

    from tests.docs_helpers import REPO, anchors

    lines = help_at_80_columns("sample")
    assert len(lines) <= HELP_SCREEN_LINES, "\n".join(lines)
    assert any("docs/sampling.md#which-sampler-how-many-steps" in line for line in lines), "\n".join(lines)
    for line in lines:
        assert "\u2026" not in line, line  # nothing cut short with an ellipsis
        for link in re.findall(r"docs/[\w./-]*[\w/](?:#[\w-]*)?", line):  # each link whole on its line
            path, _, anchor = link.partition("#")
            assert (REPO / path).is_file() and (not anchor or anchor in anchors(REPO / path)), (link, line)


@pytest.mark.parametrize("command", [["train"], ["eval"], ["edit"], ["interpolate"], ["distill"], ["serve"]])
def test_other_commands_help_cuts_no_text_short_at_80_columns(command):
    lines = help_at_80_columns(*command)
    assert not [line for line in lines if "\u2026" in line], "\n".join(lines)


def test_output_path_is_a_file(trained_workdir, tmp_path):
    target = tmp_path / "file.png"
    target.write_bytes(b"x")
    result = invoke("sample", "--workdir", trained_workdir, "--out", target)
    assert_one_line_error(result, "is not a directory")
    assert target.read_bytes() == b"x"


def test_output_dir_cannot_be_created(trained_workdir, tmp_path):
    (tmp_path / "blocker").write_text("a file where a directory should be")
    result = invoke("sample", "--workdir", trained_workdir, "--out", tmp_path / "blocker" / "out")
    assert_one_line_error(result, "cannot create output directory")


def test_corrupt_checkpoint_via_cli(trained_workdir, tmp_path):
    workdir = tmp_path / "corrupt"
    shutil.copytree(trained_workdir, workdir)
    (workdir / "checkpoints" / "6" / "config" / "metadata").write_text("{not json")
    named = workdir / "checkpoints" / "6"
    result = invoke("sample", "--checkpoint", named, "--out", tmp_path / "out", "--steps", 1, "--num", 1)
    assert_one_line_error(result, f"checkpoint {named} is damaged: config/metadata is not valid JSON")
    # The work directory falls back to step 4 with one warning; the damaged one is kept, set aside.
    result = invoke("sample", "--workdir", workdir, "--out", tmp_path / "out", "--steps", 1, "--num", 1)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"skipping damaged checkpoint {named}" in warnings[0], result.output
    assert "(step 4," in result.output
    assert (workdir / "checkpoints" / "6.damaged" / "config" / "metadata").read_text() == "{not json"

def test_sample_tip_names_the_few_step_sampler_that_scored_best():
    from ddim.cli.app import sampler_tip

    assert sampler_tip(20, "ddim", "uniform", 32) is None  # from 20 steps on the choice is within 1 FID
    assert sampler_tip(20, "dpmpp-2m", "logsnr", 32) is None and sampler_tip(12, "ddim", "karras", 32) is None
    assert sampler_tip(10, "dpmpp-2m", "logsnr", 32) is None and sampler_tip(5, "dpmpp-2m", "logsnr", 32) is None
    for sampler, spacing in (("ddim", "uniform"), ("dpmpp-2m", "uniform"), ("ddim", "logsnr"), ("dpmpp-3m", "karras")):
        tip = sampler_tip(5, sampler, spacing, 32)
        assert tip.startswith("tip: at 10 steps or fewer, --sampler dpmpp-2m --spacing logsnr gives better images")
        assert len(tip) < 120, "one short sentence"
        # Measured at 32x32 only: no tip at another size.
        assert sampler_tip(5, sampler, spacing, 64) is None and sampler_tip(5, sampler, spacing, 16) is None


def test_the_few_step_tip_is_measured_where_a_record_says_so():
    from ddim.pretrained.registry import find
    from ddim.spec import FEW_STEPS_BEST, FEW_STEPS_MEASURED_ON

    for name in FEW_STEPS_MEASURED_ON:
        manifest = find(name)
        assert manifest.config.model.image_size == 32
        assert f"{FEW_STEPS_BEST[0]} on the {FEW_STEPS_BEST[1]} grid" in manifest.record["advice"]
    assert "fewer steps are not measured at 64x64" in find("flowers64-noise").record["advice"]


@pytest.mark.parametrize("name, tip", [("flowers64", False), ("flowers32", True)])
def test_sample_tips_a_bundled_model_only_at_the_size_samplers_were_compared(name, tip, tmp_path, monkeypatch):
    from ddim.sampling import outputs

    monkeypatch.setattr(outputs, "sample_to_folder", lambda *args, **kwargs: [])  # the tip, not the images
    result = invoke("sample", "--pretrained", name, "--steps", 8, "--sampler", "ddim", "--spacing", "uniform",
                    "--num", 1, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert any(line.startswith("tip: at 10 steps or fewer") for line in result.output.splitlines()) == tip


def test_guidance_tip_only_when_a_bundled_model_is_asked_another_scale_than_its_best():
    from ddim.cli.app import guidance_tip
    from ddim.pretrained.registry import best_guidance

    best = best_guidance("flowers64-noise")
    assert best == 2.0  # the record's default scale
    assert guidance_tip("flowers64-noise", True, None) is None  # the default is the best measured scale
    assert guidance_tip("flowers64-noise", True, best) is None
    assert guidance_tip("flowers64-noise", True, 1.0) == ("tip: flowers64-noise scored its best FID at --guidance 2, "
                                                          "its default (docs/models.md)")
    assert guidance_tip(None, True, 3.0) is None  # a user's run: its best scale is not measured
    assert guidance_tip("my-model", True, 3.0) is None  # a model in $DDIM_PRETRAINED_DIR nobody measured here
    assert guidance_tip("unconditional", False, None) is None




def test_distill_method_help_states_one_default():
    import typer

    from ddim.config.distill import DistillConfig

    command = typer.main.get_command(app).commands["distill"]
    (method,) = [param for param in command.params if param.name == "method"]
    assert method.help.lower().count("default") == 1, method.help
    assert method.help.endswith(f"Default: --config's distill.method, else {DistillConfig().method}.")


def test_list_classes_names_its_columns():
    from types import SimpleNamespace

    from ddim.cli.app import describe_classes

    pipe = SimpleNamespace(classes=["daisy", "pink primrose"], class_space=SimpleNamespace(counts=[40, 7]))
    assert describe_classes(pipe).splitlines() == ["  id  training images  name",
                                                   "   0               40  daisy",
                                                   "   1                7  pink primrose"]
    pipe.class_space.counts = None  # a checkpoint without the counts: no empty column
    assert describe_classes(pipe).splitlines() == ["  id  name", "   0  daisy", "   1  pink primrose"]
