"""Bundled models' format (ddim/pretrained/): export -> load round trip, the record, the hash check, float16
weights, format 1, the registry and the wheel's package data; built on the tiny trained checkpoint of conftest."""

from __future__ import annotations

import datetime
import fnmatch
import hashlib
import json
import shutil
import sys

import numpy as np
import pytest

import ddim
from ddim.errors import InputError
from ddim.pretrained import (
    ENV,
    MAX_BYTES,
    PACKAGE_ROOT,
    PretrainedError,
    available,
    bundled_root,
    default_model,
    export_checkpoint,
    find,
    read_manifest,
)
from ddim.pretrained import bundle as bundle_module
from ddim.pretrained.export import fid_from_eval_file
from tests.conftest import REPO
from tests.pretrained_helpers import NAME, copy_bundles
from tests.pretrained_helpers import bundles, use_bundles  # noqa: F401  (fixtures)
from tests.test_cli import assert_one_line_error, invoke

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_export_then_load_gives_the_checkpoints_pixels_bit_for_bit(trained_workdir, use_bundles):
    from_checkpoint = ddim.load(trained_workdir)
    bundled = ddim.load(f"pretrained:{NAME}")
    assert bundled.pretrained == NAME and bundled.step == from_checkpoint.step == 6
    assert bundled.path == use_bundles / NAME and bundled.config.model == from_checkpoint.config.model
    for ours, theirs in zip(*(map(np.asarray, ddim_leaves(p.variables)) for p in (bundled, from_checkpoint))):
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    for kwargs in ({"steps": 2, "seed": 3}, {"steps": 3, "seed": 0, "sampler": "dpmpp-2m", "eta": None}):
        np.testing.assert_array_equal(bundled.generate(3, **kwargs), from_checkpoint.generate(3, **kwargs))


def ddim_leaves(variables):
    import jax

    return jax.tree.leaves(variables)


def test_the_bundle_holds_safetensors_weights_a_manifest_and_a_factual_record(bundles, trained_workdir):
    manifest = read_manifest(bundles / NAME)
    assert sorted(p.name for p in (bundles / NAME).iterdir()) == ["model.json", "weights.safetensors"]
    data = (bundles / NAME / "weights.safetensors").read_bytes()
    assert manifest.sha256 == hashlib.sha256(data).hexdigest() and manifest.bytes == len(data) <= MAX_BYTES
    from safetensors.numpy import load

    keys = load(data).keys()
    assert {key.split("/")[0] for key in keys} == {"params", "batch_stats"}
    assert "batch_stats/normalizer/mean" in keys  # the normaliser's statistics travel with the weights
    assert manifest.parameters == sum(v.size for k, v in load(data).items() if k.startswith("params/"))
    record = manifest.record
    assert record["config"] == "smoke" and record["steps"] == 6 and record["images_seen"] == 6 * 8
    assert record["hardware"] == "a 2-core CPU" and record["recipe"] == "smoke + tests' TINY"
    assert record["fid"] is None  # nothing measured it: nothing is recorded
    assert record["checkpoint"] == "checkpoints/6"  # relative: the training machine's paths are not kept
    assert datetime.date.fromisoformat(record["checkpoint_date"]) <= datetime.date.fromisoformat(record["exported"])
    # The training machine's paths are not shipped.
    assert manifest.config.data.data_dir == manifest.config.data.cache_dir == ""


def test_the_fid_comes_from_eval_jsonl_or_is_passed_in_with_its_protocol(trained_workdir, tmp_path):
    step_dir = trained_workdir / "checkpoints" / "6"
    base = {"step": 6, "config": "smoke", "num": 100, "steps": 20, "eta": 0.0, "seed": 0, "real_num": 50,
            "split": "val", "fid_feature_net": "fid-inception", "time": "t"}
    lines = [
        {**base, "checkpoint": str(step_dir), "fid": 30.0, "sampler": "ddim", "spacing": "uniform"},
        {**base, "checkpoint": str(step_dir), "fid": 20.0, "sampler": "dpmpp-2m", "spacing": "logsnr"},
        {**base, "checkpoint": "/elsewhere/checkpoints/6", "fid": 10.0, "sampler": "ddim", "spacing": "uniform"},
        {**base, "checkpoint": str(step_dir), "fid": 5.0, "step": 4, "sampler": "ddim", "spacing": "uniform"},
        {**base, "checkpoint": str(step_dir), "fid": 4.0, "config": "other", "sampler": "ddim"},
    ]
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    # This step directory's line with ddim sample's default sampler, not another run's, step's or config's.
    found = fid_from_eval_file(eval_file, step_dir, 6, "smoke")
    assert found["value"] == 30.0 and found["eval"] == lines[0]
    assert "100 samples of 20 ddim steps" in found["protocol"] and "50 real images (val split)" in found["protocol"]
    assert fid_from_eval_file(eval_file, step_dir, 5, "smoke") is None
    assert fid_from_eval_file(tmp_path / "missing.jsonl", step_dir, 6, "smoke") is None

    manifest = export_checkpoint(trained_workdir, "from-eval", root=tmp_path / "b", eval_file=eval_file)
    assert manifest.record["fid"]["value"] == 30.0
    manifest = export_checkpoint(trained_workdir, "given", root=tmp_path / "b", fid=28.1,
                                 fid_protocol="5000 samples, 20 steps, standard FID Inception")
    assert manifest.record["fid"] == {"value": 28.1, "protocol": "5000 samples, 20 steps, standard FID Inception",
                                      "eval": None}
    with pytest.raises(InputError, match="--fid-protocol"):
        export_checkpoint(trained_workdir, "bare", root=tmp_path / "b", fid=28.1)
    assert not (tmp_path / "b" / "bare").exists()


