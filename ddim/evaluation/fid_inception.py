"""The standard FID Inception as a feature extractor: the network with its weights, jitted and sharded.

The network (:mod:`ddim.evaluation.fid_network`) knows nothing about files,
and the weights (:mod:`ddim.evaluation.fid_weights`) are found and converted
without running it; this module puts the two together.
:func:`standard_factory` is what ``ddim eval`` uses: it finds (and converts
once) the weights, then builds one :class:`FIDInceptionExtractor` on first
use. The network's own names (:func:`fid_inception`, :func:`preprocess`,
:func:`expected_shapes`, ...) are re-exported here, where they always were.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import jax
import numpy as np

from ddim import parallel
from ddim.evaluation.features import FID_IMAGE_SIZE, EvaluationError, FeatureExtractor, FeatureFactory
from ddim.evaluation.fid_network import (  # noqa: F401  (the network's public names, re-exported)
    BN_EPSILON,
    FEATURE_DIM,
    NETWORK_NAME,
    FIDInception,
    check_weights,
    expected_shapes,
    fid_inception,
    flax_variables,
    preprocess,
    resize_matrix,
)
from ddim.evaluation.fid_weights import STANDARD_DIGEST, load_converted, resolve_fid_weights


@functools.cache
def _features_fn(precision: str, sharding) -> Callable:
    """``f(variables, uint8 images) -> (N, 2048)``, jitted once per process (extractors share compilations)."""
    network = fid_inception(precision)

    def features(variables, images):
        return network.apply(variables, preprocess(images))

    return jax.jit(features, out_shardings=sharding)


class FIDInceptionExtractor(FeatureExtractor):
    """The standard FID Inception as a :class:`FeatureExtractor`: jitted, batched, sharded over the devices.

    Each chunk of at most ``batch_size`` images is padded to a power of two
    (rounded up to the device count: few compilations per input size), split
    along the mesh's ``data`` axis like sampling, and resized, scaled and
    featurised in one compiled function. ``weights`` are canonical arrays
    (:func:`ddim.evaluation.fid_weights.load_converted`); ``digest`` their sha256.
    """

    image_size = FID_IMAGE_SIZE

    def __init__(self, weights: dict[str, np.ndarray], digest: str, batch_size: int = 32,
                 precision: str = "highest", identity: str | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        check_weights(weights, "the weights")
        self.digest = digest
        self.identity = identity or f"{NETWORK_NAME}-pool3@{FID_IMAGE_SIZE}px:sha256={digest[:16]}"
        self.mesh = parallel.data_mesh()
        devices = self.mesh.devices.size
        self.batch_size = -(-batch_size // devices) * devices
        self.variables = parallel.replicate(flax_variables(weights), self.mesh)
        self._sharding = parallel.batch_sharded(self.mesh)
        self._features = _features_fn(precision, self._sharding)

    @classmethod
    def from_file(cls, path: str | os.PathLike, batch_size: int = 32, precision: str = "highest"):
        """From a converted ``.npz`` (its digest is checked)."""
        weights, meta = load_converted(path)
        return cls(weights, meta["digest"], batch_size, precision)

    def features(self, images: np.ndarray) -> np.ndarray:
        count = len(images)
        # Pad to a power of two (at most batch_size), a multiple of the device count: few compiled
        # shapes, little wasted work on a short last chunk.
        devices = self.mesh.devices.size
        size = min(self.batch_size, 1 << max(count - 1, 0).bit_length())
        size = -(-size // devices) * devices
        padded = np.zeros((size, *images.shape[1:]), np.uint8)
        padded[:count] = images
        batch = jax.make_array_from_callback(padded.shape, self._sharding, lambda index: padded[index])
        return np.asarray(parallel.to_host(self._features(self.variables, batch)))[:count]


def standard_factory(
    weights: str | os.PathLike | None = None,
    batch_size: int = 32,
    log: Callable[[str], None] | None = None,
    precision: str = "highest",
) -> FeatureFactory:
    """``factory(image_size) -> FIDInceptionExtractor`` (only 299): resolves (and converts) the weights now."""
    path = resolve_fid_weights(weights, log=log)
    loaded: dict[str, Any] = {}

    def factory(image_size: int = FID_IMAGE_SIZE) -> FIDInceptionExtractor:
        if image_size != FID_IMAGE_SIZE:
            raise EvaluationError(f"the FID Inception takes {FID_IMAGE_SIZE}px inputs, not {image_size}px")
        if "extractor" not in loaded:
            arrays, meta = load_converted(path)
            if meta["digest"] != STANDARD_DIGEST and log is not None:
                log(f"warning: {path} holds weights with sha256 {meta['digest'][:16]}..., not the standard "
                    f"{STANDARD_DIGEST[:16]}...; FIDs are not comparable with published ones")
            loaded["extractor"] = FIDInceptionExtractor(arrays, meta["digest"], batch_size, precision)
        return loaded["extractor"]

    return factory
