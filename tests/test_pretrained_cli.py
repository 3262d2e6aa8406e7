"""Bundled models on the command line: ``ddim pretrained`` and its export, ``--pretrained`` on the commands, the
page of a bundled model, and the fallback to the bundled model when there is no run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import ddim
from ddim.pretrained import ENV, read_manifest
from tests.conftest import REPO
from tests.pretrained_helpers import NAME
from tests.pretrained_helpers import bundles, use_bundles  # noqa: F401  (fixtures)
from tests.test_cli import assert_one_line_error, invoke


def test_pretrained_lists_the_bundled_models_with_their_records(use_bundles, tmp_path, monkeypatch):
    result = invoke("pretrained")
    assert result.exit_code == 0, result.output
    header, rule, row = result.output.splitlines()[:3]
    assert header.startswith("| model ") and set(rule) <= set("|- ")
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    # 16x16, unconditional, the plain setting: 20 ddim steps of one pass each; nothing measured yet.
    assert cells[:9] == [f"{NAME} (default)", "16x16", "none", "20 ddim steps (uniform), guidance 1", "20",
                         "-", "-", "", ""] and cells[9] == "-", cells
    result = invoke("pretrained", "--details")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == f"{NAME}: 16x16 images, unconditional (default)"
    assert "config smoke, 6 steps, 48 images seen, on a 2-core CPU" in result.output
    assert "FID: not measured" in result.output and "speed: not measured" in result.output
    result = invoke("pretrained", "list", "--json")
    assert result.exit_code == 0 and json.loads(result.output)["record"]["steps"] == 6
    monkeypatch.setenv(ENV, str(tmp_path / "none"))
    assert "no bundled models" in invoke("pretrained").output


def test_pretrained_export_command(trained_workdir, tmp_path):
    out = tmp_path / "bundles"
    result = invoke("pretrained", "export", "--checkpoint", trained_workdir / "checkpoints" / "4", "--name",
                    "flowers-test", "--out", out, "--hardware", "CPU")
    assert result.exit_code == 0, result.output
    assert f"wrote {out / 'flowers-test'}" in result.output and "warning: no FID recorded" in result.output
    assert read_manifest(out / "flowers-test").record["steps"] == 4
    assert_one_line_error(invoke("pretrained", "export", "--checkpoint", trained_workdir, "--name", "x", "--out",
                                 out, "--fid", "28.1"), "--fid-protocol")
    assert_one_line_error(invoke("pretrained", "export", "--checkpoint", tmp_path / "typo", "--name", "x",
                                 "--out", out), "does not exist")


def test_export_can_keep_the_dataset_to_score_against_instead_of_the_training_copy(trained_workdir, bundles,
                                                                                      tmp_path):
    """A model trained on a folder exported from a dataset bundles the dataset as its data (what ddim eval
    scores it against); only the data section changes, and the record keeps where it was trained."""
    real = tmp_path / "real.toml"
    real.write_text('[data]\nimage_dir = "/data/flowers-export"\nval_fraction = 0.1\n')
    out = tmp_path / "bundles"
    result = invoke("pretrained", "export", "--checkpoint", trained_workdir, "--name", "other-data", "--out", out,
                    "--real-data", real)
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out / "other-data")
    trained = ddim.load(trained_workdir).config
    assert (manifest.config.data.image_dir, manifest.config.data.val_fraction) == ("/data/flowers-export", 0.1)
    assert manifest.config.model == trained.model and manifest.config.train == trained.train
    assert manifest.record["trained_on_data"] == {"dataset": trained.data.dataset,
                                                  "train_split": trained.data.train_split}
    assert "trained_on_data" not in read_manifest(bundles / NAME).record  # exported without --real-data
    assert_one_line_error(invoke("pretrained", "export", "--checkpoint", trained_workdir, "--name", "y", "--out",
                                 out, "--real-data", tmp_path / "missing.toml"), "missing.toml")


def test_sample_with_pretrained_matches_the_checkpoint(trained_workdir, use_bundles, tmp_path):
    result = invoke("sample", "--pretrained", NAME, "--steps", 2, "--num", 2, "--out", tmp_path / "a")
    assert result.exit_code == 0, result.output
    assert f"bundled model {NAME} (step 6, config smoke" in result.output
    result = invoke("sample", "--workdir", trained_workdir, "--steps", 2, "--num", 2, "--out", tmp_path / "b")
    assert result.exit_code == 0, result.output
    for name in ("0000.png", "0001.png", "grid.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.slow
def test_a_tool_with_pretrained(use_bundles, tmp_path):
    image = tmp_path / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(image)
    result = invoke("reconstruct", image, "--pretrained", NAME, "--steps", 2, "--out", tmp_path / "rec")
    assert result.exit_code == 0, result.output
    assert f"bundled model {NAME}" in result.output and (tmp_path / "rec" / "comparison.png").is_file()


def test_the_page_of_a_bundled_model_names_it_and_prints_a_command_that_works_anywhere(use_bundles, tmp_path):
    """The header and the printed command say ``--pretrained NAME``, not the package's path on this machine."""
    from ddim.ui.workbench import Limits, Workbench

    bench = Workbench(ddim.load(f"pretrained:{NAME}"), Limits(max_images=4, max_steps=4))
    header = bench.card.markdown()
    assert f"bundled model `{NAME}` (step 6, config `smoke`)" in header and str(use_bundles) not in header
    result = bench.sample(2, 2, 3, 0)
    assert result.command.startswith(f"ddim sample --pretrained {NAME} --num 2 --seed 3 --steps 2 ")
    outcome = invoke(*result.command.split()[1:], "--out", tmp_path / "out", "--no-grid")
    assert outcome.exit_code == 0, outcome.output
    written = [np.asarray(Image.open(tmp_path / "out" / f"000{i}.png").convert("RGB")) for i in range(2)]
    np.testing.assert_array_equal(np.stack(written), result.images)


