"""Class consistency: does a generated image look like the class it was asked for?

A classifier on the FID features (the FID Inception's 2048-d pool3 vectors)
is fitted on the real training images and their labels, then predicts the
class of every generated image; its accuracy against the asked classes is
set beside its accuracy on the real validation images (the ceiling: a
perfect generator scores about that) and chance, ``1 / num_classes``.

The classifier is the nearest class mean in the Mahalanobis metric of the
pooled within-class covariance, shrunk towards a multiple of the identity:
linear discriminant analysis with equal priors (Hastie, Tibshirani and
Friedman, *The Elements of Statistical Learning*, 2nd ed., eq. 4.10), with
Friedman's (1989) regularisation ``(1 - a) S + a tr(S)/D I``. ``a = 1`` is
the plain Euclidean nearest class mean. It is fitted in closed form (one
``D x D`` solve), so it is deterministic and takes about a second; on
Oxford Flowers at 32x32 it classifies 76% of the validation images
correctly, against 52% for the Euclidean nearest mean and 77% for an
iteratively trained logistic-regression probe. Equal priors: a class is
judged by how the image looks, not by how common the class is.

Pure numpy functions; nothing here knows where the features come from.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

SHRINKAGE = 0.1
"""Weight of the scaled identity in the shrunk covariance (Flowers at 32px: 0.01 to 0.3 all within 1.2 points)."""
NAME = f"nearest class mean, pooled covariance shrunk {SHRINKAGE:g}"
"""What :func:`fit` with the default shrinkage is, as the evaluation record names it."""


class Classifier(NamedTuple):
    """A fitted classifier: ``scores = features @ weights + offsets``, the class is the largest score."""

    weights: np.ndarray
    """``(D, K)``: the class means through the inverse shrunk covariance, ``S^-1 m_k``."""
    offsets: np.ndarray
    """``(K,)``: ``-m_k S^-1 m_k / 2``; ``-inf`` for a class without training images (never predicted)."""
    train_num: int
    """Labelled training images it was fitted on."""

    @property
    def num_classes(self) -> int:
        return len(self.offsets)


def fit(features, labels, num_classes: int, shrinkage: float = SHRINKAGE) -> Classifier:
    """The classifier of ``features`` ``(N, D)`` with int ``labels`` ``(N,)`` in ``[0, num_classes)``.

    Images labelled -1 (no class) are left out. The covariance is the pooled
    within-class one (deviations from each class's mean, divided by
    ``N - classes present``), shrunk by ``shrinkage`` in [0, 1].
    """
    features, labels = np.asarray(features, np.float64), np.asarray(labels)
    if features.ndim != 2 or labels.shape != features.shape[:1]:
        raise ValueError(f"features (N, D) and labels (N,) expected, got {features.shape} and {labels.shape}")
    if not 0.0 <= shrinkage <= 1.0:
        raise ValueError(f"shrinkage must be in [0, 1], got {shrinkage}")
    labelled = labels >= 0
    features, labels = features[labelled], labels[labelled].astype(np.int64)
    if len(labels) == 0:
        raise ValueError("no labelled training image to fit the classifier on")
    if labels.max() >= num_classes:
        raise ValueError(f"label {labels.max()} is out of range for {num_classes} classes")
    counts = np.bincount(labels, minlength=num_classes)
    means = np.zeros((num_classes, features.shape[1]))
    np.add.at(means, labels, features)
    present = counts > 0
    means[present] /= counts[present, None]
    deviations = features - means[labels]
    covariance = deviations.T @ deviations / max(len(labels) - int(present.sum()), 1)
    scale = np.trace(covariance) / len(covariance)
    if scale > 0:
        shrunk = (1.0 - shrinkage) * covariance + shrinkage * scale * np.eye(len(covariance))
    else:  # every image equals its class mean (one image per class): the Euclidean metric
        shrunk = np.eye(len(covariance))
    weights = np.linalg.solve(shrunk, means.T)
    offsets = np.where(present, -0.5 * np.einsum("kd,dk->k", means, weights), -np.inf)
    return Classifier(weights, offsets, int(len(labels)))


def predict(classifier: Classifier, features) -> np.ndarray:
    """The int32 class id of each of ``features`` ``(N, D)``: the nearest class mean in the classifier's metric."""
    features = np.asarray(features, np.float64)
    if features.ndim != 2 or features.shape[1] != classifier.weights.shape[0]:
        raise ValueError(f"features of shape (N, {classifier.weights.shape[0]}) expected, got {features.shape}")
    return np.argmax(features @ classifier.weights + classifier.offsets, axis=1).astype(np.int32)


def accuracy(predicted, wanted) -> float | None:
    """The fraction of ``predicted`` equal to ``wanted`` over the images with a class (``wanted >= 0``);
    None when there is none."""
    predicted, wanted = np.asarray(predicted), np.asarray(wanted)
    if predicted.shape != wanted.shape:
        raise ValueError(f"{predicted.shape} predictions for {wanted.shape} classes")
    counted = wanted >= 0
    return float(np.mean(predicted[counted] == wanted[counted])) if counted.any() else None


def chance(num_classes: int) -> float:
    """The accuracy of guessing: ``1 / num_classes``."""
    return 1.0 / num_classes
