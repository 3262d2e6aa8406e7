"""Input pipeline: TFDS images -> centre crop -> antialiased resize -> uint8 batches.

TensorFlow is imported lazily (it is slow to import and only the input pipeline
needs it) and never sees a GPU, so it cannot take accelerator memory from JAX.
The preprocessed images of a split are held in memory as one uint8 array (4x
less than float32: 80 MB for Flowers at 64x64) and converted to float in
[0, 1] on the device (:func:`ddim.train.state.to_float`).

Data order is a pure function of ``(seed, epoch)``: each epoch is the cached
training images repeated ``dataset_repetitions`` times and shuffled with a seed
derived from the epoch. Resuming at step ``s`` therefore rebuilds exactly the
batches an uninterrupted run would have seen (:func:`train_batches`).
"""

from __future__ import annotations

import functools
import re
from typing import Iterator

import numpy as np

from ddim.errors import UserError, environment_error, first_line
from ddim.config import Config


class DataError(UserError, RuntimeError):
    """The dataset could not be loaded or has unusable images."""


@functools.cache
def tensorflow():
    """Import TensorFlow for the input pipeline only, hiding every GPU from it."""
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # pragma: no cover - devices were already initialised
        pass
    return tf


def preprocess(image, image_size: int):
    """Centre-crop to a square, antialiased resize to ``image_size``, back to uint8.

    As in the Keras example (crop, ``tf.image.resize(antialias=True)``, clip to
    [0, 1]); the clip is the rounding to the uint8 range.
    """
    tf = tensorflow()
    height, width = tf.shape(image)[0], tf.shape(image)[1]
    crop = tf.minimum(height, width)
    image = tf.image.crop_to_bounding_box(image, (height - crop) // 2, (width - crop) // 2, crop, crop)
    image = tf.image.resize(image, [image_size, image_size], method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)


def load_split(config: Config, split: str) -> np.ndarray:
    """All preprocessed images of a TFDS split expression: uint8 ``(N, H, W, C)``."""
    tf = tensorflow()
    import tensorflow_datasets as tfds

    try:
        dataset, info = tfds.load(
            config.data.dataset,
            split=split,
            data_dir=config.data.data_dir or None,
            with_info=True,
            shuffle_files=False,
        )
    except Exception as error:  # TFDS raises many types (download, not found, bad split).
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(
            f"cannot load TFDS dataset {config.data.dataset!r} split {split!r}: {message} "
            "(offline? point TFDS_DATA_DIR or data.data_dir to a prepared copy)"
        ) from None
    if "image" not in info.features:
        raise DataError(f"TFDS dataset {config.data.dataset!r} has no 'image' feature")
    channels = info.features["image"].shape[-1]
    if channels != config.model.channels:
        raise DataError(
            f"dataset {config.data.dataset!r} has {channels}-channel images but model.channels is "
            f"{config.model.channels}"
        )
    size = config.model.image_size
    dataset = dataset.map(
        lambda example: preprocess(example["image"], size),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    try:
        batches = list(dataset.batch(256).as_numpy_iterator())
    except tf.errors.OpError as error:  # a data file deleted, truncated or unreadable since it was prepared
        message = getattr(error, "message", str(error))
        files = re.findall(r"(/[^\s;]+)", message)
        what = f"{environment_error(error) or 'damaged data file'}: {files[-1]}" if files else first_line(error)
        raise DataError(
            f"cannot read split {split!r} of {config.data.dataset!r}: {what} (the prepared copy in "
            f"{config.data.data_dir or 'TFDS_DATA_DIR'} is incomplete: prepare it again)"
        ) from None
    if not batches:
        raise DataError(f"split {split!r} of {config.data.dataset!r} has no images")
    return np.concatenate(batches)


def steps_per_epoch(config: Config, num_train_images: int) -> int:
    """Optimiser steps per epoch: repetitions x images, in whole batches."""
    steps = (num_train_images * config.data.dataset_repetitions) // config.train.batch_size
    if steps < 1:
        raise DataError(
            f"{num_train_images} training images x {config.data.dataset_repetitions} repetitions do not fill "
            f"one batch of {config.train.batch_size}"
        )
    return steps


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch) % (2**31 - 1)


def epoch_batches(images: np.ndarray, config: Config, epoch: int, skip: int = 0):
    """The batches of one training epoch (a ``tf.data.Dataset``), skipping the first ``skip``."""
    tf = tensorflow()
    dataset = tf.data.Dataset.from_tensor_slices(images).repeat(config.data.dataset_repetitions)
    dataset = dataset.shuffle(
        config.data.shuffle_buffer, seed=_epoch_seed(config.train.seed, epoch), reshuffle_each_iteration=False
    )
    dataset = dataset.batch(config.train.batch_size, drop_remainder=True)
    if skip:
        dataset = dataset.skip(skip)
    return dataset.prefetch(tf.data.AUTOTUNE)


def train_batches(images: np.ndarray, config: Config, start_step: int, steps_per_epoch: int) -> Iterator[np.ndarray]:
    """Endless uint8 batches ``(B, H, W, C)`` starting at global step ``start_step``."""
    epoch, skip = divmod(start_step, steps_per_epoch)
    while True:
        yield from epoch_batches(images, config, epoch, skip).as_numpy_iterator()
        epoch, skip = epoch + 1, 0


def eval_batches(images: np.ndarray, config: Config) -> Iterator[np.ndarray]:
    """The validation images in fixed order and whole batches (a partial last batch is dropped)."""
    batch = config.train.batch_size
    count = len(images) // batch
    if config.train.eval_batches:
        count = min(count, config.train.eval_batches)
    return (images[i * batch : (i + 1) * batch] for i in range(count))
