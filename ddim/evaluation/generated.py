"""Features of generated images, batch by batch, keeping only what the metrics need.

Batch ``i`` of an evaluation is ``generate(count, batch_seed(seed, i))``; only
features are kept (KID) or summed into running statistics (FID), never the
images, so memory does not grow with the number of images beyond one feature
vector per image. :func:`cheap_kid` is the quick KID the training loop
monitors.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ddim.evaluation import metrics
from ddim.evaluation.features import EvaluationError, FeatureExtractor
from ddim.spec import SamplingSpec


def batch_seed(seed: int, index: int) -> int:
    """The sampling seed of generated batch ``index`` (distinct per batch, a pure function of both)."""
    state = np.random.SeedSequence([seed % 2**32, index]).generate_state(1)[0]
    return int(state >> 1)  # fits a signed 32-bit int


def generated_features(
    generate: Callable[[int, int], np.ndarray],
    num: int,
    batch_size: int,
    seed: int,
    kid_extractor: FeatureExtractor | None,
    fid_extractor: FeatureExtractor | None = None,
    on_batch: Callable[[int], None] | None = None,
    on_fid_features: Callable[[np.ndarray], None] | None = None,
) -> tuple[np.ndarray | None, tuple[np.ndarray, np.ndarray] | None]:
    """Generate ``num`` images batch by batch and keep only their features.

    ``generate(count, seed) -> uint8 images``. Returns the KID features
    ``(num, D)`` (None without ``kid_extractor``) and the FID mean and
    covariance (None without ``fid_extractor``), accumulated with
    :class:`ddim.metrics.RunningStats`. When both are the same extractor each
    image is featurised once. ``on_fid_features(features)`` sees each batch's
    FID features (the class-consistency classifier reads them).
    """
    kid_features = None  # preallocated once the feature size is known: no copies at the end
    running = metrics.RunningStats() if fid_extractor is not None else None
    for index, start in enumerate(range(0, num, batch_size)):
        count = min(batch_size, num - start)
        images = generate(count, batch_seed(seed, index))
        features = kid_extractor(images) if kid_extractor is not None else None
        if features is not None:
            if kid_features is None:
                kid_features = np.empty((num, features.shape[1]), np.float32)
            kid_features[start : start + count] = features
        if running is not None:
            fid_features = features if fid_extractor is kid_extractor else fid_extractor(images)
            running.update(fid_features)
            if on_fid_features is not None:
                on_fid_features(fid_features)
        del images
        if on_batch is not None:
            on_batch(start + count)
    return kid_features, (running.stats() if running is not None else None)


CHEAP_KID_SPEC = SamplingSpec(steps=5)
"""How :func:`cheap_kid` samples by default: 5 deterministic DDIM steps, as the Keras example monitors KID."""


def cheap_kid(
    model,
    variables,
    real_features: np.ndarray,
    extractor: FeatureExtractor,
    *,
    num_images: int = 500,
    spec: SamplingSpec = CHEAP_KID_SPEC,
    steps: int | None = None,
    seed: int = 0,
    batch_size: int = 64,
    num_subsets: int = 20,
    subset_size: int = 1000,
) -> tuple[float, float]:
    """A quick KID ``(mean, std)`` for monitoring training, from a model and its (EMA) variables.

    ``model`` is a :class:`ddim.model.DiffusionModel`, ``variables`` its
    ``{"params", "batch_stats"}``; ``real_features`` come from
    :func:`real_features` with the same ``extractor`` (usually
    :func:`kid_feature_extractor`, InceptionV3 at 75x75). Images are sampled
    with ``spec``; ``steps`` alone changes only its number of steps (the
    training loop's ``train.kid_steps``). Subsets are capped at the smaller
    set; images are generated and featurised batch by batch.
    """
    from ddim.sampling import generate_images

    spec = SamplingSpec.of(spec, steps=steps)
    if num_images < 2:
        raise EvaluationError(f"KID needs at least 2 generated images, got {num_images}")

    def generate(count: int, batch_seed_: int) -> np.ndarray:
        return generate_images(model, variables, count, spec, seed=batch_seed_, batch_size=count)

    features, _ = generated_features(generate, num_images, batch_size, seed, extractor)
    return metrics.kid(real_features, features, num_subsets, subset_size, rng=seed % 2**32)
