"""Sample-quality metrics on feature vectors: KID and FID (numpy only).

Both compare two sets of feature vectors, one row per image (in ``ddim eval``
the 2048-d global-average-pooled InceptionV3 features, see
:mod:`ddim.evaluation`):

* **KID**, the kernel inception distance (Binkowski et al. 2018,
  "Demystifying MMD GANs", arXiv:1801.01401): the unbiased estimate of the
  squared maximum mean discrepancy with the cubic polynomial kernel
  ``k(x, y) = (x . y / d + 1) ** 3``, averaged over random subsets; reported
  as the mean and the standard deviation over the subsets. It is unbiased, so
  two samples of the same distribution give values scattered around 0
  (slightly negative values are normal).
* **FID**, the Fréchet inception distance (Heusel et al. 2017): the Fréchet
  distance between Gaussians fitted to the two sets,
  ``||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^(1/2))``. It is biased (it
  depends on the number of images), so only compare FIDs computed from the same
  number of images.
"""

from __future__ import annotations

import numpy as np


def _as_features(features, name: str = "features") -> np.ndarray:
    features = np.asarray(features)
    if features.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (images, dims), got shape {features.shape}")
    if not np.issubdtype(features.dtype, np.floating):
        features = features.astype(np.float64)
    return features


def polynomial_kernel(x, y, degree: int = 3, gamma: float | None = None, coef0: float = 1.0) -> np.ndarray:
    """``k(x_i, y_j) = (gamma * x_i . y_j + coef0) ** degree`` for all row pairs; float64 ``(len(x), len(y))``.

    ``gamma`` defaults to ``1 / d`` (``d`` the feature dimension): KID's kernel.
    The dot products are computed in the inputs' precision (float32 features
    keep the matrix products fast), the power in float64.
    """
    x, y = _as_features(x, "x"), _as_features(y, "y")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"feature dimensions differ: {x.shape[1]} and {y.shape[1]}")
    if gamma is None:
        gamma = 1.0 / x.shape[1]
    dots = (x @ y.T).astype(np.float64)
    return (gamma * dots + coef0) ** degree


def mmd2_unbiased(x, y, kernel=polynomial_kernel) -> float:
    """The unbiased estimate of MMD^2 between samples ``x`` (m rows) and ``y`` (n rows).

    ``sum_{i != j} k(x_i, x_j) / (m (m - 1)) + sum_{i != j} k(y_i, y_j) / (n (n - 1))
    - 2 sum_{i, j} k(x_i, y_j) / (m n)`` (Gretton et al. 2012, eq. 3).
    """
    x, y = _as_features(x, "x"), _as_features(y, "y")
    m, n = len(x), len(y)
    if m < 2 or n < 2:
        raise ValueError(f"the unbiased MMD needs at least 2 samples on each side, got {m} and {n}")
    k_xx, k_yy, k_xy = kernel(x, x), kernel(y, y), kernel(x, y)
    term_xx = (k_xx.sum() - np.trace(k_xx)) / (m * (m - 1))
    term_yy = (k_yy.sum() - np.trace(k_yy)) / (n * (n - 1))
    return float(term_xx + term_yy - 2.0 * k_xy.mean())


def kid_subsets(num_a: int, num_b: int, num_subsets: int, subset_size: int, rng) -> list[tuple[np.ndarray, np.ndarray]]:
    """The row indices of each KID subset: ``subset_size`` distinct rows of each set per subset.

    Subsets are drawn independently of each other (as in Binkowski et al.'s
    code), without replacement inside a subset.
    """
    if num_subsets < 1:
        raise ValueError(f"num_subsets must be >= 1, got {num_subsets}")
    if subset_size < 2:
        raise ValueError(f"subset_size must be >= 2, got {subset_size}")
    if subset_size > min(num_a, num_b):
        raise ValueError(f"subset_size {subset_size} is larger than the sets ({num_a} and {num_b} rows)")
    rng = np.random.default_rng(rng)
    return [
        (rng.choice(num_a, subset_size, replace=False), rng.choice(num_b, subset_size, replace=False))
        for _ in range(num_subsets)
    ]


def kid(features_a, features_b, num_subsets: int = 100, subset_size: int | None = 1000, rng=0) -> tuple[float, float]:
    """KID between two feature sets: ``(mean, std)`` of the unbiased MMD^2 over random subsets.

    ``subset_size`` is capped at the size of the smaller set (``None``: the
    smaller set's size); ``rng`` is a seed or a ``numpy.random.Generator``.
    The standard deviation is the population one (``ddof=0``) over subsets, as
    in Binkowski et al.'s and torch-fidelity's code. The defaults (100 subsets
    of 1000) are torch-fidelity's.
    """
    a, b = _as_features(features_a, "features_a"), _as_features(features_b, "features_b")
    size = min(len(a), len(b)) if subset_size is None else min(subset_size, len(a), len(b))
    values = [mmd2_unbiased(a[i], b[j]) for i, j in kid_subsets(len(a), len(b), num_subsets, size, rng)]
    return float(np.mean(values)), float(np.std(values))


