"""The TFDS source and the shared preprocessing (ddim/data/) on mock data and, when present, the real dataset."""

import numpy as np
import pytest

from ddim import data
from ddim.data.preprocess import center_crop_resize
from tests.conftest import NO_FLOWERS, mock_flowers, real_data_dir, tiny_config


def tensorflow_preprocess(image, size):
    """The former TensorFlow pipeline (the Keras example's), which the numpy version must equal bit for bit."""
    tf = data.tensorflow()
    height, width = image.shape[0], image.shape[1]
    crop = min(height, width)
    image = tf.image.crop_to_bounding_box(image, (height - crop) // 2, (width - crop) // 2, crop, crop)
    image = tf.image.resize(image, [size, size], method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8).numpy()


def test_preprocess_centre_crops_and_resizes():
    # A 40x80 image: left quarter black, middle half white, right quarter black.
    image = np.zeros((40, 80, 3), np.uint8)
    image[:, 20:60] = 255
    out = center_crop_resize(image, 8)
    assert out.shape == (8, 8, 3) and out.dtype == np.uint8
    # The centre crop is the white 40x40 middle.
    np.testing.assert_array_equal(out, 255)


def test_preprocess_antialiases():
    checker = (np.indices((64, 64)).sum(0) % 2 * 255).astype(np.uint8)
    image = np.repeat(checker[..., None], 3, axis=-1)
    out = center_crop_resize(image, 8)
    # Antialiased downsampling averages the checkerboard to grey instead of aliasing it.
    assert np.all(np.abs(out.astype(int) - 128) <= 2)


def test_preprocess_equals_tensorflow_bit_for_bit_on_random_shapes():
    rng = np.random.default_rng(0)
    for i in range(12):
        height, width = (int(v) for v in rng.integers(3, 520, 2))
        size = int(rng.choice([8, 16, 33, 64, 128, 256]))  # down- and upsampling
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        if i % 2:  # smooth images: many values near .5 after resizing, where rounding could differ
            image = np.cumsum(image, axis=0, dtype=np.int64) // np.arange(1, height + 1)[:, None, None]
            image = image.astype(np.uint8)
        np.testing.assert_array_equal(center_crop_resize(image, size), tensorflow_preprocess(image, size),
                                      err_msg=f"{height}x{width} -> {size}")


@pytest.mark.slow
@pytest.mark.skipif(real_data_dir() is None, reason=NO_FLOWERS)
def test_preprocess_equals_tensorflow_on_real_flowers():
    """Every 4th Oxford Flowers image at 64 px (all 8189 were checked once: 0 differing pixels;
    DDIM_ALL_FLOWERS=1 checks them all here, ~40 s)."""
    import os

    import tensorflow_datasets as tfds

    data.tensorflow()
    every = 1 if os.environ.get("DDIM_ALL_FLOWERS") == "1" else 4
    dataset = tfds.load("oxford_flowers102", split="train+validation+test", data_dir=str(real_data_dir()))
    checked = 0
    for i, example in enumerate(tfds.as_numpy(dataset)):
        if i % every:
            continue
        image = example["image"]
        np.testing.assert_array_equal(center_crop_resize(image, 64), tensorflow_preprocess(image, 64),
                                      err_msg=f"image {i} of shape {image.shape}")
        checked += 1
    assert checked == -(-8189 // every)


def test_tfds_split_goes_through_the_cache_with_labels(tmp_path):
    config = tiny_config()
    with mock_flowers(32):
        loaded = data.load(config, tmp_path, splits=("train",), log=lambda m: None, show_progress=False)
        again = data.load(config, tmp_path, splits=("train",), log=lambda m: None, show_progress=False)
    images = loaded.train
    assert images.shape == (32, 16, 16, 3) and images.dtype == np.uint8 and loaded.val is None
    assert isinstance(images, data.ImageRows)  # read from disk, not held in memory
    assert len(loaded.class_names) == 102 and images.labels.min() >= 0
    counts = loaded.train_class_counts
    assert counts.shape == (102,) and counts.sum() == 32
    order = data.batch_order(config.data, len(images), config.train.batch_size, config.train.seed)
    batch = next(data.first_batches(images, order, 1))
    assert batch["image"].shape == (8, 16, 16, 3) and batch["label"].dtype == np.int32
    np.testing.assert_array_equal(np.asarray(again.train), np.asarray(images))
    (entry,) = (tmp_path / "data_cache").iterdir()
    assert entry.name.startswith("tfds-oxford_flowers102-")


def test_eval_batches_are_fixed_and_whole():
    images = np.arange(20 * 4 * 4 * 3, dtype=np.uint8).reshape(20, 4, 4, 3)
    batches = list(data.eval_batches(images, 8))
    assert len(batches) == 2 and len(list(data.eval_batches(images, 8, max_batches=1))) == 1
    np.testing.assert_array_equal(np.concatenate([batch["image"] for batch in batches]), images[:16])
    # A plain array of images has no labels: every label is -1.
    assert all(batch["label"].dtype == np.int32 and (batch["label"] == -1).all() for batch in batches)


def test_too_small_dataset_is_a_clear_error():
    with pytest.raises(data.DataError, match="do not fill one batch"):
        data.BatchOrder(batch_size=8, seed=0, repetitions=2).steps_per_epoch(3)


def test_missing_dataset_is_a_clear_error(tmp_path):
    config = tiny_config(f'data.data_dir="{tmp_path}"', "data.dataset=not_a_dataset_name")
    with pytest.raises(data.DataError, match="cannot load TFDS dataset 'not_a_dataset_name'"):
        data.load_split(config, "train", cache_dir=tmp_path)


@pytest.mark.skipif(real_data_dir() is None, reason=NO_FLOWERS)
def test_real_oxford_flowers_split_sizes_and_values(tmp_path):
    from ddim.config import Config

    # The split logic does not depend on the size; 16 px keeps the test fast.
    config = Config().override(f'data.data_dir="{real_data_dir()}"', "model.image_size=16")
    loaded = data.load(config, tmp_path, log=lambda m: None, show_progress=False)
    train, val = np.asarray(loaded.train), np.asarray(loaded.val)
    assert train.shape == (6551, 16, 16, 3) and val.shape == (1638, 16, 16, 3)
    assert train.dtype == np.uint8
    # Natural photos: a broad range of values with a plausible mean.
    assert train.min() == 0 and train.max() == 255
    assert 60 < train.mean() < 160
    assert loaded.class_names[0] == "pink primrose" and set(np.unique(loaded.train.labels)) <= set(range(102))


@pytest.mark.skipif(real_data_dir() is None, reason=NO_FLOWERS)
def test_real_flowers_jpegs_in_a_folder_match_tensorflows_accurate_decoder(tmp_path):
    """The original JPEG files of Flowers in a folder: Pillow decodes them exactly as TensorFlow's
    accurate integer IDCT does, so the folder path gives the TFDS pipeline's pixels for that decoder
    (TFDS itself decodes with TensorFlow's default fast IDCT: see docs/own-images.md)."""
    import tensorflow_datasets as tfds

    tf = data.tensorflow()
    raw = tfds.load("oxford_flowers102", split="test[:24]", data_dir=str(real_data_dir()),
                    decoders={"image": tfds.decode.SkipDecoding()})
    root = tmp_path / "flowers"
    root.mkdir()
    expected = {}
    for i, example in enumerate(tfds.as_numpy(raw)):
        (root / f"{i:03d}.jpg").write_bytes(example["image"])
        decoded = tf.io.decode_jpeg(example["image"], channels=3, dct_method="INTEGER_ACCURATE")
        expected[i] = tensorflow_preprocess(decoded, 64)
    config = tiny_config(f'data.image_dir="{root}"', "model.image_size=64", "data.val_fraction=0")
    images = np.asarray(data.load(config, tmp_path / "run", log=lambda m: None, show_progress=False).train)
    np.testing.assert_array_equal(images, np.stack([expected[i] for i in range(24)]))
