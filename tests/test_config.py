"""Typed configs (ddim/config.py): TOML files, overrides and clear errors."""

import dataclasses

import pytest

from ddim.config import Config, ConfigError, apply_overrides, from_dict, load_config
from tests.conftest import CONFIGS


def test_reference_config_file_matches_the_documented_defaults():
    config = load_config(CONFIGS / "flowers64.toml")
    assert dataclasses.asdict(config) == dataclasses.asdict(Config())
    assert config.model.widths == (32, 64, 96, 128) and config.train.batch_size == 64


def test_every_config_file_loads():
    for path in CONFIGS.glob("*.toml"):
        config = load_config(path)
        assert config.name == path.stem


def test_overrides_are_typed():
    config = load_config(CONFIGS / "smoke.toml", [
        "train.batch_size=4", "train.learning_rate=2e-4", "model.widths=[4, 8]",
        "train.ema_warmup=false", "data.dataset=mnist", "model.dtype=\"bfloat16\"", "train.weight_decay=0",
    ])
    assert config.train.batch_size == 4
    assert config.train.learning_rate == pytest.approx(2e-4)
    assert config.model.widths == (4, 8)
    assert config.train.ema_warmup is False
    assert config.data.dataset == "mnist"  # a bare word is a string
    assert config.model.dtype == "bfloat16"
    assert isinstance(config.train.weight_decay, float)


@pytest.mark.parametrize(
    "override,message",
    [
        ("train.batch_sise=4", "unknown config key 'train.batch_sise'"),
        ("trian.batch_size=4", "unknown config key 'trian'"),
        ("train.batch_size=four", "train.batch_size: expected an integer"),
        ("train.batch_size=1.5", "train.batch_size: expected an integer"),
        ("train.ema_warmup=1", "expected true or false"),
        ("model.widths=32", "model.widths: expected a list"),
        ("train.batch_size", "not of the form section.key=value"),
        ("train.batch_size=0", "train.batch_size must be >= 1"),
        ("model.image_size=15", "multiple of"),
        ("model.dtype=float16", "model.dtype"),
        ("model.min_signal_rate=0.99", "min_signal_rate"),
    ],
)
def test_bad_overrides_are_clear_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        load_config(CONFIGS / "smoke.toml", [override])


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nbatch_size = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[training]\nbatch_size = 3\n")
    with pytest.raises(ConfigError, match="unknown config key 'training'"):
        load_config(unknown)


def test_round_trip_through_a_dict():
    config = load_config(CONFIGS / "smoke.toml")
    assert from_dict(config.to_dict()) == config


def test_overrides_create_sections():
    assert apply_overrides({}, ["train.seed=3"]) == {"train": {"seed": 3}}


def test_retired_keys_of_old_configs_and_checkpoints_are_dropped(tmp_path):
    """``data.shuffle_buffer`` is gone, but files and checkpoints that still have it load (RETIRED_KEYS)."""
    from ddim.config import RETIRED_KEYS

    assert "data.shuffle_buffer" in RETIRED_KEYS
    old = tmp_path / "old.toml"
    old.write_text("[data]\nshuffle_buffer = 640\ndataset_repetitions = 2\n")
    assert load_config(old).data.dataset_repetitions == 2
    stored = load_config(CONFIGS / "smoke.toml").to_dict()  # as a checkpoint stores it
    assert "shuffle_buffer" not in stored["data"]
    stored["data"]["shuffle_buffer"] = 640
    assert from_dict(stored) == load_config(CONFIGS / "smoke.toml")
    assert stored["data"]["shuffle_buffer"] == 640  # the caller's dict is left alone
    assert load_config(CONFIGS / "smoke.toml", ["data.shuffle_buffer=1"]) == load_config(CONFIGS / "smoke.toml")
    with pytest.raises(ConfigError, match="unknown config key 'data.shuffle_buffers'"):
        load_config(CONFIGS / "smoke.toml", ["data.shuffle_buffers=1"])