@pytest.mark.parametrize("command", [
    ["sample"], ["eval"], ["serve"], ["invert", "a.png"], ["reconstruct", "a.png"],
    ["interpolate", "--from", "1", "--to", "2"], ["edit", "a.png"], ["inpaint", "a.png", "--mask", "a.png"],
])
def test_pretrained_excludes_workdir_and_checkpoint_and_names_a_known_model(command, use_bundles, tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "a.png")
    for other in (["--workdir", "runs/x"], ["--checkpoint", "runs/x/checkpoints/4"]):
        assert_one_line_error(invoke(*command, "--pretrained", NAME, *other),
                              "--pretrained names a bundled model: leave out --workdir and --checkpoint", code=2)
    assert_one_line_error(invoke(*command, "--pretrained", "flowers32"),
                          f"no bundled model named 'flowers32' (available: {NAME})")


def test_eval_of_a_bundled_model_writes_into_runs_not_the_package():
    from ddim.cli.app import pretrained_workdir

    assert str(pretrained_workdir(f"pretrained:{NAME}")) == f"runs/pretrained-{NAME}"
    assert pretrained_workdir(REPO / "runs" / "x") is None


def test_sample_falls_back_to_the_bundled_model_without_runs(use_bundles, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("sample", "--steps", 1, "--num", 2, "--out", "samples", "--no-grid")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if "bundled model" in line]
    assert notes[0].startswith(f"no checkpoints under runs/: using the bundled model {NAME} (the first by name of "
                               "the 16x16 models") and "--pretrained, --workdir or --checkpoint picks another" in notes[0]
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["0000.png", "0001.png"]
    monkeypatch.setenv(ENV, str(tmp_path / "no-bundles"))
    assert_one_line_error(invoke("sample", "--out", "x"), "no checkpoints found under runs/")