def test_changed_weights_are_refused_by_their_sha256(bundles, tmp_path, monkeypatch):
    root = copy_bundles(bundles, tmp_path)
    weights = root / NAME / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    monkeypatch.setenv(ENV, str(root))
    with pytest.raises(PretrainedError, match=r"do not match their SHA-256 .*damaged or was changed"):
        ddim.load(f"pretrained:{NAME}")
    assert_one_line_error(invoke("sample", "--pretrained", NAME, "--out", tmp_path / "out"), "SHA-256")


def test_bad_bundles_and_exports_are_one_line_errors(bundles, trained_workdir, tmp_path, monkeypatch):
    root = copy_bundles(bundles, tmp_path)
    manifest_file = root / NAME / "model.json"
    values = json.loads(manifest_file.read_text())
    manifest_file.write_text(json.dumps({**values, "format": 99}))
    with pytest.raises(PretrainedError, match=r"not a bundled-model manifest of format 1 or 2 \(format 99\)"):
        find(NAME, root)
    manifest_file.write_text(json.dumps({**values, "name": "other"}))
    with pytest.raises(PretrainedError, match="names the model 'other'"):
        find(NAME, root)
    del values["sha256"]
    manifest_file.write_text(json.dumps(values))
    with pytest.raises(PretrainedError, match="lacks the field 'sha256'"):
        find(NAME, root)

    with pytest.raises(PretrainedError, match="already exists; use --overwrite"):
        export_checkpoint(trained_workdir, NAME, root=bundles)
    with pytest.raises(PretrainedError, match="is not a model name"):
        export_checkpoint(trained_workdir, "Flowers 32", root=tmp_path)
    monkeypatch.setattr(bundle_module, "MAX_BYTES", 1000)
    with pytest.raises(PretrainedError, match="over the 0.001 MB a bundled model may take"):
        export_checkpoint(trained_workdir, "big", root=tmp_path / "small")
    assert not (tmp_path / "small" / "big").exists()
    with pytest.raises(InputError, match="a bundled model has one step"):
        ddim.load(f"pretrained:{NAME}", step=4)


def test_weights_stored_in_float16_take_half_the_bytes_and_load_as_float32(trained_workdir, bundles, tmp_path,
                                                                          monkeypatch):
    from safetensors.numpy import load

    half = export_checkpoint(trained_workdir, NAME, root=tmp_path / "half", hardware="a 2-core CPU",
                             recipe="smoke + tests' TINY", weights_dtype="float16")
    exact = read_manifest(bundles / NAME)
    data = half.weights.read_bytes()
    stored = load(data)
    assert {array.dtype for array in stored.values()} == {np.dtype("float16")}  # the file holds float16
    assert half.weights_dtype == "float16" and exact.weights_dtype == "float32"
    assert half.sha256 == hashlib.sha256(data).hexdigest() != exact.sha256 and half.bytes == len(data)
    assert half.bytes < 0.55 * exact.bytes and half.parameters == exact.parameters
    assert half.record == {**exact.record, "exported": half.record["exported"]}
    monkeypatch.setenv(ENV, str(tmp_path / "half"))
    pipe = ddim.load(f"pretrained:{NAME}")
    exact_values = load(exact.weights.read_bytes())
    flat = {"/".join(path): leaf for path, leaf in _flat(pipe.variables)}
    assert set(flat) == set(exact_values)
    for key, value in flat.items():  # float32 arrays for the network, the float16 rounding of the exact weights
        assert np.asarray(value).dtype == np.float32
        np.testing.assert_array_equal(np.asarray(value), exact_values[key].astype(np.float16).astype(np.float32))
    assert pipe.generate(2, steps=2, seed=0).shape == (2, 16, 16, 3)

    damaged = bytearray(data)
    damaged[-2] ^= 1
    half.weights.write_bytes(bytes(damaged))
    with pytest.raises(PretrainedError, match="do not match their SHA-256"):
        ddim.load(f"pretrained:{NAME}")


