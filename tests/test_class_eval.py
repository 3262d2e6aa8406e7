"""``ddim eval`` on class-conditional checkpoints (--class, --guidance, the class mode and the class accuracy),
the labelled real-feature cache, and benchmarks.studies.guidance.

The FID network is the tiny random one of tests/tiny_fid.py (the real weights may be absent); the
conditional checkpoint is a tiny model trained for two steps on a folder of two colour classes, which even a
random network's features tell apart.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks import common, samples
from benchmarks.release import fid_of_samples, generate_eval_samples
from benchmarks.studies import curve, guidance
from ddim import evaluation
from tests.conftest import mock_flowers, tiny_config
from tests.test_cli import assert_one_line_error
from tests.eval_helpers import eval_lines, run_cli
from tests.tiny_fid import tiny_extractor

COLOURS = {"bluebell": (40, 60, 220), "sunflower": (230, 200, 30)}  # class ids in name order: 0, 1
PER_CLASS = 16


def write_colour_folder(root: Path) -> Path:
    """``PER_CLASS`` noisy 20x20 images of each colour, one subfolder (class) per colour."""
    rng = np.random.default_rng(0)
    for name, colour in COLOURS.items():
        (root / name).mkdir(parents=True)
        for index in range(PER_CLASS):
            pixels = np.clip(np.array(colour) + rng.normal(0, 25, (20, 20, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{index:03d}.png")
    return root


@pytest.fixture(scope="module")
def conditional_workdir(tmp_path_factory) -> Path:
    from ddim.train import train

    folder = write_colour_folder(tmp_path_factory.mktemp("colours") / "images")
    workdir = tmp_path_factory.mktemp("conditional") / "run"
    config = tiny_config("model.class_conditional=true", f"data.image_dir={json.dumps(str(folder))}",
                         "train.max_steps=2", "data.val_fraction=0.3")
    train(config, workdir, log=lambda message: None)
    return workdir


@pytest.fixture
def tiny_standard_network(monkeypatch):
    """The CLI's standard FID network replaced by the tiny random one (no weights needed)."""
    from ddim.evaluation import fid_inception

    monkeypatch.setattr(fid_inception, "standard_factory", lambda *args, **kwargs: tiny_extractor)


QUIET = {"feature_extractor_factory": tiny_extractor, "log": lambda message: None, "show_progress": False}
CLASS_FIELDS = {"class_mode", "class_accuracy", "real_val_class_accuracy", "chance", "classifier"}


# --------------------------------------------------------------------------- unconditional checkpoints


@pytest.mark.parametrize("args, what", [(["--guidance", "2"], "guidance scale"), (["--class", "daisy"], "classes")])
def test_an_unconditional_checkpoint_refuses_a_class_and_a_guidance_scale(trained_workdir, tiny_standard_network,
                                                                         args, what):
    before = eval_lines(trained_workdir)
    result = run_cli("--workdir", str(trained_workdir), "--num", "4", *args)
    assert_one_line_error(result, "this model is not class-conditional (trained without model.class_conditional), "
                                  f"so it takes no {what}")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert eval_lines(trained_workdir) == before
    assert not (trained_workdir / evaluation.CACHE_DIR).exists()  # refused before any work


def test_one_class_cannot_be_scored_against_reference_statistics_or_another_folder(tmp_path):
    for fields, option in (({"real_stats": tmp_path / "s.npz"}, "--real-stats"), ({"image_dir": tmp_path}, "--data")):
        with pytest.raises(evaluation.EvaluationError, match=f"so it takes no {option}"):
            evaluation.EvalRequest("run", only_class="daisy", **fields)
    with pytest.raises(TypeError, match="class name or id"):
        evaluation.EvalRequest("run", only_class=1.5)


def test_the_summary_shows_the_classes_only_for_a_conditional_checkpoint():
    base = {"checkpoint": "c", "step": 1, "num": 8, "steps": 2, "eta": 0.0, "seed": 0, "real_num": 4, "split": "val",
            "split_expression": "v", "kid_mean": 0.1, "kid_std": 0.01, "kid_subsets": 2, "kid_subset_size": 4,
            "kid_image_size": 299, "fid": 3.0, "fid_image_size": 299, "fid_feature_net": "n", "wall_time_s": 1.0,
            "guidance": None}
    assert "class accuracy" not in evaluation.format_table(base)
    conditional = {**base, "guidance": 2.0, "class_mode": "class:sunflower", "class_accuracy": 0.625,
                   "real_val_class_accuracy": None, "chance": 1 / 102}
    table = evaluation.format_table(conditional)
    assert "class:sunflower, guidance 2" in table
    assert "62.5% of the generated images; real val images n/a (the ceiling); chance 1.0%" in table


