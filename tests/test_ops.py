"""The UNet's array operations (ddim/ops.py) against jax.lax / jax.image references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim import ops
from tests import reference_ops
from tests.conftest import normal, run_once


def _values_and_gradients(fn, cotangent, *args):
    out, vjp = jax.vjp(fn, *args)
    return out, vjp(cotangent)


def values_and_gradients(fn, cotangent, *args):
    """``fn(*args)`` and its vector-Jacobian product with ``cotangent``, as one program compiled the cheap way:
    op by op, every primitive of the references and their gradients would compile on its own."""
    return run_once(functools.partial(_values_and_gradients, fn), cotangent, *args)


@pytest.mark.parametrize("size,cin,cout", [(3, 5, 7), (1, 6, 4), (3, 16, 16)])
def test_conv2d_values_and_gradients_match_lax(size, cin, cout):
    x = normal(0, (2, 8, 8, cin))
    kernel = normal(1, (size, size, cin, cout), 0.2)
    cotangent = normal(2, (2, 8, 8, cout))
    out, gradients = values_and_gradients(ops.conv2d, cotangent, x, kernel)
    ref, ref_gradients = values_and_gradients(reference_ops.conv2d, cotangent, x, kernel)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    for got, want in zip(gradients, ref_gradients):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * float(jnp.abs(want).max()))


def test_average_pool_matches_reduce_window():
    x = normal(1, (2, 8, 6, 3))
    np.testing.assert_allclose(ops.average_pool_2x(x), reference_ops.average_pool_2x(x), atol=1e-6)


def test_bilinear_upsampling_matches_jax_image_resize():
    x = normal(2, (2, 5, 7, 3))
    g = normal(3, (2, 10, 14, 3))
    out, (got,) = values_and_gradients(ops.upsample_bilinear_2x, g, x)
    ref, (want,) = values_and_gradients(reference_ops.upsample_bilinear_2x, g, x)
    np.testing.assert_allclose(out, ref, atol=1e-6)
    np.testing.assert_allclose(got, want, atol=1e-5)  # the gradient: the transposed resampling
