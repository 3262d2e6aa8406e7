"""Batches for training and validation, read from the cache with Grain.

A batch is a dict ``{"image": uint8 (B, H, W, C), "label": int32 (B,)}``; the
label is a class id, or -1 for an image without a class.

Data order is a pure function of ``(seed, epoch)``: epoch ``e`` is the training
images repeated ``data.dataset_repetitions`` times under one global random
permutation (numpy's PCG64 seeded by ``(seed, e)``; 4 bytes per image and
repetition), cut into whole batches. Each epoch is a Grain ``MapDataset`` over
its batch numbers, which is random access, so resuming at step ``s`` simply
starts at batch ``s % steps_per_epoch`` of epoch ``s // steps_per_epoch`` and
sees exactly the batches an uninterrupted run would have: no iterator state
needs to be checkpointed. (Grain's own per-element ``shuffle`` and ``batch``
were measured 3-5x slower than this: ~40k against ~120k+ images/s on the
development machine, which matters on a GPU.)

Multi-host: every process computes the same global batch of image indices
and reads only its own rows of it (``rows``, from
:func:`ddim.parallel.process_slice`), so no process reads another's images.
A few threads read ahead (``data.prefetch`` batches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ddim.config import Config, DataConfig, TrainConfig
from ddim.data.cache import NO_LABEL, ImageRows
from ddim.data.errors import DataError
from ddim.summary import plural

# Threads reading batches ahead of the training step. One is enough: a batch is one copy out of
# the memory-mapped cache (~0.3 ms for 64 images of 64x64), which holds the GIL, so more threads
# only add hand-offs; the point is to overlap reading with the step the device is running.
READ_THREADS = 1


@dataclass(frozen=True)
class BatchOrder:
    """How a run draws its training batches: ``batch_size`` images a step, the order seeded by ``seed``, an
    epoch ``repetitions`` passes over the images, ``prefetch`` batches read ahead. Training passes
    ``train.batch_size`` and ``train.seed``, distillation ``distill.batch_size`` and ``distill.seed``
    (:func:`batch_order`)."""

    batch_size: int
    seed: int
    repetitions: int
    prefetch: int = 0

    def steps_per_epoch(self, num_images: int) -> int:
        """Optimiser steps per epoch: repetitions x images, in whole batches."""
        steps = (num_images * self.repetitions) // self.batch_size
        if steps < 1:
            raise DataError(f"{num_images} training images x {self.repetitions} repetitions do not fill one batch "
                            f"of {self.batch_size}")
        return steps


def repetitions(data: DataConfig, num_train_images: int) -> int:
    """Passes over the training images in one epoch: ``data.dataset_repetitions``, or more where an epoch must
    hold ``data.min_epoch_images``."""
    wanted = -(-data.min_epoch_images // max(num_train_images, 1))  # ceil
    return max(data.dataset_repetitions, wanted)


def batch_order(data: DataConfig, num_train_images: int, batch_size: int, seed: int) -> BatchOrder:
    """The order of a run of ``batch_size`` images a step seeded by ``seed`` over ``num_train_images`` images
    (``data`` gives the repetitions and the read-ahead)."""
    return BatchOrder(batch_size, seed, repetitions(data, num_train_images), data.prefetch)


def total_steps(train: TrainConfig, steps_per_epoch: int) -> int:
    """The run's length in optimiser steps: the first of ``train.num_epochs``, ``train.max_steps`` and
    ``train.max_images`` (in whole batches, rounded up) to end it."""
    limits = [train.num_epochs * steps_per_epoch]
    if train.max_steps:
        limits.append(train.max_steps)
    if train.max_images:
        limits.append(-(-train.max_images // train.batch_size))
    return min(limits)


COPYING_PASSES = 1000
"""Passes over a folder's images past which samples start to copy them. flowers32 fine-tuned on 20
Fashion-MNIST images with finetune32's settings: 63 % of its samples were nearer one of the 20 than one of 20
unseen images of the same classes after 480 passes, 78 % after 960, 89 % after 1,920 and 97 % after 3,840 (0.5 for
a model that does not copy; python -m benchmarks.studies.memorization --held-out, docs/research/small-folders.md)."""


def copying_warning(config: Config, num_train_images: int, total_steps: int) -> str | None:
    """One warning line when a run on an image folder makes more than :data:`COPYING_PASSES` passes over it."""
    images = COPYING_PASSES * num_train_images
    # Past the steps that train.max_images = images gives (a last batch partly past the mark is no warning).
    if not config.data.image_dir or total_steps <= -(-images // config.train.batch_size):
        return None
    passes = total_steps * config.train.batch_size / max(num_train_images, 1)
    return (f"warning: {plural(total_steps, 'step')} of {config.train.batch_size} are {passes:,.0f} passes over these "
            f"{plural(num_train_images, 'image')}; past about {COPYING_PASSES:,} passes samples start to copy the "
            f"training images (docs/own-images.md#how-long-to-train): --set train.max_images={images} stops there")


def epoch_order(num_images: int, order: BatchOrder, epoch: int) -> np.ndarray:
    """The image index of every position of epoch ``epoch``: the images repeated ``order.repetitions`` times
    under one global random permutation, seeded by ``(order.seed, epoch)``."""
    total = num_images * order.repetitions
    rng = np.random.Generator(np.random.PCG64([order.seed, epoch]))
    permutation = rng.permutation(total) % num_images
    return permutation.astype(np.int32) if num_images < 2**31 else permutation


def read_batch(images, indices: np.ndarray) -> dict[str, np.ndarray]:
    """The batch of images ``indices`` of an :class:`ImageRows` (with its labels) or of a plain
    array of images (every label :data:`NO_LABEL`)."""
    if isinstance(images, ImageRows):
        return images.batch(indices)
    return {"image": images[indices], "label": np.full(len(indices), NO_LABEL, np.int32)}


def _iterate(dataset, prefetch: int):
    import grain

    if prefetch <= 0:  # in the calling thread (iter() of a MapDataset would start Grain's default threads)
        return (dataset[i] for i in range(len(dataset)))
    options = grain.ReadOptions(num_threads=READ_THREADS, prefetch_buffer_size=prefetch)
    return iter(dataset.to_iter_dataset(options))


def epoch_batches(images, order: BatchOrder, epoch: int, skip: int = 0, rows: slice = slice(None),
                  prefetch: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """The batches (``rows`` of each) of one epoch, from batch ``skip`` on.

    A Grain ``MapDataset`` over the epoch's batch numbers (random access: starting at
    ``skip`` is free) whose elements read their images and labels from ``images`` (an
    :class:`ImageRows` or an array, see :func:`read_batch`); Grain's threads read ahead.
    """
    import grain

    steps = order.steps_per_epoch(len(images))
    positions = epoch_order(len(images), order, epoch)
    batch = order.batch_size

    def read(step: int) -> dict[str, np.ndarray]:
        return read_batch(images, positions[step * batch : (step + 1) * batch][rows])

    dataset = grain.MapDataset.range(skip, steps).map(read)
    return _iterate(dataset, order.prefetch if prefetch is None else prefetch)


def train_batches(images, order: BatchOrder, start_step: int,
                  rows: slice = slice(None)) -> Iterator[dict[str, np.ndarray]]:
    """Endless batches starting at global step ``start_step`` (this process's ``rows`` of each)."""
    epoch, skip = divmod(start_step, order.steps_per_epoch(len(images)))
    while True:
        yield from epoch_batches(images, order, epoch, skip, rows)
        epoch, skip = epoch + 1, 0


def first_batches(images, order: BatchOrder, count: int) -> Iterator[dict[str, np.ndarray]]:
    """The first ``count`` whole global batches of epoch 0 (every process reads all rows: same values)."""
    import itertools

    return itertools.islice(epoch_batches(images, order, 0, rows=slice(None), prefetch=0), count)


def eval_batches(images, batch_size: int, max_batches: int = 0,
                 rows: slice = slice(None)) -> Iterator[dict[str, np.ndarray]]:
    """The validation batches in fixed order, whole (a partial last batch is dropped), at most ``max_batches``
    of them (0: all)."""
    count = len(images) // batch_size
    if max_batches:
        count = min(count, max_batches)
    for i in range(count):
        yield read_batch(images, np.arange(i * batch_size, (i + 1) * batch_size)[rows])