# --------------------------------------------------------------------------- the labelled real-feature cache


def test_real_features_keep_their_labels(tmp_path, monkeypatch):
    from ddim import data

    config, extractor = tiny_config(), tiny_extractor(evaluation.KID_IMAGE_SIZE)
    (tmp_path / "cache").mkdir()
    with mock_flowers():
        labels_of_split = np.asarray(data.load_split(config, "val", tmp_path / "data").label_array())
        (features,), labels = evaluation.labelled_real_features(config, "val", None, [extractor], tmp_path / "cache",
                                                                data_cache=tmp_path / "data")
    np.testing.assert_array_equal(labels, labels_of_split)
    (path,) = (tmp_path / "cache").glob("real_*.npz")
    with np.load(path) as stored:
        np.testing.assert_array_equal(stored["labels"], labels)

    monkeypatch.setattr(data, "load_split", lambda *a, **k: pytest.fail("the pixels were read again"))
    with mock_flowers():
        (again,), cached_labels = evaluation.labelled_real_features(config, "val", None, [extractor],
                                                                    tmp_path / "cache", data_cache=tmp_path / "data")
    np.testing.assert_array_equal(again, features)
    np.testing.assert_array_equal(cached_labels, labels)
    (plain,) = evaluation.real_features(config, "val", None, [extractor], tmp_path / "cache")
    np.testing.assert_array_equal(plain, features)


