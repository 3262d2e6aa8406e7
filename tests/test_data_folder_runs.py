"""Image folders in the commands: ``ddim data``'s report and exit codes, training on a folder (an exact resume,
two devices) and ``ddim eval --data``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ddim import data
from tests.image_folders import folder_config, quiet, write_plain_folder


def run_cli(*args):
    from typer.testing import CliRunner

    from ddim.cli import app

    return CliRunner().invoke(app, list(args))


def test_ddim_data_reports_counts_and_exit_codes(tmp_path):
    root = tmp_path / "photos"
    write_plain_folder(root, 30, classes=("a", "b"), size=20)
    (root / "broken.png").write_bytes(b"\x89PNG broken")
    workdir = tmp_path / "run"
    ok = run_cli("data", str(root), "--workdir", str(workdir), "--set", "model.image_size=16")
    assert ok.exit_code == 0, ok.output
    for text in ("31 files: 30 usable", "1 skipped", "not an image Pillow can read", "classes", "2: a (15), b (15)",
                 "shorter side", "ok: `ddim train --data"):
        assert text in ok.output, text
    report = json.loads(next((workdir / "data_cache").glob("*/report.json")).read_text())
    assert report["skipped"] == [{"path": "broken.png", "reason": "not_an_image", "detail": ""}]
    as_json = run_cli("data", str(root), "--workdir", str(workdir), "--set", "model.image_size=16", "--json")
    assert json.loads(as_json.stdout)["usable"] == 30

    # More unusable files than data.max_bad_fraction: training would refuse, so exit 1 and say why.
    for i in range(5):
        (root / f"empty{i}.jpg").write_bytes(b"")
    refused = run_cli("data", str(root), "--workdir", str(workdir), "--set", "model.image_size=16")
    assert refused.exit_code == 1
    assert "error: training would refuse this folder" in refused.output and "data.max_bad_fraction" in refused.output
    missing = run_cli("data", str(tmp_path / "nowhere"), "--workdir", str(workdir))
    assert missing.exit_code == 1 and "error: image folder not found" in missing.output
    assert "Traceback" not in missing.output + refused.output


@pytest.mark.slow
def test_training_on_a_folder_resumes_bit_exactly_and_warns_when_the_folder_changed(tmp_path):
    import jax

    from ddim.checkpoint import Checkpointer, checkpoint_dir
    from ddim.train import loop

    root = tmp_path / "photos"
    write_plain_folder(root, 48, classes=("a", "b"))
    (root / "broken.jpg").write_bytes(b"")

    def run(workdir, max_steps, messages=None):
        config = folder_config(root, f"train.max_steps={max_steps}", "train.eval_every=0")
        return loop.train(config, tmp_path / workdir, log=quiet(messages))

    messages = []
    straight = run("straight", 7, messages)
    run("resumed", 3)
    resumed = run("resumed", 7)
    assert resumed.start_step == 3 and straight.last_metrics == resumed.last_metrics

    def params(workdir):
        checkpointer = Checkpointer(checkpoint_dir(tmp_path / workdir))
        state = checkpointer.restore_state(7)
        checkpointer.close()
        return state

    jax.tree.map(np.testing.assert_array_equal, params("straight"), params("resumed"))
    # The start-of-training line, the skipped file in the work directory's report.
    line = next(m for m in messages if m.startswith("data: "))
    assert f"data: folder {root}, " in line and "1 skipped" in line and "global batch 8" in line
    assert "devices: 1 cpu, mesh (1,)" in line
    report = json.loads((tmp_path / "straight" / data.REPORT_FILE).read_text())
    assert report["skipped"] == [{"path": "broken.jpg", "reason": "empty", "detail": ""}]

    # Files added before a resume: a warning, not a crash.
    write_plain_folder(root, 4, start=48)
    changed = []
    result = run("resumed", 9, changed)
    assert result.final_step == 9
    assert any(m.startswith("warning: the data changed since this run last trained") for m in changed), changed


@pytest.mark.slow
def test_two_forced_cpu_devices_train_on_a_folder(tmp_path):
    """Two devices in one process: each global batch is read once and split over the mesh."""
    from tests.test_parallel import run_worker

    root = tmp_path / "photos"
    write_plain_folder(root, 40)
    overrides = [f"data.image_dir={json.dumps(str(root))}"]
    two = run_worker("train", {"workdir": str(tmp_path / "two"), "max_steps": 3, "overrides": overrides}, devices=2)
    assert (two["devices"], two["start"], two["final"]) == (2, 0, 3)
    assert all(np.isfinite(value) for value in two["metrics"].values())
    (entry,) = (tmp_path / "two" / "data_cache").iterdir()
    assert entry.name.startswith("folder-photos-")


def test_eval_scores_against_an_image_folder(trained_workdir, tmp_path):
    """`ddim eval --data PATH`: the real images are that folder's validation split, cached by its files."""
    from ddim import evaluation
    from tests.tiny_fid import tiny_extractor

    root = tmp_path / "photos"
    write_plain_folder(root, 40)
    out = tmp_path / "eval"
    out.mkdir()
    kwargs = dict(num=8, steps=2, batch_size=4, feature_extractor_factory=tiny_extractor, workdir=out,
                  kid_subsets=3, log=quiet(), show_progress=False, image_dir=root)
    result = evaluation.evaluate_checkpoint(trained_workdir, **kwargs)
    val = data.load(folder_config(root), out, log=quiet(), show_progress=False).val
    assert result["real_num"] == len(val) and f"of {root} by path hash" in result["split_expression"]
    cached = len(list((out / "eval_cache").glob("real_*.npz")))
    assert (out / "data_cache").is_dir() and cached >= 1
    # A changed folder is a different set of real images: new features, not the cached ones.
    write_plain_folder(root, 20, start=40)
    again = evaluation.evaluate_checkpoint(trained_workdir, **kwargs)
    assert again["real_num"] > result["real_num"]
    assert len(list((out / "eval_cache").glob("real_*.npz"))) == 2 * cached
