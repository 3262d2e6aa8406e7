"""The real images an evaluation compares with, and the cache of their features.

Real images are a split of the checkpoint's dataset (a TFDS split or the
hash split of an image folder), preprocessed exactly as for training and read
from the data cache (:func:`ddim.data.load_split`): ``val`` (``data.val_split``,
the default, like the Keras example's KID) or ``train``; ``real_num`` draws a
fixed random subset. Their features are cached in
``<workdir>/eval_cache/real_<key>.npz``, keyed on everything they depend on
(for a folder, its files too), with the images' class labels
(:func:`labelled_real_features`, for the class accuracy of conditional models).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ddim.config import Config
from ddim.evaluation.features import EvaluationError, FeatureExtractor, extract_with_progress
from ddim.workdir.layout import EVAL_CACHE

SPLITS = ("val", "train", "all")
"""Real images to compare with: the validation split, the training split, or all of them (both)."""
CACHE_DIR = EVAL_CACHE
"""The folder of cached real features in a work directory (:attr:`ddim.workdir.layout.Workdir.eval_cache`)."""
_CACHE_VERSION = 1  # bump when the preprocessing or the cache layout changes


def split_expression(config: Config, split: str) -> str:
    """What ``split`` ("val", "train" or "all") is in ``config``: a TFDS split expression, or a folder's hash split."""
    if split not in SPLITS:
        raise EvaluationError(f"unknown split {split!r} (choose from {', '.join(SPLITS)})")
    if config.data.image_dir:
        share = {"val": config.data.val_fraction, "train": 1 - config.data.val_fraction, "all": 1.0}[split]
        return f"{share:.0%} of {config.data.image_dir} by path hash"
    if split == "all":
        return f"{split_expression(config, 'train')}+{split_expression(config, 'val')}"
    expression = config.data.val_split if split == "val" else config.data.train_split
    if not expression:
        raise EvaluationError(f"the checkpoint's config has no data.{split}_split; use --split train")
    return expression


def real_cache_key(config: Config, split: str, real_num: int | None, identity: str,
                   data_fingerprint: str | None = None) -> str:
    """Hash of everything the real features depend on: dataset, split, image size, count, network."""
    key = {
        "data": data_fingerprint,
        "image_dir": config.data.image_dir,
        "version": _CACHE_VERSION,
        "dataset": config.data.dataset,
        "split": split,
        "expression": split_expression(config, split),
        "image_size": config.model.image_size,
        "channels": config.model.channels,
        "real_num": real_num,
        "network": identity,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def select_real(images: np.ndarray, real_num: int | None) -> np.ndarray:
    """All images, or a fixed random subset of ``real_num`` of them (in their original order)."""
    if real_num is None or real_num >= len(images):
        return images
    index = np.sort(np.random.default_rng(0).choice(len(images), real_num, replace=False))
    return images[index]


def _load_cached(path: Path, labelled: bool) -> tuple[np.ndarray, np.ndarray | None] | None:
    """``(features, labels)`` of a cache file, labels None in a file of images given without them; None (recompute)
    when it is missing or unreadable, or ``labelled`` and it has no labels."""
    try:
        with np.load(path) as data:
            features = np.asarray(data["features"], np.float32)
            labels = np.asarray(data["labels"], np.int32) if "labels" in data.files else None
    except Exception:  # missing, truncated or foreign file: recompute
        return None
    labels = labels if labels is not None and labels.shape == features.shape[:1] else None
    if features.ndim != 2 or not len(features) or labelled and labels is None:
        return None
    return features, labels


def _save_cached(path: Path, features: np.ndarray, meta: dict[str, Any], labels: np.ndarray | None = None) -> None:
    """Features, their statistics (``mu``, ``sigma``: pytorch-fid's format, so ``--real-stats`` reads it) and
    the images' class labels (-1: none) when known."""
    from ddim.evaluation.metrics import feature_stats

    mu, sigma = feature_stats(features)
    extra = {} if labels is None else {"labels": np.asarray(labels, np.int32)}
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, features=features, mu=mu, sigma=sigma, meta=np.array(json.dumps(meta)), **extra)
    os.replace(tmp, path)