def test_the_all_split_joins_the_cached_train_and_val_features(tmp_path, monkeypatch):
    from ddim import data

    config, extractor = tiny_config(), tiny_extractor(evaluation.KID_IMAGE_SIZE)
    (tmp_path / "cache").mkdir()
    with mock_flowers():
        (direct,) = evaluation.real_features(config, "all", None, [extractor], None, data_cache=tmp_path / "data")
        expected_labels = data.load_split_labels(config, "all", tmp_path / "data")
        for part in ("train", "val"):
            evaluation.labelled_real_features(config, part, None, [extractor], tmp_path / "cache",
                                              data_cache=tmp_path / "data")
        monkeypatch.setattr(data, "load_split", lambda *a, **k: pytest.fail("the pixels were read again"))
        (joined,), labels = evaluation.labelled_real_features(config, "all", 40, [extractor], tmp_path / "cache",
                                                              data_cache=tmp_path / "data")
    assert len(expected_labels) == len(direct) == 64 and len(joined) == 40
    np.testing.assert_allclose(joined, evaluation.select_real(direct, 40), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(labels, evaluation.select_real(expected_labels, 40))


def test_the_train_and_val_splits_are_cut_from_cached_all_features(tmp_path, monkeypatch):
    from ddim import data
    from ddim.evaluation import reference

    config, extractor = tiny_config(), tiny_extractor(evaluation.KID_IMAGE_SIZE)
    (tmp_path / "cache").mkdir()
    with mock_flowers():
        (whole,), whole_labels = evaluation.labelled_real_features(config, "all", None, [extractor],
                                                                   tmp_path / "cache", data_cache=tmp_path / "data")
        num_train = len(data.load_split_labels(config, "train", tmp_path / "data"))
        monkeypatch.setattr(reference, "_compute", lambda *a, **k: pytest.fail("the images were featurised again"))
        (train,), train_labels = evaluation.labelled_real_features(config, "train", None, [extractor],
                                                                   tmp_path / "cache", data_cache=tmp_path / "data")
        (val,), val_labels = evaluation.labelled_real_features(config, "val", None, [extractor], tmp_path / "cache",
                                                               data_cache=tmp_path / "data")
    assert 0 < num_train < len(whole) and len(train) == num_train and len(train) + len(val) == len(whole)
    np.testing.assert_array_equal(np.concatenate([train, val]), whole)
    np.testing.assert_array_equal(np.concatenate([train_labels, val_labels]), whole_labels)
    with mock_flowers():
        np.testing.assert_array_equal(val_labels, data.load_split_labels(config, "val", tmp_path / "data"))


# --------------------------------------------------------------------------- conditional checkpoints


def test_real_labels_are_matched_to_the_models_classes_by_name():
    """A model trained on a folder export of a dataset lists the dataset's classes in folder (name) order."""
    from ddim.evaluation.conditional import ClassPlan, as_model_ids

    plan = ClassPlan(("bluebell", "sunflower", "tulip"), None, 1.0)
    labels = np.array([0, 1, 2, -1, 2], np.int32)
    same = as_model_ids(plan, labels, ["bluebell", "sunflower", "tulip"])
    assert same.tolist() == labels.tolist() and same.dtype == labels.dtype
    assert as_model_ids(plan, labels, ["tulip", "bluebell", "sunflower"]).tolist() == [2, 0, 1, -1, 1]
    assert as_model_ids(plan, np.array([1, 1]), ["rose", "tulip"]).tolist() == [2, 2]  # an unused unknown class
    assert as_model_ids(plan, labels, []).tolist() == labels.tolist()  # no names: nothing to match
    with pytest.raises(evaluation.EvaluationError, match="not trained on: 'rose'"):
        as_model_ids(plan, np.array([0, 1]), ["rose", "tulip"])


@pytest.mark.slow
def test_conditional_eval_draws_classes_as_the_data_and_scores_them(conditional_workdir):
    from ddim import data
    from ddim.evaluation import class_consistency as consistency
    from ddim.sampling import load
    from ddim.spec import SamplingSpec

    spec = SamplingSpec(steps=2, guidance=2.0)
    record = evaluation.evaluate(evaluation.EvalRequest(conditional_workdir, num=8, spec=spec, batch_size=4,
                                                        kid_subsets=2), **QUIET)
    assert (record["guidance"], record["class_mode"], record["chance"]) == (2.0, "data-frequency", 0.5)
    assert record["real_val_class_accuracy"] == 1.0  # the two colours are easy
    assert eval_lines(conditional_workdir)[-1]["class_mode"] == "data-frequency"

    # By hand: the images of each batch with the classes drawn from the batch's seed (what generate() does
    # without classes), featurised and classified by the same classifier on the cached training features.
    pipe = load(conditional_workdir)
    extractor = tiny_extractor(evaluation.FID_IMAGE_SIZE)
    (train,), labels = evaluation.labelled_real_features(
        pipe.config, "train", None, [extractor], conditional_workdir / evaluation.CACHE_DIR,
        data_cache=data.cache_root(pipe.config, conditional_workdir))
    assert record["classifier_train_num"] == len(train) == int(np.sum(labels >= 0))
    classifier = consistency.fit(train, labels, 2)
    seeds = [evaluation.batch_seed(0, index) for index in range(2)]
    asked = np.concatenate([pipe.class_ids(None, 4, seed) for seed in seeds])
    images = np.concatenate([pipe.generate(4, spec=spec, seed=seed, batch_size=4) for seed in seeds])
    predicted = consistency.predict(classifier, extractor(images))
    assert record["class_accuracy"] == consistency.accuracy(predicted, asked)

    unconditional = evaluation.evaluate(
        evaluation.EvalRequest(conditional_workdir, num=8, spec=spec.replace(guidance=0.0), batch_size=4,
                               kid_subsets=2), **QUIET)
    assert (unconditional["guidance"], unconditional["class_mode"]) == (0.0, "unconditional")


@pytest.mark.slow
def test_eval_of_one_class_compares_with_that_class_and_prints_the_class_accuracy(conditional_workdir,
                                                                                   tiny_standard_network):
    args = ["--workdir", str(conditional_workdir), "--num", "4", "--steps", "2", "--batch-size", "4"]
    result = run_cli(*args, "--class", "Sunflower", "--guidance", "3", "--split", "all")
    assert result.exit_code == 0, result.output
    assert "class:sunflower, guidance 3" in result.stdout and "(the ceiling); chance 50.0%" in result.stdout
    record = eval_lines(conditional_workdir)[-1]
    assert (record["class_mode"], record["guidance"], record["real_num"]) == ("class:sunflower", 3.0, PER_CLASS)
    assert record["real_val_class_accuracy"] == 1.0 and 0 <= record["class_accuracy"] <= 1

    plain = run_cli(*args)  # no --guidance on a conditional checkpoint: plain conditional sampling
    assert plain.exit_code == 0, plain.output
    assert (eval_lines(conditional_workdir)[-1]["guidance"], eval_lines(conditional_workdir)[-1]["class_mode"]) == (
        1.0, "data-frequency")
    assert_one_line_error(run_cli(*args, "--class", "sunflowr"), "unknown class 'sunflowr'; closest: 'sunflower'")


def test_images_generated_elsewhere_score_as_ddim_eval_scores_them(conditional_workdir, tiny_standard_network,
                                                                    tmp_path):
    """benchmarks.release.generate_eval_samples makes ddim eval's images (on a GPU machine without the FID
    weights); benchmarks.release.fid_of_samples scores them elsewhere: the same FID, KID and class accuracy as ddim
    eval."""
    from ddim.spec import SamplingSpec

    paths = generate_eval_samples.main(
        [str(conditional_workdir), "--num", "10", "--steps", "2", "--batch-size", "4", "--chunk", "6",
         "--out", str(tmp_path / "samples")])
    assert [path.name for path in paths] == ["samples-0.npz", "samples-1.npz"]
    records = fid_of_samples.main(
        [*map(str, paths), "--checkpoint", str(conditional_workdir), "--out", str(tmp_path / "eval"),
         "--num", "8", "10"])
    direct = evaluation.evaluate(evaluation.EvalRequest(conditional_workdir, num=10, spec=SamplingSpec(steps=2),
                                                        batch_size=4), **QUIET)
    scored = records[-1]
    assert [record["num"] for record in records] == [8, 10]
    assert scored["fid"] == pytest.approx(direct["fid"], rel=1e-4)
    assert scored["kid"] == pytest.approx(direct["kid_mean"], rel=1e-4)
    assert scored["class_accuracy"] == direct["class_accuracy"]
    assert scored["class_accuracy_ceiling"] == direct["real_val_class_accuracy"] == 1.0
    assert len((tmp_path / "eval" / "samples_eval.jsonl").read_text().splitlines()) == 2
    # The lines carry the setting the files stored, in ddim eval's fields: a bundle's record reads them as its own.
    from ddim.pretrained.scores import score_from_eval

    score = score_from_eval(scored)
    assert (score.steps, score.sampler, score.spacing, score.guidance) == (2, "ddim", "uniform", 1.0)
    assert (score.split, score.kid, score.real_class_accuracy) == ("val", scored["kid"], 1.0)


def test_samples_saved_as_webp_load_as_the_same_pixels_and_classes(tmp_path):
    """The samples' files with ``--encoding webp`` (benchmarks.release.generate_eval_samples) are lossless:
    benchmarks.release.fid_of_samples reads back the very pixels."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (7, 8, 8, 3), dtype=np.uint8)
    classes = np.arange(7, dtype=np.int32)
    save = samples.save_samples
    webp = save(tmp_path / "webp", "set", images, classes, chunk=4, encoding="webp")
    raw = save(tmp_path / "raw", "set", images, classes, chunk=4)
    assert [path.name for path in webp] == ["set-0.npz", "set-1.npz"]
    load = samples.load_samples
    for paths in (webp, raw):
        loaded_images, loaded_classes = load([str(path) for path in paths])
        np.testing.assert_array_equal(loaded_images, images)
        np.testing.assert_array_equal(loaded_classes, classes)


@pytest.mark.slow
def test_guidance_benchmark_scores_each_scale_resumes_and_draws_the_grid(conditional_workdir, tmp_path, capsys):
    grid = tmp_path / "docs" / "guidance.png"
    args = [str(conditional_workdir), "--out", str(tmp_path / "out"), "--guidance", "0", "2", "--steps", "2",
            "--num", "4", "--batch-size", "4", "--grid", str(grid), "--grid-classes", "sunflower, bluebell",
            "--grid-seeds", "3"]
    rows = guidance.main(args, feature_extractor_factory=tiny_extractor)
    assert sorted(row["guidance"] for row in rows) == [0.0, 2.0]
    for row in rows:
        assert row["num"] == 4 and row["real_num"] == 2 * PER_CLASS and 0 <= row["class_accuracy"] <= 1
    table = capsys.readouterr().out
    assert "| guidance | FID | KID | class accuracy |" in table and "| 2 | " in table and "chance 50.0%" in table
    with Image.open(grid) as image:
        assert image.size == (3 * 18 + 2, 2 * 18 + 2)  # 3 seeds x 2 classes of 16px, 2px padding
    assert guidance.best_guidance(rows) == min(rows, key=lambda row: row["fid"])["guidance"]

    lines = (tmp_path / "out" / guidance.RESULTS).read_text().splitlines()
    assert len(lines) == 2
    guidance.main(args, feature_extractor_factory=tiny_extractor)  # everything done: nothing appended
    assert (tmp_path / "out" / guidance.RESULTS).read_text().splitlines() == lines


def test_guidance_benchmark_draws_the_grid_alone_with_the_sampler_asked(conditional_workdir, tmp_path):
    """No scale to score: the grid only, at --grid-guidance, each tile what that sampler makes of its seed."""
    from ddim.sampling import load
    from ddim.spec import SamplingSpec

    grid = tmp_path / "grid.png"
    base = [str(conditional_workdir), "--out", str(tmp_path / "out"), "--steps", "2", "--grid", str(grid),
            "--grid-classes", "sunflower,bluebell", "--grid-seeds", "2", "--batch-size", "4"]
    with pytest.raises(SystemExit):  # nothing to score and no scale for the grid
        guidance.main([*base, "--guidance"])
    rows = guidance.main([*base, "--guidance", "--grid-guidance", "2", "--sampler", "dpmpp-2m", "--spacing", "logsnr"])
    assert rows == [] and not (tmp_path / "out" / guidance.RESULTS).exists()
    pipe = load(str(conditional_workdir))
    tile = pipe.generate(latents=pipe.latents(1, seed=1), classes=np.array([pipe.class_space.class_id("bluebell")]),
                         spec=SamplingSpec(steps=2, sampler="dpmpp-2m", spacing="logsnr", guidance=2.0))[0]
    with Image.open(grid) as opened:
        image = np.asarray(opened.convert("RGB"))
    size = tile.shape[0]
    np.testing.assert_allclose(image[size + 4:2 * size + 4, size + 4:2 * size + 4], tile, atol=1)
    with pytest.raises(AssertionError):  # the grid's sampler, not ddim's
        ddim_tile = pipe.generate(latents=pipe.latents(1, seed=1), spec=SamplingSpec(steps=2, guidance=2.0),
                                  classes=np.array([pipe.class_space.class_id("bluebell")]))[0]
        np.testing.assert_allclose(ddim_tile, tile, atol=1)


def test_guidance_benchmark_takes_a_bundled_model_by_name(conditional_workdir, tmp_path, monkeypatch, capsys):
    from ddim.pretrained import ENV, export_checkpoint

    export_checkpoint(conditional_workdir, "tinyclasses", root=tmp_path / "bundles")
    monkeypatch.setenv(ENV, str(tmp_path / "bundles"))
    options = ["--out", str(tmp_path / "out"), "--guidance", "1", "--steps", "2", "--num", "4", "--batch-size", "4"]
    rows = guidance.main(["pretrained:tinyclasses", *options], feature_extractor_factory=tiny_extractor)
    assert [(row["guidance"], row["num"]) for row in rows] == [(1.0, 4)]
    with pytest.raises(SystemExit, match=r"^error: no bundled model named 'flowers32' \(available: tinyclasses\)"):
        guidance.main(["pretrained:flowers32", *options], feature_extractor_factory=tiny_extractor)


def test_benchmarks_sharing_an_eval_root_reuse_an_identical_measurement(conditional_workdir, tmp_path, monkeypatch):
    """benchmarks.studies.curve's score of a checkpoint is benchmarks.studies.guidance's guidance 1 of it: measured
    once, read back the second time; a different measurement (another guidance, batch size or checkpoint) is not
    taken for it."""
    from ddim.spec import SamplingSpec

    eval_root, step_dir = tmp_path / "eval", conditional_workdir / "checkpoints" / "2"
    curve.main(["score", "--workdir", str(conditional_workdir), "--csv", str(tmp_path / "fid.csv"), "--every", "2",
                "--num", "4", "--eval-root", str(eval_root)], feature_extractor_factory=tiny_extractor)
    [measured] = [json.loads(line) for line in (eval_root / "eval.jsonl").read_text().splitlines()]
    assert (measured["batch_size"], measured["guidance"]) == (64, 1.0)

    spec = SamplingSpec(steps=20, sampler="ddim", spacing="uniform")
    assert common.earlier_record(step_dir, spec, 4, eval_root) == measured
    assert common.earlier_record(step_dir, spec.replace(guidance=1.0), 4, eval_root) == measured  # none is 1
    for different in ((step_dir, spec.replace(guidance=2.0), 4, {}), (step_dir, spec, 8, {}),
                      (step_dir, spec.replace(steps=10), 4, {}), (step_dir, spec, 4, {"batch_size": 4}),
                      (step_dir, spec, 4, {"seed": 1}), (conditional_workdir, spec, 4, {})):
        source, other_spec, num, options = different
        assert common.earlier_record(source, other_spec, num, eval_root, **options) is None, different

    monkeypatch.setattr("ddim.evaluation.evaluate", lambda *a, **k: pytest.fail("measured again"))
    [row] = guidance.main([str(step_dir), "--out", str(eval_root), "--guidance", "1", "--num", "4"],
                       feature_extractor_factory=tiny_extractor)
    assert row["fid"] == measured["fid"] and row["class_accuracy"] == measured["class_accuracy"]
