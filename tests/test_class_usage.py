"""benchmarks.studies.class_usage: how much a class-conditional model's denoising uses the class."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.studies import class_usage
from tests.test_classes import pipe  # noqa: F401  (the module's tiny class-conditional pipeline)


def test_wrong_labels_are_always_another_class():
    labels = np.arange(300) % 3
    wrong = class_usage.wrong_labels(labels, 3, seed=0)
    assert np.all(wrong != labels) and set(wrong) == {0, 1, 2}


def test_a_model_that_uses_its_class_gains_and_one_that_ignores_it_does_not(pipe):  # noqa: F811
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 16, 16, 3), dtype=np.uint8)
    labels = np.array([0, 1, 2, 0, 1, 2])
    result = class_usage.class_usage(pipe, images, labels, times=(0.5, 0.9), batch_size=4)
    assert [row["time"] for row in result["rows"]] == [0.5, 0.9] and result["images"] == 6
    for row in [*result["rows"], result["overall"]]:
        assert np.isfinite([row["right"], row["null"], row["wrong"]]).all()
        assert row["gain"] == 1 - row["right"] / row["null"]
    assert result["rows"][1]["right"] != result["rows"][1]["null"]  # the tiny model's classes change its output

    # Every class vector made the null class's: the class changes nothing, so there is no gain.
    params = pipe.variables["params"]
    table = params["network"]["classes"]["table"]["embedding"]
    ignoring = jax.tree_util.tree_map(lambda x: x, params)
    ignoring["network"]["classes"]["table"]["embedding"] = jnp.broadcast_to(table[-1], table.shape)
    blind = type(pipe)(pipe.config, {**pipe.variables, "params": ignoring})
    result = class_usage.class_usage(blind, images, labels, times=(0.5, 0.9), batch_size=4)
    for row in result["rows"]:
        assert row["right"] == row["null"] == row["wrong"] and row["gain"] == 0
