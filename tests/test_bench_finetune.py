"""benchmarks.studies.finetune: Fashion-MNIST's IDX files as folders by class, and both arms trained and scored."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from PIL import Image

from benchmarks.studies import finetune


def write_idx(path, array):
    """An IDX file as Fashion-MNIST ships them (gzip, big-endian sizes, uint8 data)."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def fake_fashion(root, train=30, test=20):
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for prefix, count in (("train", train), ("t10k", test)):
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (count, 28, 28)))
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", np.arange(count) % 10)
    return root


def test_export_writes_folders_by_class_at_32_pixels(tmp_path):
    idx = fake_fashion(tmp_path / "idx")
    finetune.main(["export", str(tmp_path / "out"), "--idx", str(idx), "--per-class", "2"])
    train = sorted((tmp_path / "out" / "train").rglob("*.png"))
    assert len(train) == 30 and len(list((tmp_path / "out" / "test").rglob("*.png"))) == 20
    assert sorted(p.name for p in (tmp_path / "out" / "train").iterdir()) == sorted(finetune.CLASSES)
    assert len(list((tmp_path / "out" / "train-2").rglob("*.png"))) == 20  # 2 of each of the 10 classes
    with Image.open(train[0]) as image:
        assert image.size == (32, 32)
    original = finetune.read_idx(idx / "train-images-idx3-ubyte.gz")
    assert original.shape == (30, 28, 28)
    first = np.asarray(Image.open(tmp_path / "out" / "train" / "t-shirt" / "00000.png"))
    resized = np.asarray(Image.fromarray(original[0]).resize((32, 32), Image.BILINEAR))
    np.testing.assert_array_equal(first, resized)


def test_export_small_writes_disjoint_folders_at_64_pixels(tmp_path):
    idx = fake_fashion(tmp_path / "idx", train=2500, test=1000)  # 250 of each class, 100 of each in the test set
    finetune.main(["export-small", str(tmp_path / "out"), "--idx", str(idx)])
    counts = {name: len(list((tmp_path / "out" / name).rglob("*.png"))) for name in finetune.SMALL_FOLDERS}
    assert counts == {"fashion-20": 20, "fashion-20-heldout": 400, "fashion-500": 500, "fashion-test-1000": 1000}
    assert sorted(p.name for p in (tmp_path / "out" / "fashion-20").iterdir()) == ["dress", "sneaker"]
    names = {name: {p.name for p in (tmp_path / "out" / name).rglob("*.png")} for name in ("fashion-20",
                                                                                         "fashion-20-heldout")}
    assert not names["fashion-20"] & names["fashion-20-heldout"]  # the held-out images were never trained on
    with Image.open(next((tmp_path / "out" / "fashion-500").rglob("*.png"))) as image:
        assert image.size == (64, 64)


def test_export_without_the_idx_files_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit, match="^error: no Fashion-MNIST IDX file .*dataset-fashion-mnist"):
        finetune.main(["export", str(tmp_path / "out"), "--idx", str(tmp_path)])


@pytest.mark.slow
def test_run_trains_and_scores_both_arms_at_each_mark_once(tmp_path):
    from tests.test_evaluation import tiny_extractor

    finetune.main(["export", str(tmp_path / "data"), "--idx", str(fake_fashion(tmp_path / "idx")), "--per-class", "2"])
    run = ["run", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--step-seconds", "60",
           "--minutes", "1", "2", "--per-class", "2", "--num", "4", "--set", "train.batch_size=4",
           "--set", "train.warmup_steps=0", "--set", "train.normalizer_batches=1"]
    finetune.main(run, feature_extractor_factory=tiny_extractor)
    rows = finetune.read_rows(tmp_path / "out" / "finetune.jsonl")
    assert [(r["arm"], r["minutes"], r["step"]) for r in rows] == [("scratch", 1, 1), ("finetuned", 1, 1),
                                                                   ("scratch", 2, 2), ("finetuned", 2, 2)]
    assert all(r["fid"] > 0 and r["kid"] is not None and r["num"] == 4 and r["real_num"] == 20 and r["train_images"] == 20 for r in rows)
    from ddim.checkpoint import Checkpointer, checkpoint_dir

    checkpointer = Checkpointer(checkpoint_dir(tmp_path / "out" / "finetuned-2"))
    assert checkpointer.restore_config(2).init.source == "pretrained:flowers32-noise"
    assert checkpointer.restore_config(2).train.lr_decay_steps == 2  # one schedule, the longest mark's
    checkpointer.close()
    finetune.main(run, feature_extractor_factory=tiny_extractor)  # a rerun does only what is missing: nothing
    assert len(finetune.read_rows(tmp_path / "out" / "finetune.jsonl")) == 4


