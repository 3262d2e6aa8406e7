"""KID and FID maths (ddim/evaluation/metrics.py) against hand-computed values on small synthetic features."""

import math

import numpy as np
import pytest

from ddim.evaluation import metrics


def test_polynomial_kernel_is_the_cubic_kid_kernel():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    y = np.array([[1.0, 1.0], [0.0, 0.0]])
    # k(x, y) = (x.y / d + 1)^3 with d = 2
    expected = np.array([[1.5**3, 1.0], [1.5**3, 1.0], [3.0**3, 1.0]])
    np.testing.assert_allclose(metrics.polynomial_kernel(x, y), expected)
    np.testing.assert_allclose(metrics.polynomial_kernel(x, y, degree=1, gamma=1.0, coef0=0.0), x @ y.T)


def test_polynomial_kernel_rejects_mismatched_dimensions():
    with pytest.raises(ValueError, match="dimensions differ"):
        metrics.polynomial_kernel(np.ones((2, 3)), np.ones((2, 4)))


def test_mmd2_unbiased_hand_computed():
    # d = 1, k(x, y) = (x y + 1)^3.  x = {0, 1}, y = {2, 3}:
    #   xx off-diagonal: k(0,1) = 1            -> (1 + 1) / (2 * 1) = 1
    #   yy off-diagonal: k(2,3) = 7^3 = 343    -> 343
    #   xy: k(0,2)=1, k(0,3)=1, k(1,2)=27, k(1,3)=64 -> mean 93/4
    x = np.array([[0.0], [1.0]])
    y = np.array([[2.0], [3.0]])
    assert metrics.mmd2_unbiased(x, y) == pytest.approx(1 + 343 - 2 * 93 / 4)


def test_mmd2_unbiased_matches_a_double_loop():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(7, 5)), rng.normal(0.5, 1.0, size=(6, 5))

    def k(a, b):
        return (a @ b / 5 + 1) ** 3

    xx = sum(k(x[i], x[j]) for i in range(7) for j in range(7) if i != j) / (7 * 6)
    yy = sum(k(y[i], y[j]) for i in range(6) for j in range(6) if i != j) / (6 * 5)
    xy = sum(k(x[i], y[j]) for i in range(7) for j in range(6)) / (7 * 6)
    assert metrics.mmd2_unbiased(x, y) == pytest.approx(xx + yy - 2 * xy, rel=1e-12)


def test_mmd2_needs_two_samples_per_side():
    with pytest.raises(ValueError, match="at least 2"):
        metrics.mmd2_unbiased(np.ones((1, 3)), np.ones((4, 3)))


def test_kid_subsets_are_distinct_rows_of_the_right_size_and_reproducible():
    subsets = metrics.kid_subsets(30, 20, num_subsets=5, subset_size=8, rng=3)
    assert len(subsets) == 5
    for a, b in subsets:
        assert len(a) == len(set(a)) == 8 and len(b) == len(set(b)) == 8
        assert a.max() < 30 and b.max() < 20
    again = metrics.kid_subsets(30, 20, num_subsets=5, subset_size=8, rng=3)
    assert all((a1 == a2).all() and (b1 == b2).all() for (a1, b1), (a2, b2) in zip(subsets, again))
    assert not all((a1 == a2).all() for (a1, _), (a2, _) in zip(subsets, metrics.kid_subsets(30, 20, 5, 8, rng=4)))


@pytest.mark.parametrize("size", [1, 0, 21])
def test_kid_subsets_reject_impossible_sizes(size):
    with pytest.raises(ValueError):
        metrics.kid_subsets(30, 20, num_subsets=2, subset_size=size, rng=0)


def test_kid_is_mean_and_population_std_of_the_subset_mmds():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(40, 6)), rng.normal(0.3, 1.0, size=(30, 6))
    values = [metrics.mmd2_unbiased(a[i], b[j]) for i, j in metrics.kid_subsets(40, 30, 7, 10, rng=5)]
    mean, std = metrics.kid(a, b, num_subsets=7, subset_size=10, rng=5)
    assert mean == pytest.approx(np.mean(values)) and std == pytest.approx(np.std(values))


def test_kid_subset_size_is_capped_at_the_smaller_set():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(12, 4)), rng.normal(1.0, 1.0, size=(9, 4))
    # One subset of every row: a permutation of each set, and the estimator is permutation-invariant.
    mean, std = metrics.kid(a[:9], b, num_subsets=1, subset_size=1000, rng=0)
    assert mean == pytest.approx(metrics.mmd2_unbiased(a[:9], b)) and std == 0.0
    assert metrics.kid(a, b, num_subsets=3, subset_size=None, rng=0) == metrics.kid(a, b, 3, 9, rng=0)


def test_kid_of_a_set_with_itself_is_the_small_diagonal_term():
    # With x = y and one subset of all m rows the unbiased estimate is exactly
    # 2/m (mean off-diagonal kernel - mean diagonal kernel): O(1/m), about 0.
    rng = np.random.default_rng(3)
    a = rng.normal(size=(400, 16))
    k = metrics.polynomial_kernel(a, a)
    off_diagonal = (k.sum() - np.trace(k)) / (400 * 399)
    mean, std = metrics.kid(a, a, num_subsets=1, subset_size=400, rng=0)
    assert mean == pytest.approx(2 / 400 * (off_diagonal - np.trace(k) / 400)) and std == 0.0
    assert abs(mean) < 0.05