def feature_stats(features) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (unbiased, ``ddof=1``, as in pytorch-fid) of the rows of ``features``, in float64."""
    features = _as_features(features).astype(np.float64)
    if len(features) < 2:
        raise ValueError(f"a covariance needs at least 2 feature vectors, got {len(features)}")
    return features.mean(axis=0), np.cov(features, rowvar=False)


class RunningStats:
    """:func:`feature_stats` of a stream of feature batches, without keeping the features.

    Sums are float64 and taken around the first batch's mean (a shift that keeps
    the covariance free of cancellation), so the result equals
    :func:`feature_stats` of the concatenated batches up to rounding.
    """

    def __init__(self):
        self.count = 0
        self._shift = None
        self._sum = None
        self._outer = None

    def update(self, features) -> "RunningStats":
        features = _as_features(features).astype(np.float64)
        if not len(features):
            return self
        if self._shift is None:
            self._shift = features.mean(axis=0)
            self._sum = np.zeros_like(self._shift)
            self._outer = np.zeros((features.shape[1], features.shape[1]))
        centred = features - self._shift
        self._sum += centred.sum(axis=0)
        self._outer += centred.T @ centred
        self.count += len(features)
        return self

    def stats(self) -> tuple[np.ndarray, np.ndarray]:
        if self.count < 2:
            raise ValueError(f"a covariance needs at least 2 feature vectors, got {self.count}")
        mean_centred = self._sum / self.count
        sigma = (self._outer - self.count * np.outer(mean_centred, mean_centred)) / (self.count - 1)
        return self._shift + mean_centred, (sigma + sigma.T) / 2.0


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
    """The symmetric square root of a symmetric positive semi-definite matrix (eigenvalues clipped at 0)."""
    values, vectors = np.linalg.eigh((matrix + matrix.T) / 2.0)
    return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


def trace_sqrt_product(sigma1, sigma2) -> float:
    """``Tr((S1 S2)^(1/2))`` for covariance matrices S1, S2.

    ``S1 S2`` is similar to the symmetric PSD matrix ``S1^(1/2) S2 S1^(1/2)``,
    so their square roots have the same trace: the sum of the square roots of
    the latter's eigenvalues. Only symmetric eigendecompositions are needed
    (stable, real, no complex parts to discard), and singular covariances
    (fewer images than dimensions) are fine.
    """
    root1 = _sqrt_psd(np.asarray(sigma1, np.float64))
    middle = root1 @ np.asarray(sigma2, np.float64) @ root1
    values = np.linalg.eigvalsh((middle + middle.T) / 2.0)
    return float(np.sqrt(np.clip(values, 0.0, None)).sum())


def trace_sqrt_product_low_rank(features, sigma) -> float:
    """``Tr((S1 S2)^(1/2))`` where S1 is the covariance of ``features`` (n rows) and S2 is ``sigma``.

    With ``A`` the centred features over ``sqrt(n - 1)``, ``S1 = A^T A`` and the
    non-zero eigenvalues of ``S1 S2 = A^T (A S2)`` are those of the n x n
    symmetric PSD matrix ``A S2 A^T``. When there are fewer images than
    dimensions (e.g. 1638 real images, 2048 features) this is much cheaper than
    two d x d eigendecompositions, and it gives the same value.
    """
    features = _as_features(features).astype(np.float64)
    centred = (features - features.mean(axis=0)) / np.sqrt(len(features) - 1)
    middle = centred @ np.asarray(sigma, np.float64) @ centred.T
    values = np.linalg.eigvalsh((middle + middle.T) / 2.0)
    return float(np.sqrt(np.clip(values, 0.0, None)).sum())


def fid_from_features_and_stats(features, mu, sigma) -> float:
    """FID between a feature set and a Gaussian given by its statistics (e.g. :class:`RunningStats`).

    Uses :func:`trace_sqrt_product_low_rank` when the set has fewer rows than
    dimensions, :func:`fid_from_stats` otherwise; the result is the same.
    """
    features = _as_features(features)
    mu_a, sigma_a = feature_stats(features)
    if len(features) - 1 >= features.shape[1]:
        return fid_from_stats(mu_a, sigma_a, mu, sigma)
    mu, sigma = np.asarray(mu, np.float64), np.atleast_2d(np.asarray(sigma, np.float64))
    if mu.shape != mu_a.shape or sigma.shape != sigma_a.shape:
        raise ValueError(f"inconsistent shapes: mu {mu_a.shape}, {mu.shape}; sigma {sigma_a.shape}, {sigma.shape}")
    diff = mu_a - mu
    value = diff @ diff + np.trace(sigma_a) + np.trace(sigma) - 2.0 * trace_sqrt_product_low_rank(features, sigma)
    return float(max(value, 0.0))


def fid_from_stats(mu1, sigma1, mu2, sigma2) -> float:
    """The Fréchet distance ``||mu1 - mu2||^2 + Tr(S1) + Tr(S2) - 2 Tr((S1 S2)^(1/2))`` (>= 0)."""
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    sigma1, sigma2 = np.atleast_2d(np.asarray(sigma1, np.float64)), np.atleast_2d(np.asarray(sigma2, np.float64))
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape or sigma1.shape != (mu1.size, mu1.size):
        raise ValueError(f"inconsistent shapes: mu {mu1.shape}, {mu2.shape}; sigma {sigma1.shape}, {sigma2.shape}")
    diff = mu1 - mu2
    value = diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2.0 * trace_sqrt_product(sigma1, sigma2)
    return float(max(value, 0.0))


def fid(features_a, features_b) -> float:
    """FID between two feature sets (see :func:`fid_from_stats`)."""
    return fid_from_features_and_stats(features_a, *feature_stats(features_b))
