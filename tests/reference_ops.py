"""Textbook versions of ddim/ops.py (jax.lax / jax.image) that the fast formulations must match."""

import jax
from jax import lax


def conv2d(x, kernel):
    return lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    precision=lax.Precision.HIGHEST)


def average_pool_2x(x):
    return lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0


def upsample_bilinear_2x(x):
    n, h, w, c = x.shape
    return jax.image.resize(x, (n, 2 * h, 2 * w, c), "bilinear")


def batch_normalize(x, epsilon):
    """flax's nn.BatchNorm arithmetic (fast variance, clipped at 0), differentiated by autodiff."""
    axes = tuple(range(x.ndim - 1))
    mean = x.mean(axes)
    var = jax.numpy.maximum((x * x).mean(axes) - mean * mean, 0.0)
    return (x - mean) * lax.rsqrt(var + epsilon), mean, var