def test_kid_of_same_distribution_sets_is_about_zero_and_of_shifted_sets_is_positive():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(400, 16))
    mean_iid, _ = metrics.kid(a, rng.normal(size=(400, 16)), num_subsets=20, subset_size=100, rng=0)
    mean_shift, _ = metrics.kid(a, rng.normal(1.0, 1.0, size=(400, 16)), num_subsets=20, subset_size=100, rng=0)
    assert abs(mean_iid) < 0.02
    assert mean_shift > 0.5 and mean_shift > 20 * abs(mean_iid)


def test_feature_stats_and_running_stats_agree_with_numpy():
    rng = np.random.default_rng(4)
    # A large offset: the running sums must not lose the covariance to cancellation.
    features = (1e4 + rng.normal(size=(103, 5)) @ rng.normal(size=(5, 5))).astype(np.float32)
    mu, sigma = metrics.feature_stats(features)
    np.testing.assert_allclose(mu, features.astype(np.float64).mean(0))
    np.testing.assert_allclose(sigma, np.cov(features.astype(np.float64), rowvar=False))
    running = metrics.RunningStats()
    for start in range(0, 103, 10):
        running.update(features[start : start + 10])
    assert running.count == 103
    r_mu, r_sigma = running.stats()
    np.testing.assert_allclose(r_mu, mu, rtol=1e-12)
    np.testing.assert_allclose(r_sigma, sigma, rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError):
        metrics.RunningStats().update(features[:1]).stats()


def test_fid_of_identical_statistics_is_zero():
    rng = np.random.default_rng(5)
    features = rng.normal(size=(50, 8))
    mu, sigma = metrics.feature_stats(features)
    assert metrics.fid_from_stats(mu, sigma, mu, sigma) == pytest.approx(0.0, abs=1e-9)
    assert metrics.fid(features, features.copy()) == pytest.approx(0.0, abs=1e-9)


def test_fid_closed_form_for_diagonal_covariances():
    # ||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^1/2) = 1 + 4 + sum_i (sqrt(a_i) - sqrt(b_i))^2
    #                                                = 5 + (1 - 2)^2 + (2 - 1)^2 + (3 - 3)^2 = 7
    mu1, mu2 = np.zeros(3), np.array([1.0, 2.0, 0.0])
    s1, s2 = np.diag([1.0, 4.0, 9.0]), np.diag([4.0, 1.0, 9.0])
    assert metrics.fid_from_stats(mu1, s1, mu2, s2) == pytest.approx(7.0)
    # The distance is invariant under a common rotation (the covariances stop being diagonal).
    q, _ = np.linalg.qr(np.random.default_rng(6).normal(size=(3, 3)))
    assert metrics.fid_from_stats(q @ mu1, q @ s1 @ q.T, q @ mu2, q @ s2 @ q.T) == pytest.approx(7.0)


def test_fid_closed_form_for_non_commuting_2x2_covariances():
    # For a 2x2 matrix A with non-negative eigenvalues, Tr(A^1/2) = sqrt(Tr A + 2 sqrt(det A)).
    # S1 S2 = [[2, 3], [1, 6]]: trace 8, det 9 -> Tr (S1 S2)^1/2 = sqrt(14).
    s1, s2 = np.array([[2.0, 1.0], [1.0, 2.0]]), np.diag([1.0, 3.0])
    mu = np.zeros(2)
    assert metrics.trace_sqrt_product(s1, s2) == pytest.approx(math.sqrt(14))
    assert metrics.fid_from_stats(mu, s1, mu, s2) == pytest.approx(4 + 4 - 2 * math.sqrt(14))
    assert metrics.fid_from_stats(mu, s1, mu + [3.0, 4.0], s2) == pytest.approx(25 + 8 - 2 * math.sqrt(14))


def test_fid_of_gaussian_samples_approaches_the_closed_form():
    rng = np.random.default_rng(7)
    std1, std2 = np.array([1.0, 2.0, 0.5, 1.0]), np.array([2.0, 1.0, 0.5, 3.0])
    mu1, mu2 = np.zeros(4), np.array([0.5, -0.5, 0.0, 1.0])
    a = mu1 + std1 * rng.normal(size=(20000, 4))
    b = mu2 + std2 * rng.normal(size=(20000, 4))
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((std1 - std2) ** 2)  # = 1.5 + 6 = 7.5
    assert metrics.fid(a, b) == pytest.approx(expected, rel=0.03)


def test_fid_with_singular_covariances_is_finite():
    rng = np.random.default_rng(8)
    a, b = rng.normal(size=(5, 64)), rng.normal(size=(6, 64)) + 0.5  # fewer images than dimensions
    value = metrics.fid(a, b)
    assert np.isfinite(value) and value > 0


@pytest.mark.parametrize("rows", [5, 20, 40])
def test_fid_low_rank_path_equals_the_full_one(rows):
    rng = np.random.default_rng(9)
    a = rng.normal(size=(rows, 24)) @ rng.normal(size=(24, 24))
    b = rng.normal(0.3, 1.0, size=(30, 24)) @ rng.normal(size=(24, 24))
    mu_b, sigma_b = metrics.feature_stats(b)
    full = metrics.fid_from_stats(*metrics.feature_stats(a), mu_b, sigma_b)
    sigma_a = metrics.feature_stats(a)[1]
    assert metrics.trace_sqrt_product_low_rank(a, sigma_b) == pytest.approx(
        metrics.trace_sqrt_product(sigma_a, sigma_b), rel=1e-7
    )
    assert metrics.fid_from_features_and_stats(a, mu_b, sigma_b) == pytest.approx(full, rel=1e-7)
    assert metrics.fid(a, b) == pytest.approx(full, rel=1e-7)


def test_fid_rejects_inconsistent_shapes():
    with pytest.raises(ValueError, match="inconsistent"):
        metrics.fid_from_stats(np.zeros(2), np.eye(2), np.zeros(3), np.eye(3))
