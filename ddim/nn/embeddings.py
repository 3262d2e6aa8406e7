"""What the network is told besides the noisy image: the noise level as sinusoidal features."""

from __future__ import annotations

import math

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
