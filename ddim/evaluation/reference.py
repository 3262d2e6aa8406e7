"""The real images an evaluation compares with, and the cache of their features.

Real images are a split of the checkpoint's dataset (a TFDS split or the
hash split of an image folder), preprocessed exactly as for training and read
from the data cache (:func:`ddim.data.load_split`): ``val`` (``data.val_split``,
the default, like the Keras example's KID) or ``train``; ``real_num`` draws a
fixed random subset. Their features are cached in
``<workdir>/eval_cache/real_<key>.npz``, keyed on everything they depend on
(for a folder, its files too).
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


def _load_cached(path: Path) -> np.ndarray | None:
    try:
        with np.load(path) as data:
            features = np.asarray(data["features"], np.float32)
    except Exception:  # missing, truncated or foreign file: recompute
        return None
    return features if features.ndim == 2 and len(features) else None


def _save_cached(path: Path, features: np.ndarray, meta: dict[str, Any]) -> None:
    """Features and their statistics (``mu``, ``sigma``: pytorch-fid's format, so ``--real-stats`` reads it)."""
    from ddim.evaluation.metrics import feature_stats

    mu, sigma = feature_stats(features)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, features=features, mu=mu, sigma=sigma, meta=np.array(json.dumps(meta)))
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
    from ddim import data as data_lib

    log = log or (lambda message: None)
    expression = split_expression(config, split)
    fingerprint = data_lib.split_fingerprint(config, split)  # a folder's files (a scan, no decoding)
    cache = Path(cache_dir) if cache_dir is not None else None
    paths = [
        cache / f"real_{real_cache_key(config, split, real_num, ex.identity, fingerprint)}.npz" if cache else None
        for ex in extractors
    ]
    results: list[np.ndarray | None] = [_load_cached(p) if p is not None else None for p in paths]
    for path in dict.fromkeys(p for p, result in zip(paths, results) if result is not None):
        log(f"real features: {len(results[paths.index(path)])} images from the cache {path}")
    if all(r is not None for r in results):
        return results  # type: ignore[return-value]

    if images is None:
        images = data_lib.load_split(config, split, data_cache, log=log)
    images = np.asarray(select_real(images, real_num))
    if len(images) < 2:
        raise EvaluationError(f"split {split!r} ({expression}) has {len(images)} image(s); need at least 2")
    for index, (extractor, path) in enumerate(zip(extractors, paths)):
        if results[index] is not None:
            continue
        same = [j for j in range(index) if extractors[j].identity == extractor.identity]
        if same:  # one network used twice (e.g. KID and FID on the same features)
            results[index] = results[same[0]]
            continue
        started = time.perf_counter()
        features = extract_with_progress(extractor, images, f"real {extractor.image_size}px", show_progress)
        results[index] = features
        log(
            f"real features: {len(images)} {split} images at {extractor.image_size}px in "
            f"{time.perf_counter() - started:.1f}s"
        )
        if path is not None:
            meta = {
                "dataset": config.data.dataset,
                "split": split,
                "expression": expression,
                "image_size": config.model.image_size,
                "real_num": real_num,
                "network": extractor.identity,
            }
            try:
                _save_cached(path, features, meta)
            except OSError as error:  # a cache that cannot be written only costs time next run
                log(f"warning: cannot cache the real features in {path}: {error.strerror or error}")
    return results  # type: ignore[return-value]


