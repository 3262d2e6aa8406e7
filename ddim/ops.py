"""Array operations of the UNet, written for speed on every XLA backend.

Each function computes exactly the textbook operation (tests compare them with
``jax.lax`` / ``jax.image`` references); how it is expressed is chosen so XLA
emits fast code, in particular on CPU where generic convolutions and
``jax.image.resize`` are slow.

On CPU the speed depends as much on the XLA flags and the allocator as on the
formulation: see :mod:`ddim.runtime`.
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from ddim import onednn

_NHWC = ("NHWC", "HWIO", "NHWC")


def conv2d(x, kernel):
    """Stride-1 'SAME' convolution of NHWC ``x`` with an HWIO ``kernel``."""
    if onednn.applies(x, kernel):
        # On a CPU, oneDNN's kernels (above all the weight gradient's) beat XLA's Eigen ones: a flowers64
        # 64x64, 32-channel 3x3 layer's forward and backward pass in 48 ms against 93 on a 2-core AVX-512
        # Xeon, and 1x1 layers 0.9-2x as fast as the matmul below (docs/research/cpu-speed.md).
        return onednn.conv2d(x, kernel)
    if kernel.shape[0] == 1 and kernel.shape[1] == 1:
        # A 1x1 convolution is a matmul over channels. Flattening N, H, W into one dimension
        # keeps it (and, above all, its weight gradient, which contracts N*H*W) a plain 2-D
        # GEMM: a 4-D dot_general with three contracting dimensions is ~1.7x slower on CPU.
        weights = kernel[0, 0]
        flat = x.reshape(-1, x.shape[-1]) @ weights
        return flat.reshape(x.shape[:-1] + (weights.shape[-1],))
    return lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=_NHWC)


def materialize(x):
    """``x`` unchanged, computed once as an array of its own rather than inside whatever consumes it.

    XLA fuses elementwise producers into their consumers, and into a broadcast it recomputes them for
    every element of the result: the UNet's (B, 1, 1, D) noise features (random levels, sines and
    cosines) were evaluated for every pixel of the 64x64 stem, 55 ms of a 1.9 s CPU training step. An
    optimisation barrier does not stop it (XLA:CPU removes barriers before fusing); a product with the
    identity, which XLA runs as a matmul of its own, does, exactly (every output is one input times 1).
    """
    identity = jnp.eye(x.shape[-1], dtype=x.dtype)
    return jnp.matmul(x, identity, precision=lax.Precision.HIGHEST)


def average_pool_2x(x):
    """2x2 average pooling with stride 2 (Keras ``AveragePooling2D(2)``) as a reshape-mean."""
    n, h, w, c = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


_forward_mode = 0


@contextlib.contextmanager
def forward_mode():
    """Trace the network inside this block with operations that forward-mode differentiation (``jax.jvp``) can
    pass: the ``custom_vjp`` ones (oneDNN's convolutions, :func:`upsample_bilinear_2x`'s adjoint) allow reverse
    mode only. The values are the same; continuous-time consistency distillation differentiates the network so
    (ddim/distill/step.py)."""
    global _forward_mode
    _forward_mode += 1
    try:
        with onednn.disabled():
            yield
    finally:
        _forward_mode -= 1


def upsample_bilinear_2x(x):
    """2x bilinear upsampling with half-pixel centres (``jax.image.resize(..., 'bilinear')``).

    For a factor of 2 every output pixel is ``0.75 * nearest + 0.25 * next-nearest``
    input pixel, with edges clamped; written as slices and a reshape, which is far
    cheaper than the general resampling gather. The gradient is the explicit
    adjoint (:func:`_upsample_axis_2x_transpose`): one pass per axis instead of the
    chain of pads, slices and adds that autodiff makes of the slices (~2.5x faster).
    That gradient is a ``custom_vjp``, reverse mode only; inside :func:`forward_mode` autodiff's own is used.
    """
    if _forward_mode:
        return _upsample_2x(x)
    return _upsample_bilinear_2x_adjoint(x)


def _upsample_2x(x):
    return _upsample_axis_2x(_upsample_axis_2x(x, 1), 2)


@jax.custom_vjp
def _upsample_bilinear_2x_adjoint(x):
    return _upsample_2x(x)


def _upsample_fwd(x):
    return _upsample_2x(x), None


def _upsample_bwd(_, g):
    return (_upsample_axis_2x_transpose(_upsample_axis_2x_transpose(g, 2), 1),)


_upsample_bilinear_2x_adjoint.defvjp(_upsample_fwd, _upsample_bwd)


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


def _upsample_axis_2x_transpose(g, axis: int):
    """Adjoint of :func:`_upsample_axis_2x`: fold each even/odd output pair back onto the inputs.

    Input ``i`` feeds even output ``i`` and odd output ``i`` with weight 0.75, even output
    ``i + 1`` (as its "previous") and odd output ``i - 1`` (as its "following") with 0.25;
    at the clamped edges the missing neighbour is the edge input itself.
    """
    size = g.shape[axis] // 2
    pairs = g.reshape(g.shape[:axis] + (size, 2) + g.shape[axis + 1 :])
    even = lax.index_in_dim(pairs, 0, axis + 1, keepdims=False)
    odd = lax.index_in_dim(pairs, 1, axis + 1, keepdims=False)
    from_next = jnp.concatenate(
        [lax.slice_in_dim(even, 1, size, axis=axis), lax.slice_in_dim(odd, size - 1, size, axis=axis)], axis=axis
    )
    from_previous = jnp.concatenate(
        [lax.slice_in_dim(even, 0, 1, axis=axis), lax.slice_in_dim(odd, 0, size - 1, axis=axis)], axis=axis
    )
    return 0.75 * (even + odd) + 0.25 * (from_next + from_previous)


def batch_normalize(x, epsilon: float):
    """Batch normalisation without scale or offset over all axes but the last: ``(y, mean, var)``.

    ``y = (x - mean) * rsqrt(var + epsilon)`` with the batch's mean and biased
    variance (``E[x^2] - mean^2``, clipped at 0, as flax's ``BatchNorm`` computes
    them), statistics in float32 and ``y`` in ``x``'s dtype. The gradient is the
    textbook closed form (Ioffe & Szegedy 2015, section 3.1): the backward pass
    reads ``x`` and the incoming gradient for two per-channel sums and once more
    for the result, and the forward pass keeps nothing beyond ``x`` and two
    vectors. Autodiff of the same expression stores ``x - mean`` as a third
    full-size tensor and reads it back; on a CPU, where these passes are bound by
    memory bandwidth, a 64x64 training step is 2.4 % faster without it
    (docs/research/cpu-speed.md).
    """
    return _batch_normalize(x, epsilon)


def _statistics(x):
    axes = tuple(range(x.ndim - 1))
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = x.mean(axes)
    raw_var = (x * x).mean(axes) - mean * mean
    return mean, raw_var


def _normalized(x, mean, inv_std):
    return ((x.astype(mean.dtype) - mean) * inv_std).astype(x.dtype)


def _forward(x, epsilon):
    """``(y, mean, var)`` and what the gradient needs: ``inv_std`` and where the variance was not clipped."""
    mean, raw_var = _statistics(x)
    var = jnp.maximum(raw_var, 0.0)
    inv_std = lax.rsqrt(var + epsilon)
    return (_normalized(x, mean, inv_std), mean, var), (inv_std, raw_var > 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _batch_normalize(x, epsilon):
    return _forward(x, epsilon)[0]


def _batch_normalize_fwd(x, epsilon):
    x = x.value  # a CustomVJPPrimal (symbolic zeros are on)
    outputs, (inv_std, var_unclipped) = _forward(x, epsilon)
    return outputs, (x, outputs[1], inv_std, var_unclipped)


def _batch_normalize_bwd(epsilon, residuals, cotangents):
    x, mean, inv_std, var_unclipped = residuals
    dy, dmean, dvar = cotangents
    axes = tuple(range(x.ndim - 1))
    count = math.prod(x.shape[:-1])
    # dx = scale * dy + offset + slope * (x - mean), per channel scale, offset and slope. Written with x
    # itself, not x - mean, so that no centred copy of x is ever stored: the sums read dy and x, and so
    # does the result, nothing else.
    scale = offset = slope = jnp.zeros_like(mean)
    if not isinstance(dy, SymbolicZero):
        # y's part: inv_std * (dy - mean(dy) - y_hat * mean(dy * y_hat)), y_hat = (x - mean) * inv_std.
        dy = dy.astype(mean.dtype)
        mean_dy = dy.mean(axes)
        mean_dy_centred = (dy * x.astype(mean.dtype)).mean(axes) - mean * mean_dy
        scale, offset, slope = inv_std, -inv_std * mean_dy, -inv_std**3 * mean_dy_centred
    # The statistics' own parts (zero in training, where they only feed the running averages):
    # d mean / dx = 1 / count, d var / dx = 2 (x - mean) / count where var was not clipped.
    if not isinstance(dmean, SymbolicZero):
        offset = offset + dmean / count
    if not isinstance(dvar, SymbolicZero):
        slope = slope + jnp.where(var_unclipped, 2.0 * dvar / count, 0.0)
    dx = (offset - slope * mean) + slope * x.astype(mean.dtype)
    if not isinstance(dy, SymbolicZero):
        dx = dx + scale * dy
    return (dx.astype(x.dtype),)


_batch_normalize.defvjp(_batch_normalize_fwd, _batch_normalize_bwd, symbolic_zeros=True)
