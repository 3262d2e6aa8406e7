"""Loading a config's data: an image folder or TFDS splits, through the cache, as a :class:`Data`.

:func:`load` is what training and ``ddim data`` call; :func:`load_split` is
one split for evaluation. The source modules (:mod:`ddim.data.folder`,
:mod:`ddim.data.tfds`) are imported only when used, so a folder never
imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np

import ddim.data.cache as cache_lib
from ddim.config import Config
from ddim.data.cache import ImageRows
from ddim.data.errors import DataError
from ddim.data.report import Data
from ddim.workdir.layout import Workdir

# Warning lines printed for skipped files when a cache is built (all are in the report).
MAX_WARNINGS = 50


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cache_root(config: Config, workdir: str | os.PathLike | None = None) -> Path:
    """``data.cache_dir``, else ``<workdir>/data_cache``, else ``$DDIM_DATA_CACHE`` or ``~/.cache/ddim/data``."""
    if config.data.cache_dir:
        return Path(config.data.cache_dir).expanduser()
    if workdir is not None:
        return Workdir(workdir).data_cache
    if os.environ.get("DDIM_DATA_CACHE"):
        return Path(os.environ["DDIM_DATA_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ddim" / "data"


def min_image_size(config: Config) -> int:
    return config.data.min_image_size or config.model.image_size


def _decode_settings(config: Config):
    import ddim.data.folder as folder

    return folder.DecodeSettings(config.model.image_size, min_image_size(config), config.data.max_image_pixels)


def split_fingerprint(config: Config, split: str) -> str | None:
    """For an image folder, a hash that changes with its files, the split and the preprocessing
    (a scan, nothing decoded); None for TFDS, whose splits are fixed by name and version."""
    if not config.data.image_dir:
        return None
    import ddim.data.folder as folder

    scan = folder.scan_folder(Path(config.data.image_dir).expanduser())
    return f"{folder.fingerprint(scan, _decode_settings(config))}-{config.data.val_fraction!r}-{split}"


def _progress_factory(show: bool):
    if not show:
        return None
    from ddim.summary import Progress

    return lambda total: Progress(total, 0, description="preprocess")


def load(config: Config, workdir: str | os.PathLike | None = None, splits=("train", "val"),
         log: Callable[[str], None] | None = None, show_progress: bool = True, check: bool = True) -> Data:
    """The training data of ``config`` from the cache, building or updating the cache first if needed.

    ``splits``: which of "train" and "val" to open (TFDS decodes each split
    expression separately). Warnings about skipped files go to ``log``. With
    ``check`` (training), a folder that training would refuse (no usable image,
    too many bad files) raises :class:`DataError`; ``ddim data`` reports instead.
    """
    log = log or _stderr
    root = cache_root(config, workdir)
    progress = _progress_factory(show_progress)
    try:
        if config.data.image_dir:
            data = _load_folder(config, root, log, progress)
        else:
            data = _load_tfds(config, root, splits, log, progress)
    except OSError as error:  # an unwritable or full cache directory, a lock on read-only storage
        raise DataError(f"cannot use the data cache in {root}: {error.strerror or error}") from None
    if check:
        problem = data.problem(config)
        if problem:
            raise DataError(problem)
    if "train" not in splits:
        data.train = None
    if "val" not in splits:
        data.val = None
    return data


def _load_rows(directory: Path, index: dict) -> dict[str, np.ndarray]:
    try:
        return cache_lib.load_rows(directory, index)
    except (OSError, ValueError, KeyError) as error:
        raise DataError(f"the data cache {directory} is damaged ({error}); delete it to rebuild") from None


def _warn_skipped(image_dir: Path, skipped: list[dict], log) -> None:
    """The first :data:`MAX_WARNINGS` skipped files, one line each, and how many more there are."""
    from ddim.data.folder import reason_text

    for item in skipped[:MAX_WARNINGS]:
        log(f"warning: skipped {image_dir / item['path']}: {reason_text(item['reason'])}"
            + (f" ({item['detail']})" if item.get("detail") else ""))
    if len(skipped) > MAX_WARNINGS:
        log(f"warning: ... and {len(skipped) - MAX_WARNINGS} more skipped files (all are listed in the JSON report)")


def _load_folder(config: Config, root: Path, log, progress) -> Data:
    import ddim.data.folder as folder

    if config.model.channels != 3:
        raise DataError(f"image folders give RGB images; model.channels must be 3, not {config.model.channels}")
    image_dir = Path(config.data.image_dir).expanduser()
    directory, index, built = folder.build_or_open(image_dir, _decode_settings(config), root, config.data.workers,
                                                   log, progress)
    rows = _load_rows(directory, index)
    usable, score = rows["usable"], rows["score"]
    fraction = config.data.val_fraction
    if fraction and int(usable.sum()) < config.data.holdout_min_images:
        # A few held-out images score nothing (a validation loss that noisy, a FID of a handful of images) and
        # cost the model a fifth of what it can learn from.
        log(f"data: {int(usable.sum())} usable images, fewer than data.holdout_min_images = "
            f"{config.data.holdout_min_images}: every image trains, none is held out")
        fraction = 0.0
    # The images' content where the cache knows it (an entry built before it was recorded: the files' metadata).
    fingerprint = f"{index.get('content') or index['fingerprint']}-{fraction!r}"
    skipped = index.get("skipped", [])
    if built:  # once, when the files are decoded
        _warn_skipped(image_dir, skipped, log)

    def split(selected: np.ndarray, name: str) -> ImageRows:
        chosen = np.flatnonzero(selected)
        return ImageRows(directory / index["images_file"], tuple(index["shape"]), chosen, rows["label"][chosen],
                         f"{fingerprint}-{name}")

    return Data(
        kind="folder",
        name=str(image_dir),
        train=split(usable & (score >= fraction), "train"),
        val=split(usable & (score < fraction), "val"),
        class_names=list(index.get("class_names", [])),
        skipped=skipped,
        candidates=int(index["num_rows"]) + int(index.get("unlisted", 0)),
        ignored=index.get("ignored", {}),
        fingerprint=fingerprint,
        cache_dirs=[str(directory)],
        sizes=np.stack([rows["width"][usable], rows["height"][usable]], axis=1),
        val_fraction=fraction,
    )


def _open_tfds(config: Config, expression: str, root: Path, log, progress) -> tuple[Path, dict, dict]:
    """The cache entry of one TFDS split expression: ``(directory, index, per-row arrays)``."""
    import ddim.data.tfds as tfds

    directory, index = tfds.build_or_open(config, expression, root, log, progress)
    return directory, index, _load_rows(directory, index)


def _tfds_rows(directory: Path, index: dict, rows: dict) -> ImageRows:
    return ImageRows(directory / index["images_file"], tuple(index["shape"]), np.arange(index["num_rows"]),
                     rows["label"], index["fingerprint"])


def _load_tfds(config: Config, root: Path, splits, log, progress) -> Data:
    opened: dict[str, ImageRows] = {}
    class_names: list[str] = []
    fingerprints, directories, sizes = [], [], []
    for split in splits:
        expression = config.data.train_split if split == "train" else config.data.val_split
        if not expression:
            continue
        directory, index, rows = _open_tfds(config, expression, root, log, progress)
        opened[split] = _tfds_rows(directory, index, rows)
        class_names = list(index.get("class_names", []))
        fingerprints.append(index["fingerprint"])
        directories.append(str(directory))
        sizes.append(np.stack([rows["width"], rows["height"]], axis=1))
    return Data(
        kind="tfds",
        name=config.data.dataset,
        train=opened.get("train"),
        val=opened.get("val"),
        class_names=class_names,
        candidates=sum(len(split) for split in opened.values()),
        fingerprint="-".join(fingerprints),
        cache_dirs=directories,
        sizes=np.concatenate(sizes) if sizes else None,
    )


def load_split(config: Config, split: str, cache_dir: str | os.PathLike | None = None,
               log: Callable[[str], None] | None = None, show_progress: bool = False) -> ImageRows:
    """The preprocessed images of one split, ``"train"`` or ``"val"``, as an array-like :class:`ImageRows`.

    ``"all"`` is both, as one uint8 array (every real image: what FID is
    measured against). For TFDS, ``split`` may also be a split expression
    (``"train[:10%]"``).
    ``cache_dir``: the cache directory (default: ``data.cache_dir`` or
    ``~/.cache/ddim/data``; training uses ``<workdir>/data_cache``).
    """
    if cache_dir is not None:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, cache_dir=str(cache_dir)))
    root = cache_root(config)
    log = log or (lambda message: None)
    if split == "all":
        data = load(config, None, ("train", "val"), log, show_progress, check=True)
        return np.concatenate([np.asarray(part) for part in (data.train, data.val) if part is not None])
    if split not in ("train", "val"):
        if config.data.image_dir:
            raise DataError(f"unknown split {split!r} of an image folder (choose train or val)")
        return _tfds_rows(*_open_tfds(config, split, root, log, _progress_factory(show_progress)))
    data = load(config, None, (split,), log, show_progress, check=True)
    images = data.train if split == "train" else data.val
    if images is None:
        raise DataError(f"the config has no {split} split")
    return images


def load_split_labels(config: Config, split: str, cache_dir: str | os.PathLike | None = None,
                      log: Callable[[str], None] | None = None) -> np.ndarray:
    """The int32 class label of every image of :func:`load_split` (same split, same order), -1 for none.

    Reads the cache's index, never the pixels (``"all"`` included).
    """
    if split != "all":
        return load_split(config, split, cache_dir, log).label_array()
    if cache_dir is not None:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, cache_dir=str(cache_dir)))
    data = load(config, None, ("train", "val"), log or (lambda message: None), False, check=True)
    return np.concatenate([part.label_array() for part in (data.train, data.val) if part is not None])
