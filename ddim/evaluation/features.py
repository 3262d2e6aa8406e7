"""The feature-network interface of evaluation: uint8 images in, one feature vector per image out.

KID and FID compare feature statistics of generated and real images. Every
network (Keras' InceptionV3 in :mod:`ddim.evaluation.keras_inception`, or any
other) is a :class:`FeatureExtractor`: it takes uint8 images of any size, does
its own resizing and scaling, and returns ``(N, D)`` float32 features. The
evaluation job and the training KID monitor only see this interface; a new
network is a new subclass, nothing else changes. Its ``identity`` (network,
input size and weights hash) keys the cache of real-image features.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ddim.errors import UserError

KID_IMAGE_SIZE = 75
"""InceptionV3 input side for KID (the Keras DDIM example's ``kid_image_size``)."""
FID_IMAGE_SIZE = 299
"""InceptionV3 input side for FID (its native resolution)."""

FeatureFactory = Callable[[int], "FeatureExtractor"]
"""``factory(image_size) -> FeatureExtractor`` taking square images of that side."""


class EvaluationError(UserError, RuntimeError):
    """An evaluation cannot run (missing weights, bad settings, unwritable work directory, ...)."""


class FeatureExtractor:
    """An image network as a function of uint8 images: ``extractor(images) -> (N, D) float32``.

    ``images`` are ``(N, H, W, C)`` uint8 with C = 1 (repeated to RGB) or 3,
    any side; they reach :meth:`features` in chunks of at most ``batch_size``
    (bounding memory). Subclasses implement :meth:`features` and set
    ``image_size`` (the network's input side), ``identity`` (network and
    weights, for caches and records) and ``batch_size``.
    """

    image_size: int
    identity: str
    batch_size: int = 32

    def features(self, images: np.ndarray) -> np.ndarray:
        """Features ``(n, D)`` of one chunk of uint8 RGB images ``(n, H, W, 3)``."""
        raise NotImplementedError

    def __call__(self, images) -> np.ndarray:
        images = np.asarray(images)
        if images.ndim != 4 or images.shape[-1] not in (1, 3):
            raise ValueError(f"expected uint8 images (N, H, W, 1 or 3), got shape {images.shape}")
        if images.dtype != np.uint8:
            raise ValueError(f"expected uint8 images, got {images.dtype}")
        if images.shape[-1] == 1:
            images = np.repeat(images, 3, axis=-1)
        outputs = [
            np.asarray(self.features(images[start : start + self.batch_size]), dtype=np.float32)
            for start in range(0, len(images), self.batch_size)
        ]
        if not outputs:
            return np.zeros((0, 0), np.float32)
        features = np.concatenate(outputs)
        if features.ndim != 2:
            raise EvaluationError(f"feature network {self.identity} returned shape {features.shape}, expected (N, D)")
        return features

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.identity!r})"


def extract_with_progress(extractor: FeatureExtractor, images: np.ndarray, description: str, show_progress: bool):
    """``extractor(images)``, in chunks with a progress bar when ``show_progress``."""
    if not show_progress:
        return extractor(images)
    from ddim.summary import Progress

    chunk = max(1, getattr(extractor, "batch_size", 32)) * 4
    progress = Progress(len(images), 0, description=description)
    parts = []
    try:
        for start in range(0, len(images), chunk):
            parts.append(extractor(images[start : start + chunk]))
            progress.update(min(start + chunk, len(images)), "")
    finally:
        progress.close()
    return np.concatenate(parts)
