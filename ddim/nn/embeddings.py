"""What the network is told besides the noisy image: the noise level as sinusoidal features, and the class."""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax.numpy as jnp


def sinusoidal_embedding(noise_variances, embedding_dims: int, min_frequency: float, max_frequency: float):
    """Sin/cos features of ``noise_variances`` (shape ``(B, 1, 1, 1)``) at log-spaced frequencies.

    Returns ``(B, 1, 1, embedding_dims)``: ``embedding_dims // 2`` frequencies
    between ``min_frequency`` and ``max_frequency``, as in the Transformer's
    positional encoding (and the Keras DDIM example).
    """
    frequencies = jnp.exp(
        jnp.linspace(math.log(min_frequency), math.log(max_frequency), embedding_dims // 2, dtype=jnp.float32)
    )
    angular_speeds = 2.0 * math.pi * frequencies
    return jnp.concatenate(
        [jnp.sin(angular_speeds * noise_variances), jnp.cos(angular_speeds * noise_variances)], axis=-1
    )


class ClassEmbedding(nn.Module):
    """A learned vector per class and one for the *null* class, ``(B, 1, 1, features)``.

    ``labels`` are class ids; -1 (no class, or dropped for classifier-free
    guidance) and anything outside ``[0, num_classes)`` take the null class,
    the last row, so one network learns the conditional and the unconditional
    prediction (Ho & Salimans 2022, Algorithm 1). With ``labels_to`` and
    ``mix`` (floats in [0, 1]) each image gets ``(1 - mix) e(labels) + mix
    e(labels_to)``, a point on the segment between two classes' vectors: the
    class path of an interpolation. Written so that ``mix`` 0 and 1 give
    exactly the two classes' vectors. No parameters besides the table.

    ``embedding_init`` initialises the table: Flax's default (a standard
    deviation of 1/sqrt(``num_classes + 1``), 0.1 for Flowers' 102 classes), or a unit
    normal as ADM's ``label_emb`` (PyTorch's ``nn.Embedding`` default).
    """

    num_classes: int
    features: int
    embedding_init: Callable = nn.linear.default_embed_init

    def ids(self, labels):
        """``labels`` as rows of the table: out of range (and -1) is the null class."""
        labels = jnp.asarray(labels, jnp.int32)
        return jnp.where((labels < 0) | (labels >= self.num_classes), self.num_classes, labels)

    @nn.compact
    def __call__(self, labels, labels_to=None, mix=None):
        table = nn.Embed(self.num_classes + 1, self.features, embedding_init=self.embedding_init, name="table")
        vectors = table(self.ids(labels))
        if labels_to is not None:
            weights = jnp.asarray(mix, vectors.dtype)[:, None]
            vectors = (1.0 - weights) * vectors + weights * table(self.ids(labels_to))
        return vectors[:, None, None, :]


GUIDANCE_FREQUENCIES = (0.05, 50.0)
"""Lowest and highest frequency of the guidance scale's sinusoidal features: the lowest turns by 1.3 radians over
scales 0 to 4, so the features tell every scale of the usual range apart."""


class GuidanceEmbedding(nn.Module):
    """The guidance scale ``w`` as an input (Meng et al. 2023, section 3.1: the student is conditioned on ``w``).

    Sinusoidal features of ``w`` through a dense layer initialised to zero, ``(B, 1, 1, features)``, which the UNet
    adds to the noise level's features: a student made from a teacher's weights starts as the teacher (its
    conditional prediction at every ``w``) and learns how ``w`` changes it. ``guidance`` is ``(B,)`` scales, or
    None for 1 (plain conditional sampling, the verbs' default).
    """

    features: int

    @nn.compact
    def __call__(self, guidance, batch: int):
        scales = jnp.ones((batch,), jnp.float32) if guidance is None else jnp.asarray(guidance, jnp.float32)
        sinusoids = sinusoidal_embedding(scales.reshape(-1, 1, 1, 1), self.features, *GUIDANCE_FREQUENCIES)
        return nn.Dense(self.features, kernel_init=nn.initializers.zeros, name="project")(sinusoids)