def load_real_stats(path: str | os.PathLike) -> dict[str, Any]:
    """Reference statistics from an ``.npz`` in pytorch-fid's format: ``mu`` (D,) and ``sigma`` (D, D).

    Returns ``{"mu", "sigma", "features", "network"}``; ``features`` is None
    unless the file also holds them (ddim's own cache files do, with the
    identity of their ``network``), as KID needs them. Read
    with ``allow_pickle=False``; any problem is one :class:`EvaluationError`.
    """
    path = Path(path)
    if not path.is_file():
        raise EvaluationError(f"reference statistics file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as data:
            if "mu" not in data.files or "sigma" not in data.files:
                raise EvaluationError(
                    f"{path} has no 'mu' and 'sigma' arrays (found {', '.join(data.files) or 'nothing'}); "
                    "expected pytorch-fid's statistics format"
                )
            mu, sigma = np.asarray(data["mu"], np.float64), np.asarray(data["sigma"], np.float64)
            features = np.asarray(data["features"], np.float32) if "features" in data.files else None
            network = json.loads(str(data["meta"])).get("network") if "meta" in data.files else None
    except EvaluationError:
        raise
    except Exception as error:  # not an npz, truncated, pickled objects, ...
        raise EvaluationError(f"cannot read reference statistics {path}: {str(error).splitlines()[0]}") from None
    if mu.ndim != 1 or sigma.shape != (mu.size, mu.size):
        raise EvaluationError(f"{path}: mu has shape {mu.shape} and sigma {sigma.shape}; expected (D,) and (D, D)")
    if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(sigma))):
        raise EvaluationError(f"{path}: mu or sigma is not finite")
    if features is not None and (features.ndim != 2 or features.shape[1] != mu.size or len(features) < 2):
        features = None
    return {"mu": mu, "sigma": sigma, "features": features, "network": network}


def real_features(
    config: Config,
    split: str,
    real_num: int | None,
    extractors: Sequence[FeatureExtractor],
    cache_dir: str | os.PathLike | None = None,
    log=None,
    show_progress: bool = False,
    images=None,
    data_cache: str | os.PathLike | None = None,
) -> list[np.ndarray]:
    """Features of the real images of ``split`` for each extractor, from the cache when possible.

    The split is opened from the data cache in ``data_cache`` (built there if
    needed: see :func:`ddim.data.load_split`); pixels are read only if some
    extractor's features are not cached. A caller that already holds the
    split (a :class:`ddim.data.ImageRows`, or an array) can pass it as
    ``images``. With ``cache_dir=None`` no features are cached. Raises
    :class:`ddim.data.DataError` when the dataset cannot be loaded.
    """
    features, _ = _real(config, split, real_num, extractors, cache_dir, log or _quiet, show_progress, images,
                        data_cache, labelled=False)
    return features


def labelled_real_features(
    config: Config,
    split: str,
    real_num: int | None,
    extractors: Sequence[FeatureExtractor],
    cache_dir: str | os.PathLike | None = None,
    log=None,
    show_progress: bool = False,
    data_cache: str | os.PathLike | None = None,
) -> tuple[list[np.ndarray], np.ndarray]:
    """:func:`real_features` and the int32 class label of each image (-1: no class), from the same cache files.

    For ``"all"``, when the ``train`` and ``val`` features are cached the
    ``all`` features are their concatenation (the order of
    :func:`ddim.data.load_split`), so no image is featurised twice.
    """
    features, labels = _real(config, split, real_num, extractors, cache_dir, log or _quiet, show_progress, None,
                             data_cache, labelled=True)
    assert labels is not None
    return features, labels


def _quiet(message: str) -> None:
    pass


def _real(config: Config, split: str, real_num: int | None, extractors: Sequence[FeatureExtractor], cache_dir,
          log, show_progress: bool, images, data_cache, labelled: bool):
    """``(features per extractor, labels or None)``; the labels are always found when ``labelled``."""
    from ddim import data as data_lib

    fingerprint = data_lib.split_fingerprint(config, split)  # a folder's files (a scan, no decoding)
    cache = Path(cache_dir) if cache_dir is not None else None
    paths = [_cache_path(cache, config, split, real_num, ex, fingerprint) if cache else None for ex in extractors]
    cached = [_load_cached(p, labelled) if p is not None else None for p in paths]
    for path in dict.fromkeys(p for p, hit in zip(paths, cached) if hit is not None):
        log(f"real features: {len(cached[paths.index(path)][0])} images from the cache {path}")
    results: list[np.ndarray | None] = [hit[0] if hit is not None else None for hit in cached]
    labels = next((hit[1] for hit in cached if hit is not None and hit[1] is not None), None)
    missing = [index for index, result in enumerate(results) if result is None]
    if missing:
        todo = [extractors[index] for index in missing]
        if images is None and split == "all" and _splits_cached(config, ("train", "val"), todo, cache):
            computed, found = _joined_parts(config, real_num, todo, cache, log, data_cache, labelled)
        elif images is None and split in ("train", "val") and _splits_cached(config, ("all",), todo, cache):
            computed, found = _part_of_whole(config, split, real_num, todo, cache, log, data_cache, labelled)
        else:
            computed, found = _compute(config, split, real_num, todo, log, show_progress, images, data_cache)
        labels = found if found is not None else labels
        stored: set[Path] = set()
        for index, features in zip(missing, computed):
            results[index] = features
            if paths[index] is not None and paths[index] not in stored:
                stored.add(paths[index])
                _store(paths[index], features, _meta(config, split, real_num, extractors[index]), labels, log)
    if labels is not None and len(labels) != len(results[0]):
        raise EvaluationError(f"the cached real features of split {split!r} are not of its {len(labels)} images; "
                              f"delete {cache} to recompute them")
    return results, labels


