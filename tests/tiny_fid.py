"""A small random network in place of the FID Inception (its weights may be absent where the tests run).

A module of its own, without the fixtures of tests/conftest.py, so that child processes the tests start can use
it too (tests/rebuild_worker.py).
"""

from __future__ import annotations

from ddim import evaluation


def tiny_network(image_size: int):
    """A random conv net with InceptionV3's output shape (N, 2048); fixed seeds, so always the same weights."""
    _, keras = evaluation.tf_keras()
    inputs = keras.Input((image_size, image_size, 3))
    x = keras.layers.Conv2D(
        8, 3, strides=4, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed=1)
    )(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(2048, kernel_initializer=keras.initializers.GlorotUniform(seed=2))(x)
    return keras.Model(inputs, outputs)


def tiny_extractor(image_size: int, batch_size: int = 32) -> evaluation.KerasFeatureExtractor:
    return evaluation.KerasFeatureExtractor(tiny_network(image_size), image_size, f"test-random-net@{image_size}", batch_size)
