"""Bundled models (ddim/pretrained/): export -> load round trip, hash check, registry, CLI flags and fallback.

Built on the tiny trained checkpoint of conftest; the last test runs over every
model really bundled in the package (flowers64, the default, and flowers32).
"""

from __future__ import annotations

import datetime
import fnmatch
import hashlib
import json
import shutil
import sys

import numpy as np
import pytest
from PIL import Image

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
from tests.test_cli import assert_one_line_error, invoke

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

NAME = "tiny16"


@pytest.fixture(scope="module")
def bundles(trained_workdir, tmp_path_factory):
    """A directory of bundled models holding ``tiny16``, exported from the tiny checkpoint (step 6)."""
    root = tmp_path_factory.mktemp("bundles")
    export_checkpoint(trained_workdir, NAME, root=root, hardware="a 2-core CPU", recipe="smoke + tests' TINY")
    return root


@pytest.fixture
def use_bundles(bundles, monkeypatch):
    """Point the registry (``pretrained:NAME``, ``--pretrained``, the fallback) at ``bundles``."""
    monkeypatch.setenv(ENV, str(bundles))
    return bundles


def copy_bundles(bundles, tmp_path):
    root = tmp_path / "bundles"
    shutil.copytree(bundles, root)
    return root


# --- the format and the round trip -------------------------------------------------------------------


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


# --- the command line ----------------------------------------------------------------------------------


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


# --- the models really bundled in the package ------------------------------------------------------------


def test_the_package_bundles_the_readmes_models_and_the_best_is_the_default(tmp_path):
    """The README's quick start samples ``flowers64`` without a run; the cases below run once per bundled model."""
    assert [manifest.name for manifest in available(PACKAGE_ROOT)][:2] == ["flowers64", "flowers32"]
    assert default_model(PACKAGE_ROOT).name == "flowers64"
    for name in ("zeta", "flowers64", "alpha"):  # elsewhere: the preferred model first, the others by name
        shutil.copytree(PACKAGE_ROOT / "flowers64", tmp_path / name)
        manifest = json.loads((tmp_path / name / "model.json").read_text())
        (tmp_path / name / "model.json").write_text(json.dumps({**manifest, "name": name}))
    assert [manifest.name for manifest in available(tmp_path)] == ["flowers64", "alpha", "zeta"]
    shutil.rmtree(tmp_path / "flowers64")
    assert default_model(tmp_path).name == "alpha"


@pytest.mark.parametrize("name", [manifest.name for manifest in available(PACKAGE_ROOT)])
def test_every_bundled_model_loads_by_its_hash_and_samples(name, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    manifest = find(name, PACKAGE_ROOT)
    assert hashlib.sha256(manifest.weights.read_bytes()).hexdigest() == manifest.sha256
    assert manifest.bytes == manifest.weights.stat().st_size <= MAX_BYTES
    record = manifest.record
    assert record["steps"] > 0 and record["images_seen"] == record["steps"] * record["batch_size"]
    assert record["hardware"], "a shipped model says what it was trained on"
    assert [score for score in record["scores"] if score["fid"] is not None], "a shipped model has its FID"
    assert record["recipe"].startswith(("ddim train ", "ddim distill ", "python -m benchmarks.release.rebuild ")) \
        and record["wall_time"], "and says how to train it again"
    pipe = ddim.load(f"pretrained:{name}")
    # A distilled student samples with its own step count only; a diffusion model with any.
    images = pipe.generate(2, steps=manifest.config.model.distilled_steps or 2, seed=0)
    size = manifest.config.model.image_size
    assert images.shape == (2, size, size, manifest.config.model.channels) and images.dtype == np.uint8
    assert images.std() > 0


def test_every_bundled_class_model_samples_at_its_best_measured_guidance_by_default():
    from ddim.pretrained.bundle_record import BundleRecord

    for manifest in available(PACKAGE_ROOT):  # a model replaced by an export has no defaults until measured again
        defaults = manifest.record["defaults"]
        assert manifest.config.model.class_conditional and defaults["guidance"] > 0
        record = BundleRecord.from_dict(manifest.record)
        assert record.find_score(1000, record.default_setting).fid > 0, manifest.name


def test_sample_of_a_bundled_class_model_tips_its_best_guidance_only_when_asked_another(tmp_path):
    result = invoke("sample", "--pretrained", "flowers32", "--steps", 1, "--num", 1, "--out", tmp_path / "a", "--no-grid")
    assert result.exit_code == 0, result.output
    assert "tip: flowers32" not in result.output  # its default is its best scale
    result = invoke("sample", "--pretrained", "flowers32", "--steps", 1, "--num", 1, "--out", tmp_path / "b",
                    "--no-grid", "--guidance", 1)
    assert result.exit_code == 0, result.output
    assert "tip: flowers32 scored its best FID at --guidance 1.75, its default" in result.output


def test_every_bundled_fine_tune_names_a_bundled_source_by_its_weights():
    """A bundle fine-tuned from a bundled model (flowers32 from flowers32-noise) records that model's step and
    the SHA-256 of the weights it ships, so its record and the source it names agree; a student names its teacher."""
    models = {manifest.name: manifest for manifest in available(PACKAGE_ROOT)}
    fine_tunes = [manifest for manifest in models.values() if manifest.config.init.source.startswith("pretrained:")]
    assert "flowers32" in [manifest.name for manifest in fine_tunes]
    for manifest in fine_tunes:
        source = models[manifest.config.init.source.removeprefix("pretrained:")]
        assert manifest.config.init.source_sha256 == source.sha256, manifest.name
        assert manifest.config.init.source_step == source.record["steps"], manifest.name
    flowers32 = models["flowers32"].config
    assert flowers32.model.prediction == "velocity" and flowers32.init.targets == "source"
    assert models["flowers32-4step"].config.model.distilled_from == "pretrained:flowers32-noise"


def test_the_table_gives_each_figure_column_one_sample_count_and_names_the_timing_cpus():
    """A column of figures is of one sample count in every row ('-' where a record lacks it), and the seconds say
    which CPU measured them, row by row when the CPUs differ."""
    from ddim.pretrained.render import models_table
    from ddim.pretrained.registry import available

    models = available(PACKAGE_ROOT)
    table = models_table(models)
    lines = table.splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[5:9] == ["FID (1,000)", "FID (5,000)", "class accuracy (1,000)", "class accuracy (5,000)"]
    for line in lines[2:2 + len(models)]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert not any(" of " in cell for cell in cells[7:9]), line  # no count of its own in a cell
    cpus = {m.record["sample_time"]["cpu"]: [] for m in models if m.record.get("sample_time")}
    for m in models:
        if m.record.get("sample_time"):
            cpus[m.record["sample_time"]["cpu"]].append(m.name)
    notes = table.split("\n\n", 1)[1]
    if len(cpus) == 1:
        assert f"once compiled, on a {next(iter(cpus))}." in notes
    else:
        for cpu, names in cpus.items():
            assert f"a {cpu} ({', '.join(names)})" in notes, notes
        assert "the CPU each names" not in notes
