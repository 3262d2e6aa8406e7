"""The class-consistency classifier (ddim/evaluation/class_consistency.py) against hand computations."""

import numpy as np
import pytest

from ddim.evaluation import class_consistency as consistency

# Two classes in 2-d, each spread only along x: class 0 at (-2, 0) and (2, 0), mean (0, 0); class 1 at (0, 1) and
# (4, 1), mean (2, 1). Pooled within-class covariance: four x-deviations of +-2 over 4 - 2 degrees of freedom,
# S = diag(8, 0); tr(S) / 2 = 4. A fifth point has no class (label -1) and must change nothing.
FEATURES = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 1.0], [4.0, 1.0], [50.0, -50.0]])
LABELS = np.array([0, 0, 1, 1, -1])


def test_the_fit_is_the_shrunk_pooled_covariance_metric():
    # Shrinkage 0.5: (S + 4 I) / 2 = diag(6, 2); weights S^-1 m_k = (0, 0) and (1/3, 1/2); offsets -m S^-1 m / 2.
    classifier = consistency.fit(FEATURES, LABELS, 3, shrinkage=0.5)
    np.testing.assert_allclose(classifier.weights, [[0, 1 / 3, 0], [0, 1 / 2, 0]])
    np.testing.assert_allclose(classifier.offsets[:2], [0, -(4 / 6 + 1 / 2) / 2])
    assert classifier.offsets[2] == -np.inf  # class 2 has no training image
    assert classifier.train_num == 4 and classifier.num_classes == 3


def test_the_metric_decides_and_shrinkage_one_is_the_euclidean_nearest_mean():
    # (1.5, 0): squared Euclidean distances 2.25 to class 0 and 1.25 to class 1; in diag(6, 2): 0.375 and 0.542.
    point = [[1.5, 0.0]]
    assert consistency.predict(consistency.fit(FEATURES, LABELS, 3, shrinkage=0.5), point).tolist() == [0]
    assert consistency.predict(consistency.fit(FEATURES, LABELS, 3, shrinkage=1.0), point).tolist() == [1]
    # Far from everything, a class without images is still never predicted.
    predicted = consistency.predict(consistency.fit(FEATURES, LABELS, 3), [[0.0, -9.0], [3.0, 9.0], [-40.0, 0.0]])
    assert predicted.dtype == np.int32 and predicted.tolist() == [0, 1, 0]


def test_one_image_per_class_falls_back_to_the_euclidean_metric():
    classifier = consistency.fit([[0.0, 0.0], [4.0, 0.0]], [0, 1], 2)
    assert consistency.predict(classifier, [[1.0, 5.0], [3.0, -5.0]]).tolist() == [0, 1]


def test_accuracy_counts_only_images_with_a_class_and_chance_is_one_over_the_classes():
    assert consistency.accuracy([0, 1, 1, 2], [0, 1, 2, -1]) == pytest.approx(2 / 3)
    assert consistency.accuracy([0, 1], [-1, -1]) is None
    assert consistency.chance(102) == pytest.approx(1 / 102)
    with pytest.raises(ValueError, match="predictions"):
        consistency.accuracy([0, 1], [0])


def test_a_real_looking_problem_is_classified_better_than_chance():
    """Gaussian classes in 64-d with correlated noise: near perfect on held-out points."""
    rng = np.random.default_rng(0)
    means = rng.normal(0, 1, (5, 64))
    mixing = rng.normal(0, 1, (64, 64)) / 8

    def draw(count):
        labels = rng.integers(0, 5, count)
        return means[labels] + rng.normal(0, 1, (count, 64)) @ mixing, labels

    train, train_labels = draw(400)
    test, test_labels = draw(200)
    classifier = consistency.fit(train, train_labels, 5)
    assert consistency.accuracy(consistency.predict(classifier, test), test_labels) > 0.95


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="no labelled"):
        consistency.fit(FEATURES[:1], [-1], 2)
    with pytest.raises(ValueError, match="out of range"):
        consistency.fit(FEATURES[:2], [0, 5], 2)
    with pytest.raises(ValueError, match="shrinkage"):
        consistency.fit(FEATURES, LABELS, 3, shrinkage=1.5)
    with pytest.raises(ValueError, match=r"\(N, 2\)"):
        consistency.predict(consistency.fit(FEATURES, LABELS, 3), np.zeros((1, 3)))
