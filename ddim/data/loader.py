"""Batches for training and validation, read from the cache with Grain.

Data order is a pure function of ``(seed, epoch)``: epoch ``e`` is the training
images repeated ``data.dataset_repetitions`` times under one global random
permutation (Grain's ``MapDataset.shuffle``, seeded from the seed and the
epoch), cut into whole batches. A Grain ``MapDataset`` is random access, so
resuming at step ``s`` simply starts at batch ``s % steps_per_epoch`` of epoch
``s // steps_per_epoch`` and sees exactly the batches an uninterrupted run
would have: no iterator state needs to be checkpointed.

Multi-host: every process computes the same global batch of image indices
and reads only its own rows of it (``rows``, from
:func:`ddim.parallel.process_slice`), so no process reads another's images.
A few threads read ahead (``data.prefetch`` batches).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ddim.config import Config

# Threads reading batches ahead of the training step (reads are short positional reads that
# release the GIL; two threads keep a GPU fed at thousands of images/s, see the README).
READ_THREADS = 2


def steps_per_epoch(config: Config, num_train_images: int) -> int:
    """Optimiser steps per epoch: repetitions x images, in whole batches."""
    from ddim.data import DataError

    steps = (num_train_images * config.data.dataset_repetitions) // config.train.batch_size
    if steps < 1:
        raise DataError(
            f"{num_train_images} training images x {config.data.dataset_repetitions} repetitions do not fill "
            f"one batch of {config.train.batch_size}"
        )
    return steps


def epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch) % (2**31 - 1)


def epoch_indices(num_images: int, config: Config, epoch: int):
    """Grain ``MapDataset`` of the global batches of image indices of one epoch, ``(batch_size,)`` int64 each."""
    import grain

    repetitions, batch_size = config.data.dataset_repetitions, config.train.batch_size
    order = grain.MapDataset.range(num_images * repetitions).shuffle(seed=epoch_seed(config.train.seed, epoch))
    return order.map(lambda position: position % num_images).batch(batch_size, drop_remainder=True)


def _reader(images, rows: slice):
    def read(indices: np.ndarray) -> np.ndarray:
        return images[np.asarray(indices)[rows]]

    return read


def _iterate(dataset, prefetch: int):
    import grain

    if prefetch <= 0:
        return iter(dataset)
    options = grain.ReadOptions(num_threads=READ_THREADS, prefetch_buffer_size=prefetch)
    return iter(dataset.to_iter_dataset(options))


def epoch_batches(images, config: Config, epoch: int, skip: int = 0, rows: slice = slice(None),
                  prefetch: int | None = None) -> Iterator[np.ndarray]:
    """The uint8 batches ``(rows of B, H, W, C)`` of one epoch, from batch ``skip`` on."""
    steps = steps_per_epoch(config, len(images))
    dataset = epoch_indices(len(images), config, epoch)[skip:steps].map(_reader(images, rows))
    return _iterate(dataset, config.data.prefetch if prefetch is None else prefetch)


def train_batches(images, config: Config, start_step: int, steps_per_epoch: int,
                  rows: slice = slice(None)) -> Iterator[np.ndarray]:
    """Endless uint8 batches starting at global step ``start_step`` (this process's ``rows`` of each)."""
    epoch, skip = divmod(start_step, steps_per_epoch)
    while True:
        yield from epoch_batches(images, config, epoch, skip, rows)
        epoch, skip = epoch + 1, 0


def first_batches(images, config: Config, count: int) -> Iterator[np.ndarray]:
    """The first ``count`` whole global batches of epoch 0 (every process reads all rows: same values)."""
    import itertools

    return itertools.islice(epoch_batches(images, config, 0, rows=slice(None), prefetch=0), count)


def eval_batches(images, config: Config, rows: slice = slice(None)) -> Iterator[np.ndarray]:
    """The validation images in fixed order and whole batches (a partial last batch is dropped)."""
    batch = config.train.batch_size
    count = len(images) // batch
    if config.train.eval_batches:
        count = min(count, config.train.eval_batches)
    for i in range(count):
        yield images[np.arange(i * batch, (i + 1) * batch)[rows]]
