"""A TFDS dataset as a data source: each split expression decoded once into the cache.

TensorFlow is imported lazily (:func:`ddim.runtime.tensorflow`: it is slow to import
and only TFDS needs it) and never sees a GPU, so it cannot take accelerator memory from JAX. TensorFlow
decodes the images (as TFDS always has); cropping and resizing is the shared
:func:`ddim.data.preprocess.center_crop_resize`, which gives exactly the
pixels of the former ``tf.image.resize`` pipeline. Labels (a ``label``
class feature) and their names are stored with the images.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

from ddim.config import Config
import ddim.data.cache as cache_lib
from ddim.data.errors import DataError
from ddim.data.preprocess import PREPROCESS_VERSION, center_crop_resize
from ddim.runtime import tensorflow


def _unreadable(error, dataset: str, split: str) -> Exception:
    """One line for a TFDS file that cannot be read: what went wrong, which file, what to do."""
    from ddim.errors import environment_error, first_line, path_in_message

    what = environment_error(error, path_from_message=True)
    if what is None:  # not an OS error: a truncated or garbled record
        path = path_in_message(error)
        what = f"damaged data file: {path}" if path else f"damaged data file ({first_line(error)})"
    return DataError(
        f"cannot read split {split!r} of {dataset!r}: {what} (the prepared copy is incomplete: prepare it again)"
    )


def _load(config: Config, split: str):
    tensorflow()
    import tensorflow_datasets as tfds

    try:
        return tfds.load(
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


def build_or_open(config: Config, split: str, cache_root: Path, log: Callable[[str], None],
                  progress_factory=None) -> tuple[Path, dict]:
    """The cache entry of one TFDS split expression at ``model.image_size``, built on first use."""
    dataset, info = _load(config, split)
    if "image" not in info.features:
        raise DataError(f"TFDS dataset {config.data.dataset!r} has no 'image' feature")
    channels = info.features["image"].shape[-1]
    if channels != config.model.channels:
        raise DataError(
            f"dataset {config.data.dataset!r} has {channels}-channel images but model.channels is "
            f"{config.model.channels}"
        )
    size = config.model.image_size
    try:
        count = int(info.splits[split].num_examples)
    except Exception:  # noqa: BLE001 - unusual split expressions: count while decoding
        count = None
    key = {"dataset": info.name, "version": str(info.version), "config": info.config_name or "",
           "split": split, "image_size": size, "preprocess_version": PREPROCESS_VERSION}
    fingerprint = cache_lib.digest({**key, "count": count}, 24)
    directory = cache_lib.entry_dir(cache_root, f"tfds-{info.name}", key)
    with cache_lib.entry_lock(directory):
        index = cache_lib.read_index(directory)
        if index is not None and index.get("fingerprint") == fingerprint:
            return directory, index
        log(f"data cache: preprocessing {count if count is not None else 'all'} images of TFDS "
            f"{info.name} {info.version} split {split!r} at {size}px into {directory}")
        index = _build(directory, dataset, info, split, key, fingerprint, count, size, channels, log,
                       progress_factory)
    return directory, index


def _build(directory, dataset, info, split, key, fingerprint, count, size, channels, log, progress_factory):
    tf = tensorflow()
    started = time.perf_counter()
    has_label = "label" in info.features and hasattr(info.features["label"], "names")
    images = dataset.map(
        lambda example: (example["image"], example["label"] if has_label else tf.constant(-1, tf.int64)),
        num_parallel_calls=tf.data.AUTOTUNE,  # TensorFlow decodes on all cores; resizing happens here
        deterministic=True,
    ).prefetch(64)
    # The metadata's count sizes the file and the progress bar; the images themselves decide.
    writer = cache_lib.EntryWriter(directory, count or 0, (size, size, channels))
    labels, widths, heights = [], [], []
    progress = progress_factory(count) if progress_factory and count else None
    row = 0
    try:
        block, first = [], 0
        for image, label in images.as_numpy_iterator():
            block.append(center_crop_resize(image, size))
            labels.append(int(label))
            heights.append(image.shape[0])
            widths.append(image.shape[1])
            row += 1
            if len(block) == 256:
                writer.write_rows(first, np.stack(block))
                first, block = row, []
                if progress is not None:
                    progress.update(row, "")
        if block:
            writer.write_rows(first, np.stack(block))
    except tf.errors.OpError as error:  # a data file deleted, truncated or unreadable since it was prepared
        writer.abandon()
        raise _unreadable(error, info.name, split) from None
    except BaseException:
        writer.abandon()
        raise
    finally:
        if progress is not None:
            progress.close()
    count = row
    if count == 0:
        writer.abandon()
        raise DataError(f"split {split!r} of {info.name!r} has no images")
    seconds = time.perf_counter() - started
    index = writer.finish(
        {
            "source": {"kind": "tfds", "dataset": info.name, "version": str(info.version), "split": split},
            "fingerprint": fingerprint,
            "settings": key,
            "class_names": list(info.features["label"].names) if has_label else [],
            "skipped": [],
            "ignored": {},
            "build": {"decoded": count, "reused": 0, "seconds": round(seconds, 3),
                      "images_per_second": round(count / seconds, 1) if seconds > 0 else None},
        },
        {"label": np.array(labels, np.int32), "width": np.array(widths, np.int32),
         "height": np.array(heights, np.int32), "usable": np.ones(count, bool)},
        num_rows=count,
    )
    log(f"data cache: {count:,} images in {seconds:.1f}s ({count / max(seconds, 1e-9):,.0f} images/s)")
    return index