def _flat(variables):
    from flax import traverse_util

    return traverse_util.flatten_dict(variables).items()


def test_a_bundle_is_stored_again_in_float16_with_its_config_and_record(bundles, tmp_path):
    from ddim.pretrained.bundle import store_as

    exact = read_manifest(bundles / NAME)
    half = store_as(exact, "float16", tmp_path)
    assert half.directory == tmp_path / NAME and half.weights_dtype == "float16"
    assert half.record == exact.record and half.config == exact.config
    assert half.sha256 == hashlib.sha256(half.weights.read_bytes()).hexdigest()
    again = store_as(half, "float16")  # in place: the same values, the same file
    assert again.sha256 == half.sha256 and again.directory == half.directory
    with pytest.raises(PretrainedError, match="float32 or float16, not 'float64'"):
        store_as(exact, "float64", tmp_path / "other")
    # What the rounding did to the figures is said beside the stored weights.
    from ddim.pretrained.bundle import write_record
    from ddim.pretrained.render import facts

    noted = write_record(half, {**half.record, "weights_note": "FID level with the float32 weights"})
    weights = dict(facts(noted))["weights"]
    assert f"in float16, sha256 {noted.sha256}; FID level with" in weights


def test_float16_refuses_weights_beyond_its_range(bundles, tmp_path):
    from ddim.pretrained.bundle import write_bundle

    exact = read_manifest(bundles / NAME)
    variables = {"params": {"dense": {"kernel": np.array([1.0, 1e5], np.float32)}}}
    with pytest.raises(PretrainedError, match="beyond the range of float16"):
        write_bundle(tmp_path, "big", exact.config, variables, {}, weights_dtype="float16")
    assert not (tmp_path / "big").exists()


def test_bundles_of_format_1_still_load_as_float32(bundles, trained_workdir, tmp_path, monkeypatch):
    """A manifest written before float16 storage (format 1, no weights_dtype) is read as the float32 bundle it is."""
    root = copy_bundles(bundles, tmp_path)
    manifest_file = root / NAME / "model.json"
    values = json.loads(manifest_file.read_text())
    assert values["format"] == 2 and values["weights_dtype"] == "float32"
    old = {key: value for key, value in values.items() if key != "weights_dtype"}
    manifest_file.write_text(json.dumps({**old, "format": 1}))
    assert find(NAME, root).weights_dtype == "float32"
    monkeypatch.setenv(ENV, str(root))
    np.testing.assert_array_equal(ddim.load(f"pretrained:{NAME}").generate(2, steps=2, seed=1),
                                  ddim.load(trained_workdir).generate(2, steps=2, seed=1))
    manifest_file.write_text(json.dumps({**values, "weights_dtype": "int8"}))
    with pytest.raises(PretrainedError, match="weights_dtype 'int8' is not one of float32, float16"):
        find(NAME, root)
    manifest_file.write_text(json.dumps(old))  # format 2 must name its dtype
    with pytest.raises(PretrainedError, match="lacks the field 'weights_dtype'"):
        find(NAME, root)


def test_the_registry_scans_a_directory_of_exported_models(bundles, tmp_path, monkeypatch):
    root = copy_bundles(bundles, tmp_path)
    (root / "notes").mkdir()  # a folder without model.json is no model
    (root / ".tiny16.tmp").mkdir()  # nor is an unfinished export
    shutil.copytree(root / NAME, root / "another")
    manifest_file = root / "another" / "model.json"
    manifest_file.write_text(json.dumps({**json.loads(manifest_file.read_text()), "name": "another"}))
    assert [m.name for m in available(root)] == ["another", NAME]
    assert default_model(root).name == "another"  # the first by name
    with pytest.raises(PretrainedError, match=r"no bundled model named 'flowers32' \(available: another, tiny16\)"):
        find("flowers32", root)
    assert available(tmp_path / "nowhere") == [] and default_model(tmp_path / "nowhere") is None
    monkeypatch.setenv(ENV, str(root))
    assert bundled_root() == root
    monkeypatch.delenv(ENV)
    assert bundled_root() == PACKAGE_ROOT


def test_the_bundle_files_are_package_data_of_the_wheel(bundles):
    """pyproject's package-data patterns take every file of a bundle (pip wheel . lists them too)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["ddim.pretrained"]
    assert PACKAGE_ROOT == REPO / "ddim" / "pretrained"
    for path in (bundles / NAME).iterdir():
        relative = f"{NAME}/{path.name}"
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative
