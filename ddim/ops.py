"""Array operations of the UNet, written for speed on every XLA backend.

Each function computes exactly the textbook operation (tests compare them with
``jax.lax`` / ``jax.image`` references); how it is expressed is chosen so XLA
emits fast code, in particular on CPU where generic convolutions and
``jax.image.resize`` are slow.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

_NHWC = ("NHWC", "HWIO", "NHWC")


def conv2d(x, kernel):
    """Stride-1 'SAME' convolution of NHWC ``x`` with an HWIO ``kernel``."""
    if kernel.shape[0] == 1 and kernel.shape[1] == 1:
        # A 1x1 convolution is a matmul over channels; dot_general is faster than conv on CPU.
        return jnp.einsum("nhwc,co->nhwo", x, kernel[0, 0])
    return lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=_NHWC)


def average_pool_2x(x):
    """2x2 average pooling with stride 2 (Keras ``AveragePooling2D(2)``) as a reshape-mean."""
    n, h, w, c = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


def upsample_bilinear_2x(x):
    """2x bilinear upsampling with half-pixel centres (``jax.image.resize(..., 'bilinear')``).

    For a factor of 2 every output pixel is ``0.75 * nearest + 0.25 * next-nearest``
    input pixel, with edges clamped; written as slices and a reshape, which is far
    cheaper than the general resampling gather.
    """
    return _upsample_axis_2x(_upsample_axis_2x(x, 1), 2)


def _upsample_axis_2x(x, axis: int):
    size = x.shape[axis]
    first = lax.slice_in_dim(x, 0, 1, axis=axis)
    last = lax.slice_in_dim(x, size - 1, size, axis=axis)
    previous = jnp.concatenate([first, lax.slice_in_dim(x, 0, size - 1, axis=axis)], axis=axis)
    following = jnp.concatenate([lax.slice_in_dim(x, 1, size, axis=axis), last], axis=axis)
    even = 0.75 * x + 0.25 * previous
    odd = 0.75 * x + 0.25 * following
    stacked = jnp.stack([even, odd], axis=axis + 1)
    new_shape = x.shape[:axis] + (2 * size,) + x.shape[axis + 1 :]
    return stacked.reshape(new_shape)
