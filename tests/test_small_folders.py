"""Small image folders: an epoch long enough to report on (data.min_epoch_images), a length in images seen
(train.max_images), every image trained below data.holdout_min_images, and a warning past the passes where
samples start to copy the training images."""

from ddim import data as data_lib
from tests.conftest import tiny_config
from tests.image_folders import folder_config, write_plain_folder


def test_a_small_folders_epoch_repeats_its_images_up_to_min_epoch_images():
    config = tiny_config("data.min_epoch_images=100", "data.dataset_repetitions=2")
    # 8 images: 13 passes hold 104 >= 100 images, 13 steps of 8.
    assert steps_per_epoch(config, 8) == 13
    assert len(data_lib.loader.epoch_order(8, data_lib.batch_order(config.data, 8, 8, 0), 0)) == 104
    # Many images: dataset_repetitions alone already holds more.
    assert steps_per_epoch(config, 400) == 100
    assert steps_per_epoch(tiny_config("data.dataset_repetitions=2"), 8) == 2


def steps_per_epoch(config, num_images):
    return data_lib.batch_order(config.data, num_images, config.train.batch_size, 0).steps_per_epoch(num_images)


def test_the_first_of_epochs_steps_and_images_ends_the_run():
    assert data_lib.total_steps(tiny_config("train.num_epochs=3", "train.max_steps=0").train, 10) == 30
    assert data_lib.total_steps(tiny_config("train.num_epochs=3", "train.max_steps=12").train, 10) == 12
    # 50 images at batch 8: 7 steps, the last one partly past the mark.
    assert data_lib.total_steps(tiny_config("train.num_epochs=3", "train.max_steps=12", "train.max_images=50").train,
                                10) == 7


def test_a_folder_below_holdout_min_images_trains_on_every_image(tmp_path):
    write_plain_folder(tmp_path / "photos", 12, size=20)
    lines = []
    small = data_lib.load(folder_config(tmp_path / "photos", "data.val_fraction=0.5",
                                        "data.holdout_min_images=13"), tmp_path / "a", log=lines.append,
                          show_progress=False)
    assert len(small.train) == 12 and not len(small.val)
    assert [line for line in lines if "every image trains" in line] == [
        "data: 12 usable images, fewer than data.holdout_min_images = 13: every image trains, none is held out"]
    split = data_lib.load(folder_config(tmp_path / "photos", "data.val_fraction=0.5", "data.holdout_min_images=12"),
                          tmp_path / "b", log=lines.append, show_progress=False)
    assert len(split.train) + len(split.val) == 12 and len(split.val) > 0


def test_a_run_past_the_copying_passes_is_warned_with_the_setting_that_stops_there(tmp_path):
    config = folder_config(tmp_path, "train.batch_size=64")
    limit = data_lib.COPYING_PASSES
    steps = -(-limit * 20 // 64)  # the steps that train.max_images = limit x 20 images gives
    warning = data_lib.copying_warning(config, 20, steps + 1)
    assert warning.startswith(f"warning: {steps + 1} steps of 64 are ") and f"train.max_images={limit * 20}" in warning
    assert data_lib.copying_warning(config, 20, steps) is None  # what the warning's own setting gives: no warning
    assert data_lib.copying_warning(tiny_config("train.batch_size=64"), 20, steps) is None  # Flowers, not a folder
