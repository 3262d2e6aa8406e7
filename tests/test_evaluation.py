"""Sample-quality evaluation (ddim/evaluation/ and ``ddim eval``): feature extraction, the evaluation job end to
end, its request, the real-feature cache and the records.

The tests download nothing, and Keras' InceptionV3 weights are not on PyPI, so the end-to-end tests
inject a *small, randomly initialised* Keras network (2048-d output) in place of
InceptionV3, by monkeypatching ``FeatureExtractor.inception`` (the only place the
CLI builds its network) or by passing ``feature_extractor_factory``. Everything
else runs for real: weights-file resolution, resizing and ``preprocess_input``
in TensorFlow, sampling the checkpoint, the real-feature cache, KID/FID and
eval.jsonl. tests/test_evaluation_weights.py checks that without a weights file the
CLI refuses to run (one error line, no traceback) instead of falling back to random weights.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from ddim import evaluation
from tests.eval_helpers import MOCK_EXAMPLES, eval_lines, mock_data, run_cli
from tests.eval_helpers import smoke_workdir  # noqa: F401  (a fixture)
from tests.tiny_fid import tiny_extractor, tiny_network  # noqa: F401  (other tests import them from here)

SMOKE = "smoke"


@pytest.fixture
def random_inception(monkeypatch):
    """Replace InceptionV3 by the tiny random network where the CLI builds it; records the weights paths."""
    calls = []

    def fake_inception(cls, image_size, weights, batch_size=32, identity=None):
        calls.append((image_size, Path(weights)))
        return tiny_extractor(image_size, batch_size)

    monkeypatch.setattr(evaluation.KerasFeatureExtractor, "inception", classmethod(fake_inception))
    return calls


# --------------------------------------------------------------------------- feature extraction


def test_feature_extractor_batches_resizes_and_accepts_grayscale():
    extractor = tiny_extractor(75, batch_size=3)
    images = np.random.default_rng(0).integers(0, 256, size=(7, 16, 16, 3), dtype=np.uint8)
    features = extractor(images)
    assert features.shape == (7, 2048) and features.dtype == np.float32
    np.testing.assert_allclose(tiny_extractor(75, batch_size=64)(images), features, rtol=1e-5, atol=1e-6)
    gray = images[..., :1]
    np.testing.assert_allclose(extractor(gray), extractor(np.repeat(gray, 3, axis=-1)), rtol=1e-6)
    with pytest.raises(ValueError, match="uint8"):
        extractor(images.astype(np.float32))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # Keras' own saver
def test_inception_loads_a_keras_h5_weights_file(tmp_path):
    """The real InceptionV3 architecture at 75px, with a legacy .h5 file saved from a random init:
    FeatureExtractor.inception must load exactly those weights (not start from random ones)."""
    h5py = pytest.importorskip("h5py")
    try:
        from keras.src.legacy.saving import legacy_h5_format
    except ImportError:  # pragma: no cover - Keras moved its private saver
        pytest.skip("Keras' legacy .h5 saver is not available")
    _, keras = evaluation.tf_keras()
    source = keras.applications.InceptionV3(include_top=False, weights=None, pooling="avg", input_shape=(75, 75, 3))
    path = tmp_path / evaluation.WEIGHTS_FILE
    with h5py.File(path, "w") as file:
        legacy_h5_format.save_weights_to_hdf5_group(file, source)
    extractor = evaluation.KerasFeatureExtractor.inception(75, path, batch_size=2)
    assert extractor.identity.endswith(evaluation.file_md5(path)) and "75px" in extractor.identity
    images = np.random.default_rng(1).integers(0, 256, size=(2, 16, 16, 3), dtype=np.uint8)
    tf = evaluation.tf_keras()[0]
    x = keras.applications.inception_v3.preprocess_input(
        np.array(tf.image.resize(images.astype(np.float32), [75, 75], antialias=True))
    )
    expected = np.asarray(source(x, training=False))
    np.testing.assert_allclose(extractor(images), expected, rtol=1e-4, atol=1e-5)


def test_a_damaged_weights_file_is_one_clear_error(tmp_path):
    path = tmp_path / evaluation.WEIGHTS_FILE
    path.write_bytes(b"truncated download")
    with pytest.raises(evaluation.EvaluationError, match="cannot load InceptionV3 weights from"):
        evaluation.KerasFeatureExtractor.inception(75, path)


def test_generated_features_go_batch_by_batch_with_distinct_reproducible_seeds():
    calls = []

    def generate(count, seed):
        calls.append((count, seed))
        return np.random.default_rng(seed).integers(0, 256, size=(count, 8, 8, 3), dtype=np.uint8)

    kid_net, fid_net = tiny_extractor(75), tiny_extractor(299)
    features, (mu, sigma) = evaluation.generated_features(generate, 10, 4, 7, kid_net, fid_net)
    assert [count for count, _ in calls] == [4, 4, 2]
    seeds = [seed for _, seed in calls]
    assert len(set(seeds)) == 3 and seeds == [evaluation.batch_seed(7, i) for i in range(3)]
    assert features.shape == (10, 2048)
    images = np.concatenate([generate(count, seed) for count, seed in list(calls)])
    np.testing.assert_allclose(features, kid_net(images), rtol=1e-5, atol=1e-6)
    ref_mu, ref_sigma = np.mean(fid_net(images), 0), np.cov(fid_net(images).astype(np.float64), rowvar=False)
    np.testing.assert_allclose(mu, ref_mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sigma, ref_sigma, rtol=1e-4, atol=1e-7)


# --------------------------------------------------------------------------- the evaluation job


@pytest.mark.slow
def test_eval_cli_end_to_end_writes_a_json_line_and_caches_real_features(
    smoke_workdir, tmp_path, monkeypatch, random_inception
):
    weights = tmp_path / evaluation.WEIGHTS_FILE
    weights.write_bytes(b"a stand-in: the test network is random")
    # 8 images in batches of 4 and 2 steps of DPM-Solver++(2M) on the log-SNR grid.
    args = ["--workdir", str(smoke_workdir), "--num", "8", "--steps", "2", "--batch-size", "4"]
    args += ["--sampler", "dpmpp-2m", "--spacing", "logsnr"]
    args += ["--real-num", "12", "--seed", "3", "--inception-weights", str(weights), "--compilation-cache", "off"]
    args += ["--fid-net", "keras", "--kid-net", "keras"]  # the Keras example's protocol
    before = len(eval_lines(smoke_workdir))
    with mock_data():
        result = run_cli(*args)
    assert result.exit_code == 0, result.output
    assert {size for size, _ in random_inception} == {75, 299}
    assert all(path == weights for _, path in random_inception)
    assert "not the official Keras" in result.stderr  # the stand-in file's md5 is not Keras'
    for text in ("KID (Keras, 75px)", "FID (Keras, 299px)", "checkpoint", "2 steps of dpmpp-2m (logsnr spacing)",
                 str(smoke_workdir / evaluation.EVAL_FILE)):
        assert text in result.stdout

    lines = eval_lines(smoke_workdir)
    assert len(lines) == before + 1
    record = lines[-1]
    assert record["step"] == 6 and record["checkpoint"].endswith("checkpoints/6")
    assert (record["num"], record["real_num"], record["steps"], record["eta"]) == (8, 12, 2, 0.0)
    assert (record["sampler"], record["spacing"]) == ("dpmpp-2m", "logsnr")
    assert record["split"] == "val" and record["split_expression"] == "train[40%:50%]"
    assert (record["kid_image_size"], record["fid_image_size"]) == (75, 299)
    assert record["kid_subset_size"] == 8 and record["kid_subsets"] == 100
    assert math.isfinite(record["kid_mean"]) and record["kid_std"] >= 0
    assert math.isfinite(record["fid"]) and record["fid"] >= 0 and record["wall_time_s"] > 0
    assert record["kid_feature_net"] == "test-random-net@75" and (record["fid_net"], record["kid_net"]) == ("keras",) * 2
    assert len(list((smoke_workdir / evaluation.CACHE_DIR).glob("real_*.npz"))) >= 2

    # Second run: the real features come from the cache (loading the dataset would fail), same scores.
    from ddim import data

    def no_dataset(*args, **kwargs):
        raise AssertionError("the real images should not be loaded again")

    monkeypatch.setattr(data, "load_split", no_dataset)
    again = run_cli(*args)
    assert again.exit_code == 0, again.output
    repeat = eval_lines(smoke_workdir)[-1]
    assert (repeat["kid_mean"], repeat["kid_std"], repeat["fid"]) == pytest.approx(
        (record["kid_mean"], record["kid_std"], record["fid"]), rel=1e-5, abs=1e-9
    )


def test_evaluate_checkpoint_with_an_injected_factory_and_the_train_split(smoke_workdir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with mock_data():
        result = evaluation.evaluate_checkpoint(
            smoke_workdir / "checkpoints" / "6",
            num=8,
            steps=2,
            batch_size=4,
            split="train",
            feature_extractor_factory=tiny_extractor,
            workdir=out,
            kid_subsets=5,
            log=lambda message: None,
            show_progress=False,
        )
    assert result["split"] == "train" and result["real_num"] == MOCK_EXAMPLES
    assert result["kid_subset_size"] == 8 and result["eval_file"] == str(out / evaluation.EVAL_FILE)
    assert eval_lines(out)[-1]["fid"] == result["fid"]
    assert (result["sampler"], result["spacing"]) == ("ddim", "uniform")
    assert "eval_file" not in eval_lines(out)[-1]
    assert eval_lines(out)[-1]["guidance"] is None  # the whole SamplingSpec is recorded
    from ddim import onednn

    kernels = onednn.kernels("cpu", "float32")  # what ran the sampled network's convolutions
    assert {key: eval_lines(out)[-1][key] for key in kernels} == kernels
    assert not {"class_mode", "class_accuracy", "real_val_class_accuracy", "chance"} & set(result)  # unconditional


def test_an_eval_request_is_checked_when_made():
    from ddim.spec import SamplingSpec

    request = evaluation.EvalRequest("run", num=8, spec=SamplingSpec(steps=2, sampler="dpmpp-2m"))
    assert request.spec == SamplingSpec(steps=2, sampler="dpmpp-2m") and request.networks == ("standard",)
    assert evaluation.EvalRequest("run", fid_net="keras").networks == ("keras", "standard")
    for fields, message in [
        ({"num": 1}, "number of generated images must be >= 2"),
        ({"fid_net": "clip"}, "unknown fid_net 'clip' (choose from standard, keras)"),
        ({"split": "test"}, "unknown split 'test' (choose from val, train, all)"),
        ({"real_num": 1}, "number of real images must be >= 2"),
        ({"batch_size": 0}, "batch size must be >= 1"),
        ({"kid_subset_size": 1}, "KID needs >= 1 subset of >= 2 images"),
    ]:
        with pytest.raises(evaluation.EvaluationError, match=re.escape(message)):
            evaluation.EvalRequest("run", **fields)
    with pytest.raises(TypeError, match="SamplingSpec"):
        evaluation.EvalRequest("run", spec={"steps": 2})
    # The loose keywords of evaluate_checkpoint: kept as changes to the model's defaults (resolved once the
    # model is loaded), or merged into a given spec; a bad one is an EvaluationError when the request is made.
    loose = evaluation.EvalRequest.of("run", steps=3, spacing="karras", eta=0.5, weights="w.h5", num=4)
    assert loose.spec is None and loose.inception_weights == "w.h5"
    assert loose.spec_changes == (("steps", 3), ("spacing", "karras"), ("eta", 0.5))
    # As the job resolves them (ddim.evaluation.job): against the loaded model's defaults, here a bundle's.
    from ddim.config import ModelConfig
    from ddim.spec import SamplingRules

    rules = SamplingRules.of(ModelConfig(), defaults=SamplingSpec(steps=20, guidance=2.0))
    assert rules.resolve(loose.spec, **dict(loose.spec_changes)) == SamplingSpec(
        steps=3, spacing="karras", eta=0.5, guidance=2.0)
    with pytest.raises(evaluation.EvaluationError, match="steps"):
        evaluation.EvalRequest.of("run", steps=0)
    with pytest.raises(evaluation.EvaluationError, match="unknown sampler 'euler'"):
        evaluation.EvalRequest.of("run", sampler="euler")


def test_the_work_directory_of_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    assert evaluation.workdir_of(run / "checkpoints" / "6") == run
    assert evaluation.workdir_of(run / "best" / "6") == run
    assert evaluation.workdir_of(tmp_path / "copied" / "6") == tmp_path / "copied"  # a step directory on its own


def test_importing_evaluation_imports_no_jax_or_tensorflow():
    import subprocess
    import sys

    code = ("import sys, ddim.evaluation, ddim.evaluation.fid_weight_names; "
            "print(sorted(m for m in ('jax', 'flax', 'tensorflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cheap_kid_for_training(smoke_workdir):
    from ddim.sampling import load

    pipe = load(smoke_workdir)
    extractor = tiny_extractor(evaluation.KID_IMAGE_SIZE)
    with mock_data():
        (real,) = evaluation.real_features(pipe.config, "val", 10, [extractor], cache_dir=None)
        from ddim.data import load_split

        images = load_split(pipe.config, evaluation.split_expression(pipe.config, "val"))
    assert real.shape == (10, 2048)
    (given,) = evaluation.real_features(pipe.config, "val", 10, [extractor], cache_dir=None, images=images)
    np.testing.assert_array_equal(given, real)
    mean, std = evaluation.cheap_kid(
        pipe.model, pipe.variables, real, extractor, num_images=8, steps=2, batch_size=4, num_subsets=3
    )
    assert math.isfinite(mean) and std >= 0
    assert (mean, std) == evaluation.cheap_kid(
        pipe.model, pipe.variables, real, extractor, num_images=8, steps=2, batch_size=4, num_subsets=3
    )
    from ddim.spec import SamplingSpec

    assert (mean, std) == evaluation.cheap_kid(
        pipe.model, pipe.variables, real, extractor, num_images=8, spec=SamplingSpec(steps=2), batch_size=4,
        num_subsets=3,
    )


def test_real_cache_key_depends_on_what_the_features_depend_on():
    from ddim.config import load_config

    config = load_config(SMOKE)
    key = evaluation.real_cache_key(config, "val", None, "net@75")
    assert key == evaluation.real_cache_key(load_config(SMOKE), "val", None, "net@75")
    assert key != evaluation.real_cache_key(config, "train", None, "net@75")
    assert key != evaluation.real_cache_key(config, "val", 100, "net@75")
    assert key != evaluation.real_cache_key(config, "val", None, "net@299")
    assert key != evaluation.real_cache_key(load_config(SMOKE, ["model.image_size=32"]), "val", None, "net@75")
    assert key != evaluation.real_cache_key(load_config(SMOKE, ["data.val_split=train[50%:]"]), "val", None, "net@75")


def test_records_are_appended_and_read_back_skipping_a_line_cut_short(tmp_path):
    from ddim.workdir.records import append_record, read_records

    path = tmp_path / "eval.jsonl"
    assert read_records(path) == []  # no file yet: no records
    append_record(path, {"step": 1, "fid": 90.5})
    with open(path, "a") as file:  # a kill in the middle of an append, then a line that is not a record
        file.write('{"step": 2, "fi\n[1, 2]\n\n')
    append_record(path, {"step": 3, "fid": 80.25})
    assert read_records(path) == [{"step": 1, "fid": 90.5}, {"step": 3, "fid": 80.25}]
