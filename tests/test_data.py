"""The TFDS input pipeline (ddim/data.py) on mock data and, when present, the real prepared dataset."""

import numpy as np
import pytest

from ddim import data
from tests.conftest import mock_flowers, real_data_dir, tiny_config


def test_preprocess_centre_crops_and_resizes():
    tf = data.tensorflow()
    # A 40x80 image: left quarter black, middle half white, right quarter black.
    image = np.zeros((40, 80, 3), np.uint8)
    image[:, 20:60] = 255
    out = data.preprocess(tf.constant(image), 8).numpy()
    assert out.shape == (8, 8, 3) and out.dtype == np.uint8
    # The centre crop is the white 40x40 middle.
    np.testing.assert_array_equal(out, 255)


def test_preprocess_antialiases():
    tf = data.tensorflow()
    checker = (np.indices((64, 64)).sum(0) % 2 * 255).astype(np.uint8)
    image = np.repeat(checker[..., None], 3, axis=-1)
    out = data.preprocess(tf.constant(image), 8).numpy()
    # Antialiased downsampling averages the checkerboard to grey instead of aliasing it.
    assert np.all(np.abs(out.astype(int) - 128) <= 2)


def test_pipeline_on_mock_data_shapes_range_and_order():
    config = tiny_config()
    with mock_flowers(32):
        images = data.load_split(config, config.data.train_split)
    assert images.shape == (32, 16, 16, 3) and images.dtype == np.uint8
    steps = data.steps_per_epoch(config, len(images))
    assert steps == 4
    batches = data.train_batches(images, config, 0, steps)
    first_two_epochs = [next(batches) for _ in range(2 * steps)]
    assert all(b.shape == (8, 16, 16, 3) and b.dtype == np.uint8 for b in first_two_epochs)
    epoch0 = np.concatenate(first_two_epochs[:steps])
    # One epoch (1 repetition) sees every image once, shuffled.
    assert sorted(map(bytes, epoch0)) == sorted(map(bytes, images))
    assert not np.array_equal(epoch0, images)
    # Each epoch has its own order, and resuming at any step gives the same batches.
    assert not np.array_equal(epoch0, np.concatenate(first_two_epochs[steps:]))
    resumed = data.train_batches(images, config, 5, steps)
    for expected in first_two_epochs[5:]:
        np.testing.assert_array_equal(next(resumed), expected)


def test_eval_batches_are_fixed_and_whole():
    config = tiny_config("train.eval_batches=0")
    images = np.arange(20 * 4 * 4 * 3, dtype=np.uint8).reshape(20, 4, 4, 3)
    batches = list(data.eval_batches(images, config))
    assert len(batches) == 2
    np.testing.assert_array_equal(np.concatenate(batches), images[:16])


def test_too_small_dataset_is_a_clear_error():
    with pytest.raises(data.DataError, match="do not fill one batch"):
        data.steps_per_epoch(tiny_config(), 3)


def test_missing_dataset_is_a_clear_error(tmp_path):
    config = tiny_config(f'data.data_dir="{tmp_path}"', "data.dataset=not_a_dataset_name")
    with pytest.raises(data.DataError, match="cannot load TFDS dataset 'not_a_dataset_name'"):
        data.load_split(config, "train")


@pytest.mark.slow
@pytest.mark.skipif(real_data_dir() is None, reason="the prepared oxford_flowers102 copy (../shared/tfds) is absent")
def test_real_oxford_flowers_split_sizes_and_values():
    from ddim.config import Config

    # The split logic does not depend on the size; 16 px keeps the test fast.
    config = Config().override(f'data.data_dir="{real_data_dir()}"', "model.image_size=16")
    train = data.load_split(config, config.data.train_split)
    val = data.load_split(config, config.data.val_split)
    assert train.shape == (6551, 16, 16, 3) and val.shape == (1638, 16, 16, 3)
    assert train.dtype == np.uint8
    # Natural photos: a broad range of values with a plausible mean.
    assert train.min() == 0 and train.max() == 255
    assert 60 < train.mean() < 160
