"""The models really bundled in the package: the README's models with the best one the default, each loading by
its hash and sampling, class models at their best measured guidance, fine-tunes naming their sources, the table."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

import ddim
from ddim.pretrained import ENV, MAX_BYTES, PACKAGE_ROOT, available, default_model, find
from tests.test_cli import invoke


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
    assert models["flowers32-consistency"].config.model.distilled_from == "pretrained:flowers32"


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
