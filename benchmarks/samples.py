"""Samples made on one machine and scored on another: the .npz files of ``ddim eval``'s images, and their FID
features.

:mod:`benchmarks.release.generate_eval_samples` writes the files (:func:`save_samples`);
:mod:`benchmarks.release.fid_of_samples` and the studies of memorisation and held-out set size read them
(:func:`load_samples`) and featurise them with the real images as ``ddim eval`` does (:func:`real_features`,
:func:`cached_generated_features`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from pathlib import Path

import numpy as np


def encode_webp(image: np.ndarray) -> bytes:
    """One uint8 HWC image as lossless WebP (decodes to the same pixels; about 35 % smaller than deflate)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "WEBP", lossless=True, quality=100, method=4)
    return buffer.getvalue()


def save_samples(out: Path, stem: str, images: np.ndarray, classes: np.ndarray, chunk: int = 1250,
                 encoding: str = "raw", setting: dict | None = None) -> list[Path]:
    """``images`` and their ``classes`` as ``out/STEM-0.npz``, ... of ``chunk`` images each.

    ``encoding`` "raw" stores ``images`` (uint8 NHWC, deflated); "webp" stores each image as lossless WebP
    (``webp``: the files one after another, ``offsets``: where each starts and the last ends), smaller to move.
    :func:`load_samples` reads both. ``setting`` (steps, sampler, spacing, eta, guidance, seed,
    batch_size) is stored as JSON beside them, for the score lines.
    """
    stored = {"setting": np.asarray(json.dumps(setting or {}))}
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for part, first in enumerate(range(0, len(images), chunk)):
        paths.append(out / f"{stem}-{part}.npz")
        part_images, part_classes = images[first:first + chunk], classes[first:first + chunk]
        if encoding == "webp":
            from concurrent.futures import ThreadPoolExecutor

            # Pillow's encoder releases the GIL: threads use every core.
            with ThreadPoolExecutor(os.cpu_count()) as pool:
                files = list(pool.map(encode_webp, part_images, chunksize=32))
            offsets = np.cumsum([0] + [len(f) for f in files])
            np.savez(paths[-1], webp=np.frombuffer(b"".join(files), np.uint8), offsets=offsets,
                     shape=np.asarray(part_images.shape), classes=part_classes, **stored)
        elif encoding == "raw":
            np.savez_compressed(paths[-1], images=part_images, classes=part_classes, **stored)
        else:
            raise ValueError(f"encoding must be 'raw' or 'webp', got {encoding!r}")
    return paths


def load_samples(paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The images and asked class ids of the .npz files, in the order given (as they were generated)."""
    images, classes = [], []
    for path in paths:
        with np.load(path) as data:
            images.append(data["images"] if "images" in data else decode_webp(data["webp"], data["offsets"]))
            classes.append(data["classes"])
    return np.concatenate(images), np.concatenate(classes)


def load_setting(paths: list[str]) -> dict:
    """The sampling setting the .npz files were generated at (:func:`save_samples` stores it), or {}."""
    settings = []
    for path in paths:
        with np.load(path) as data:
            settings.append(json.loads(str(data["setting"])) if "setting" in data else {})
    if any(setting != settings[0] for setting in settings):
        raise SystemExit("error: the sample files were generated at different settings")
    return settings[0] if settings else {}


def decode_webp(files: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The uint8 NHWC images of :func:`save_samples`' ``webp`` encoding: lossless WebP files end to end."""
    from PIL import Image

    data = files.tobytes()
    return np.stack([np.asarray(Image.open(io.BytesIO(data[start:end])).convert("RGB"))
                     for start, end in zip(offsets[:-1], offsets[1:])])


def cached_generated_features(images: np.ndarray, extractor, cache: Path) -> np.ndarray:
    """FID features of ``images``, cached by the images' digest and the network's identity."""
    key = hashlib.sha256(images.tobytes() + extractor.identity.encode()).hexdigest()[:16]
    path = cache / f"generated-{key}.npy"
    if path.exists():
        return np.load(path)
    from ddim.evaluation.features import extract_with_progress

    features = extract_with_progress(extractor, images, "generated", sys.stderr.isatty())
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, features)
    return features


def real_features(config, split: str, extractor, eval_cache: Path, data_cache) -> tuple[np.ndarray, np.ndarray]:
    """The FID features and labels of ``config``'s real ``split``, cached in ``eval_cache`` as ``ddim eval`` does."""
    from ddim.evaluation.reference import labelled_real_features

    (features,), labels = labelled_real_features(config, split, None, [extractor], eval_cache, print, False,
                                                 data_cache)
    return features, labels