def _cache_path(cache: Path, config: Config, split: str, real_num: int | None, extractor: FeatureExtractor,
                fingerprint: str | None) -> Path:
    return cache / f"real_{real_cache_key(config, split, real_num, extractor.identity, fingerprint)}.npz"


def _splits_cached(config: Config, splits: Sequence[str], extractors, cache: Path | None) -> bool:
    """Whether the features of every one of ``splits`` (all images) of every extractor are in the cache."""
    from ddim import data as data_lib

    if cache is None:
        return False
    for split in splits:
        fingerprint = data_lib.split_fingerprint(config, split)
        if not all(_cache_path(cache, config, split, None, ex, fingerprint).is_file() for ex in extractors):
            return False
    return True


def _part_of_whole(config: Config, split: str, real_num: int | None, extractors, cache: Path, log, data_cache,
                   labelled: bool):
    """The ``train`` or ``val`` features cut from the cached ``all`` ones (the ``train`` images come first)."""
    from ddim import data as data_lib

    whole, whole_labels = _real(config, "all", None, extractors, cache, log, False, None, data_cache, labelled)
    num_train = len(data_lib.load_split_labels(config, "train", data_cache, log))
    part = slice(None, num_train) if split == "train" else slice(num_train, None)
    count = len(range(*part.indices(len(whole[0]))))
    if count < 2:  # as _compute says of a split it reads itself
        raise EvaluationError(f"split {split!r} ({split_expression(config, split)}) has {count} image(s); "
                              "need at least 2")
    log(f"real features: the {split!r} split cut from the cached 'all' features")
    features = [select_real(features[part], real_num) for features in whole]
    return features, None if whole_labels is None else select_real(whole_labels[part], real_num)


def _joined_parts(config: Config, real_num: int | None, extractors, cache: Path, log, data_cache, labelled: bool):
    """The ``all`` features: the ``train`` ones, then the ``val`` ones (:func:`ddim.data.load_split`'s order)."""
    (train, train_labels), (val, val_labels) = (
        _real(config, part, None, extractors, cache, log, False, None, data_cache, labelled)
        for part in ("train", "val")
    )
    log("real features: the 'all' split joined from the cached 'train' and 'val' features")
    features = [select_real(np.concatenate(pair), real_num) for pair in zip(train, val)]
    if train_labels is None or val_labels is None:
        return features, None
    return features, select_real(np.concatenate([train_labels, val_labels]), real_num)


def _compute(config: Config, split: str, real_num: int | None, extractors, log, show_progress: bool, images,
             data_cache):
    """Featurise the split's images with each extractor: ``(features per extractor, labels or None)``."""
    from ddim import data as data_lib

    expression = split_expression(config, split)
    if images is None:
        images = data_lib.load_split(config, split, data_cache, log=log)
        labels = images.label_array() if hasattr(images, "label_array") else \
            data_lib.load_split_labels(config, split, data_cache, log)
    else:
        labels = images.label_array() if hasattr(images, "label_array") else None
    images = np.asarray(select_real(images, real_num))
    labels = select_real(labels, real_num) if labels is not None else None
    if len(images) < 2:
        raise EvaluationError(f"split {split!r} ({expression}) has {len(images)} image(s); need at least 2")
    results: list[np.ndarray] = []
    for index, extractor in enumerate(extractors):
        same = [j for j in range(index) if extractors[j].identity == extractor.identity]
        if same:  # one network used twice (e.g. KID and FID on the same features)
            results.append(results[same[0]])
            continue
        started = time.perf_counter()
        results.append(extract_with_progress(extractor, images, f"real {extractor.image_size}px", show_progress))
        log(
            f"real features: {len(images)} {split} images at {extractor.image_size}px in "
            f"{time.perf_counter() - started:.1f}s"
        )
    return results, labels


def _meta(config: Config, split: str, real_num: int | None, extractor: FeatureExtractor) -> dict[str, Any]:
    return {
        "dataset": config.data.dataset,
        "split": split,
        "expression": split_expression(config, split),
        "image_size": config.model.image_size,
        "real_num": real_num,
        "network": extractor.identity,
    }


def _store(path: Path, features: np.ndarray, meta: dict[str, Any], labels: np.ndarray | None, log) -> None:
    try:
        _save_cached(path, features, meta, labels)
    except OSError as error:  # a cache that cannot be written only costs time next run
        log(f"warning: cannot cache the real features in {path}: {error.strerror or error}")
