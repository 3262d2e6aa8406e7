"""benchmarks.studies.curve: FID along a run (score), the real-image floor, and the plot."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from PIL import Image

from benchmarks.studies import curve
from tests.test_evaluation import tiny_extractor


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_curve_scores_each_checkpoint_once_gives_the_real_floor_and_plots(conditional_workdir, tmp_path, capsys):
    table = tmp_path / "results" / "run-fid.csv"
    score = ["score", "--workdir", str(conditional_workdir), "--csv", str(table), "--every", "2", "--num", "4",
             "--eval-root", str(tmp_path / "eval")]
    curve.main(score, feature_extractor_factory=tiny_extractor)
    [row] = rows(table)
    assert (row["step"], row["images_seen"], row["sampler"], row["spacing"], row["num"]) == ("2", "8", "ddim",
                                                                                            "uniform", "4")
    assert float(row["fid"]) > 0 and row["real_num"] == "14"  # the folder's 2 + 3 + 4 + 5 images
    record = json.loads((tmp_path / "eval" / "eval.jsonl").read_text().splitlines()[-1])
    assert float(row["fid"]) == pytest.approx(record["fid"], abs=1e-3)  # ddim eval's own line
    curve.main(score, feature_extractor_factory=tiny_extractor)  # a rerun scores only what is missing: nothing
    assert len(rows(table)) == 1

    [reference] = [path for path in (tmp_path / "eval" / "eval_cache").glob("real_*.npz")
                   if json.loads(str(np.load(path)["meta"]))["split"] == "all"]
    everything, _ = curve.real_floor(reference, num=14, draws=2)
    assert everything == pytest.approx(0.0, abs=1e-5)  # all the real images against themselves
    some, spread = curve.real_floor(reference, num=6, draws=3)
    assert some > everything + 1e-4 and spread > 0  # fewer images: farther from the whole set, and by the draw
    capsys.readouterr()
    curve.main(["floor", "--reference", str(reference), "--num", "6", "--draws", "3"])
    assert f"FID of 6 real images against all of them: {some:.2f}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="^error: --num must be between 2 and the 14 real images"):
        curve.main(["floor", "--reference", str(reference), "--num", "15"])
    statistics_only = tmp_path / "stats.npz"
    with np.load(reference) as data:
        np.savez(statistics_only, mu=data["mu"], sigma=data["sigma"])
    with pytest.raises(SystemExit, match="holds no features"):
        curve.main(["floor", "--reference", str(statistics_only)])
    with pytest.raises(SystemExit, match="^error: reference statistics file .* does not exist"):
        curve.main(["floor", "--reference", str(tmp_path / "missing.npz")])

    other = tmp_path / "results" / "other.csv"
    other.write_text("step,fid\n1000,90.5\n4000,60.25\n")
    picture = tmp_path / "docs" / "curve.png"
    curve.main(["plot", "--csv", str(table), "run", "--csv", str(other), "other", "--out", str(picture),
                "--hline", "17.1", "floor"])
    with Image.open(picture) as image:
        assert image.format == "PNG" and image.size[0] > 300
    log_picture = tmp_path / "docs" / "curve-log.png"
    curve.main(["plot", "--csv", str(other), "other", "--out", str(log_picture), "--log-steps"])
    curve.main(["plot", "--csv", str(other), "other", "--out", str(picture)])
    assert log_picture.read_bytes() != picture.read_bytes()  # the step axis is drawn another way
    empty = tmp_path / "results" / "empty.csv"
    empty.write_text("step,fid\n")
    with pytest.raises(SystemExit, match="^error: no rows in"):
        curve.main(["plot", "--csv", str(empty), "empty", "--out", str(tmp_path / "x.png")])


def test_curve_follows_a_consistency_run_with_the_students_own_sampler(conditional_workdir, tmp_path):
    """A ddim distill run's checkpoints are students: scored with their sampler, at their batch."""
    from ddim.distill import distill

    out = tmp_path / "consistency"
    distill(conditional_workdir, out, log=lambda message: None,
            overrides=["distill.method=consistency", "distill.start_steps=4", "distill.student_steps=[1, 2, 4]",
                       "distill.consistency_steps=2", "distill.batch_size=2", "train.eval_every=0",
                       "train.checkpoint_every=2"])
    table = tmp_path / "consistency-fid.csv"
    curve.main(["score", "--workdir", str(out), "--csv", str(table), "--every", "2", "--num", "4", "--steps", "2",
                "--guidance", "1.5", "--eval-root", str(tmp_path / "eval")], feature_extractor_factory=tiny_extractor)
    [row] = rows(table)
    assert (row["step"], row["images_seen"], row["sampler"], row["spacing"], row["sample_steps"], row["guidance"]) == (
        "2", "4", "consistency", "uniform", "2", "1.5")
    record = json.loads((tmp_path / "eval" / "eval.jsonl").read_text().splitlines()[-1])
    assert (record["sampler"], record["steps"]) == ("consistency", 2)
    assert curve.axis_labels(rows(table)) == ("training steps (batch 2)", "FID (4 samples, 2 consistency steps)")
    from ddim.spec import SpecError

    with pytest.raises(SpecError, match="distilled for 1, 2, 4 steps"):
        curve.checkpoint_spec(ddim_config_of(out), 3, None)


def ddim_config_of(workdir):
    from ddim.checkpoint import Checkpointer
    from ddim.workdir import Workdir

    folder = Workdir(workdir).checkpoints
    return Checkpointer(folder, create=False).restore_config(2)