def test_each_arm_starts_as_its_name_says(tmp_path):
    configs = {arm: finetune.arm_config(arm, tmp_path, 300, ["train.max_steps=10"]) for arm in finetune.ARMS}
    assert configs["scratch"].init.source == "" and configs["finetuned"].init.source == finetune.SOURCE
    assert [(c.init.normalizer, c.init.new_classes) for c in configs.values()] == [
        ("keep", "random"), ("keep", "random"), ("keep", "null"), ("keep", "mean"), ("adapt", "null")]
    # Everything else is the same: the arms differ in how they start, not in how they train.
    assert len({(c.train, c.data, c.model) for c in configs.values()}) == 1
    assert configs["finetuned"].train.lr_decay_steps == 300 and configs["finetuned"].data.val_fraction == 0.0


def test_the_table_orders_rows_by_training_set_minutes_and_arm(tmp_path, capsys):
    row = {"step": 411, "kid": 0.0267, "class_accuracy": 0.142, "fid": 56.46}
    rows = [{**row, "arm": "finetuned", "per_class": 0, "minutes": 10},
            {**row, "arm": "finetuned", "per_class": 100, "minutes": 30, "step": 1233},
            {**row, "arm": "finetuned", "per_class": 100, "minutes": 10},
            {**row, "arm": "scratch", "per_class": 100, "minutes": 10, "kid": None, "class_accuracy": None}]
    (tmp_path / "finetune.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    finetune.main(["table", "--out", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == ["| 100 per class | 10 | 411 | scratch | 56.5 |  |  |",
                         "| 100 per class | 10 | 411 | finetuned | 56.5 | 0.0267 | 14.2 % |",
                         "| 100 per class | 30 | 1,233 | finetuned | 56.5 | 0.0267 | 14.2 % |",
                         "| all 60,000 | 10 | 411 | finetuned | 56.5 | 0.0267 | 14.2 % |"]


def test_the_plot_draws_a_line_per_arm_and_training_set_at_the_rows_pace(tmp_path, monkeypatch):
    import matplotlib.figure

    rows = [{"arm": arm, "per_class": per_class, "minutes": minutes, "step": round(minutes * 60 / 1.46),
             "fid": fid} for arm, per_class, minutes, fid in
            [("scratch", 100, 10, 106.3), ("scratch", 100, 30, 40.4), ("finetuned", 100, 10, 54.3),
             ("finetuned", 100, 30, 38.6), ("finetuned", 0, 10, 50.0)]]
    (tmp_path / "finetune.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    drawn = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda figure, *a, **k: drawn.append(figure))
    finetune.main(["plot", "--out", str(tmp_path), "--png", str(tmp_path / "curve.png")])
    (axis,) = drawn[0].axes
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()), line.get_color(),
                                line.get_linestyle()) for line in axis.get_lines()}
    assert set(lines) == {"scratch, 100 images per class", "finetuned, 100 images per class",
                          "finetuned, all 60,000 images"}
    assert lines["scratch, 100 images per class"][:2] == ([10, 30], [106.3, 40.4])
    # An arm keeps its colour across training sets; the training set is the line's style.
    assert lines["finetuned, all 60,000 images"][2] == lines["finetuned, 100 images per class"][2]
    assert lines["finetuned, 100 images per class"][2] != lines["scratch, 100 images per class"][2]
    assert lines["finetuned, all 60,000 images"][3] != lines["finetuned, 100 images per class"][3]
    assert axis.get_xlabel() == "minutes of training (2-core CPU, 1.46 s a step)"


def test_the_marks_and_not_the_configs_epochs_end_a_run(tmp_path):
    """On 100 images per class the config's 100 epochs are 1,500 steps: a 90-minute mark is more."""
    config = finetune.arm_config("scratch", tmp_path, 3699, ["train.max_steps=3699"])
    assert config.train.num_epochs >= 3699 and config.train.max_steps == 3699 and config.train.lr_decay_steps == 3699
