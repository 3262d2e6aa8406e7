"""A TFDS dataset as a data source: each split expression decoded once into the cache.

TensorFlow is imported lazily (:func:`ddim.lazy_tensorflow.tensorflow`: it is slow to import
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
from ddim.lazy_tensorflow import tensorflow


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


def _has_label(info) -> bool:
    return "label" in info.features and hasattr(info.features["label"], "names")


def _decoded(dataset, info):
    """``(image, label)`` pairs as numpy, decoded by TensorFlow on all cores (label -1 without a label feature)."""
    tf = tensorflow()
    has_label = _has_label(info)
    return dataset.map(
        lambda example: (example["image"], example["label"] if has_label else tf.constant(-1, tf.int64)),
        num_parallel_calls=tf.data.AUTOTUNE,  # TensorFlow decodes on all cores; resizing happens here
        deterministic=True,
    ).prefetch(64).as_numpy_iterator()


def _write_rows(writer: cache_lib.EntryWriter, pairs, size: int, progress) -> dict[str, list[int]]:
    """Preprocess every ``(image, label)`` into ``writer``'s file, 256 rows at a time; returns the
    per-row ``label``, ``width`` and ``height`` lists."""
    rows: dict[str, list[int]] = {"label": [], "width": [], "height": []}
    block, first = [], 0
    for image, label in pairs:
        block.append(center_crop_resize(image, size))
        rows["label"].append(int(label))
        rows["height"].append(image.shape[0])
        rows["width"].append(image.shape[1])
        if len(block) == 256:
            writer.write_rows(first, np.stack(block))
            first, block = len(rows["label"]), []
            if progress is not None:
                progress.update(first, "")
    if block:
        writer.write_rows(first, np.stack(block))
    return rows


def _build(directory, dataset, info, split, key, fingerprint, count, size, channels, log, progress_factory):
    """Decode and preprocess the split into a new version of the entry; publish its index."""
    tf = tensorflow()
    started = time.perf_counter()
    # The metadata's count sizes the file and the progress bar; the images themselves decide.
    writer = cache_lib.EntryWriter(directory, count or 0, (size, size, channels))
    progress = progress_factory(count) if progress_factory and count else None
    try:
        rows = _write_rows(writer, _decoded(dataset, info), size, progress)
    except tf.errors.OpError as error:  # a data file deleted, truncated or unreadable since it was prepared
        writer.abandon()
        raise _unreadable(error, info.name, split) from None
    except BaseException:
        writer.abandon()
        raise
    finally:
        if progress is not None:
            progress.close()
    count = len(rows["label"])
    if count == 0:
        writer.abandon()
        raise DataError(f"split {split!r} of {info.name!r} has no images")
    seconds = time.perf_counter() - started
    index = writer.finish(
        {
            "source": {"kind": "tfds", "dataset": info.name, "version": str(info.version), "split": split},
            "fingerprint": fingerprint,
            "settings": key,
            "class_names": list(info.features["label"].names) if _has_label(info) else [],
            "skipped": [],
            "ignored": {},
            "build": {"decoded": count, "reused": 0, "seconds": round(seconds, 3),
                      "images_per_second": round(count / seconds, 1) if seconds > 0 else None},
        },
        {name: np.array(values, np.int32) for name, values in rows.items()} | {"usable": np.ones(count, bool)},
        num_rows=count,
    )
    log(f"data cache: {count:,} images in {seconds:.1f}s ({count / max(seconds, 1e-9):,.0f} images/s)")
    return index
