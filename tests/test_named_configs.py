"""The configs that ship inside the package (ddim/configs/, ddim/config/named.py): found by name from any
directory, a path still works, an unknown name is one error line naming the known ones, ``ddim configs``
lists and prints them, and the fine-tune settings a run takes with ``--init`` and no ``--config``."""

import json

import pytest

from ddim.config import ConfigError, load_config, named
from ddim.train import load_run_config
from tests.conftest import CONFIGS
from tests.test_cli import assert_one_line_error, invoke


def test_a_packaged_name_resolves_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the package's own are found
    config = load_config("flowers32")
    assert config.name == "flowers32" and config.model.image_size == 32
    assert named.resolve("flowers32.toml") == CONFIGS / "flowers32.toml"


def test_a_path_still_works_and_wins_over_a_packaged_name(tmp_path, monkeypatch):
    (tmp_path / "flowers32").write_text('name = "mine"\n[model]\nimage_size = 48\n')
    monkeypatch.chdir(tmp_path)
    assert load_config("flowers32").model.image_size == 48
    assert load_config(tmp_path / "flowers32").name == "mine"


@pytest.mark.parametrize("given", ["flowerz", "configs/flowers32.toml", "my-config.toml"])
def test_an_unknown_name_or_missing_file_lists_the_packaged_ones(given, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as error:
        load_config(given)
    message = str(error.value)
    assert given in message and "\n" not in message
    assert all(name in message for name in named.names())


def test_every_packaged_config_says_in_its_first_line_what_it_is_for():
    assert {"finetune32", "finetune64", "folder32", "folder64", "flowers32", "flowers64"} <= set(named.names())
    for name in named.names():
        described = named.describe(name)
        assert 20 <= len(described.summary) <= 100, (name, described.summary)
        assert described.kind in ("from scratch", "fine-tune", "distillation")
    assert named.describe("finetune64").source == "pretrained:flowers64-noise"
    assert named.describe("distill32").kind == "distillation" and named.describe("distill32").image_size is None


def test_ddim_configs_lists_a_line_each_and_prints_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    listed = invoke("configs")
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:3] == ["name", "size", "start"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert sorted(rows) == named.names()
    assert "32px" in rows["finetune32"] and "fine-tune of flowers32" in rows["finetune32"]
    assert "64px" in rows["finetune64"] and "from scratch" in rows["folder64"]
    shown = invoke("configs", "finetune32")
    assert shown.exit_code == 0 and shown.stdout == (CONFIGS / "finetune32.toml").read_text()
    assert_one_line_error(invoke("configs", "nope"), "'nope'")


def test_a_command_takes_a_packaged_name_and_refuses_an_unknown_one_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke("train", "--config", "nope", "--set", "train.max_steps=1"), "finetune32")
    assert_one_line_error(invoke("distill", "--pretrained", "flowers32", "--config", "nope"), "consistency32")


def test_the_velocity_recipe_rebuilds_the_bundled_flowers32s_config():
    """The packaged recipe is what made the bundle: every value a run does not fill in when it starts (the
    source's step and digest, the data's classes) and every key added since equals the bundled one."""
    from ddim.pretrained import bundled_root

    shipped = json.loads((bundled_root() / "flowers32" / "model.json").read_text())["config"]
    rebuilt = load_run_config("flowers32-velocity").to_dict()
    filled = {("init", "source_step"), ("init", "source_sha256"), ("model", "num_classes"),
              ("model", "class_names"), ("model", "class_counts")}
    for section, values in rebuilt.items():
        if not isinstance(values, dict):
            assert values == shipped[section], section
            continue
        for key, value in values.items():
            if (section, key) not in filled and key in shipped[section]:
                assert value == shipped[section][key], f"{section}.{key}"


def test_init_without_a_config_takes_the_fine_tune_settings_and_the_sources_loss(tmp_path):
    photos = json.dumps(str(tmp_path / "photos"))
    config = load_run_config(None, [f"data.image_dir={photos}"], init="pretrained:flowers32")
    packaged = load_config("finetune32")
    assert config.name == "finetune32" and config.init.source == "pretrained:flowers32"
    assert config.train == packaged.train.__class__(**{**packaged.train.__dict__, "loss_weighting": "min-snr",
                                                        "snr_gamma": 10.0})  # flowers32's loss, not the defaults'
    assert (config.model.image_size, config.model.prediction) == (32, "velocity")
    assert config.train.max_images and config.train.kid_images == 0 and config.init.targets == "data"
    assert config.data.holdout_min_images > 0 and config.data.min_epoch_images > 0
    # At 64x64 the settings for that size; a setting given on the command line wins over both.
    config = load_run_config(None, ["train.loss_weighting=\"p2\""], init="pretrained:flowers64")
    assert (config.name, config.model.image_size, config.train.loss_weighting) == ("finetune64", 64, "p2")


def test_a_distilled_student_is_refused_naming_its_teacher():
    with pytest.raises(Exception, match=r"flowers32-consistency is a distilled student .*\(pretrained:flowers32\)"):
        load_run_config(None, [], init="pretrained:flowers32-consistency")
