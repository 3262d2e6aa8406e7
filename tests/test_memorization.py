"""benchmarks.studies.memorization: samples against a model's training and held-out images, set for set."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.studies import holdout_size, memorization


def test_a_copying_generator_sits_closer_to_its_training_images_than_a_fresh_one():
    rng = np.random.default_rng(0)
    train, held_out = rng.normal(size=(600, 8)), rng.normal(size=(200, 8))
    fresh = memorization.compare(rng.normal(size=(400, 8)), train, held_out, subsets=3)
    copies = memorization.compare(train[:400] + 0.01 * rng.normal(size=(400, 8)), train, held_out, subsets=3)

    assert 0.85 < fresh["median_distance_ratio"] < 1.15 and abs(fresh["share_closer_to_train"] - 0.5) < 0.1
    # a subset holds a third of the copied images: those sit at distance 0, the rest as a fresh sample's
    assert copies["median_distance_ratio"] < fresh["median_distance_ratio"] - 0.08
    assert copies["share_closer_to_train"] > 0.6
    # FID of the copies: lower against training subsets than against the held-out images; the real sets' gap is
    # chance alone
    assert copies["fid_train"] < copies["fid_held_out"]
    assert copies["real_fid_train_vs_train"] == pytest.approx(copies["real_fid_train_vs_held_out"], abs=0.5)
    assert (fresh["num"], fresh["set_size"], fresh["subsets"]) == (400, 200, 3)


def test_too_few_training_images_for_two_subsets_is_one_error_line():
    rng = np.random.default_rng(1)
    with pytest.raises(SystemExit, match="^error: 300 training images are too few"):
        memorization.compare(rng.normal(size=(50, 4)), rng.normal(size=(300, 4)), rng.normal(size=(200, 4)))


def test_nearest_distances_match_a_direct_computation():
    rng = np.random.default_rng(2)
    points, reference = rng.normal(size=(7, 3)), rng.normal(size=(5, 3))
    direct = np.linalg.norm(points[:, None] - reference[None], axis=-1).min(1)
    np.testing.assert_allclose(memorization.nearest_distances(points, reference, chunk=3), direct, rtol=1e-9)


def test_a_small_training_set_is_compared_with_unseen_subsets_of_its_size():
    rng = np.random.default_rng(3)
    train, held_out = rng.normal(size=(20, 8)), rng.normal(size=(400, 8))
    fresh = memorization.compare_small(rng.normal(size=(300, 8)), train, held_out, subsets=10)
    copies = memorization.compare_small(train[rng.integers(0, 20, 300)] + 0.01 * rng.normal(size=(300, 8)), train,
                                        held_out, subsets=10)
    assert 0.85 < fresh["median_distance_ratio"] < 1.15 and abs(fresh["share_closer_to_train"] - 0.5) < 0.1
    assert copies["median_distance_ratio"] < 0.05 and copies["share_closer_to_train"] == 1.0
    assert (fresh["set_size"], fresh["subsets"]) == (20, 10)
    with pytest.raises(SystemExit, match="^error: 10 held-out images are fewer than the 20 training images"):
        memorization.compare_small(rng.normal(size=(5, 8)), train, held_out[:10])


def test_the_held_out_score_spreads_less_with_more_held_out_images():
    rng = np.random.default_rng(4)
    rows = holdout_size.kid_spread(rng.normal(size=(300, 16)), [5, 50], reference=100, draws=30)
    assert [row["held_out"] for row in rows] == [5, 50]
    assert rows[0]["kid_std"] > 2 * rows[1]["kid_std"]  # same distribution: the mean is 0 up to the spread
    assert all(abs(row["kid_mean"]) < 3 * row["kid_std"] / np.sqrt(row["draws"]) + 1e-3 for row in rows)
    with pytest.raises(SystemExit, match="too few"):
        holdout_size.kid_spread(rng.normal(size=(50, 4)), [40], reference=20, draws=2)
