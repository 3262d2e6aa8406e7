"""The UNet's array operations (ddim/ops.py) against jax.lax / jax.image references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim import ops
from tests import reference_ops


@pytest.mark.parametrize("size,cin,cout", [(3, 5, 7), (1, 6, 4), (3, 16, 16)])
def test_conv2d_values_and_gradients_match_lax(size, cin, cout):
    kx, kk, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (2, 8, 8, cin))
    kernel = jax.random.normal(kk, (size, size, cin, cout)) * 0.2
    cotangent = jax.random.normal(kg, (2, 8, 8, cout))
    out, vjp = jax.vjp(jax.jit(ops.conv2d), x, kernel)
    ref, ref_vjp = jax.vjp(reference_ops.conv2d, x, kernel)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    for got, want in zip(vjp(cotangent), ref_vjp(cotangent)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * float(jnp.abs(want).max()))


def test_average_pool_matches_reduce_window():
    x = jax.random.normal(jax.random.key(1), (2, 8, 6, 3))
    np.testing.assert_allclose(ops.average_pool_2x(x), reference_ops.average_pool_2x(x), atol=1e-6)


def test_bilinear_upsampling_matches_jax_image_resize():
    x = jax.random.normal(jax.random.key(2), (2, 5, 7, 3))
    np.testing.assert_allclose(ops.upsample_bilinear_2x(x), reference_ops.upsample_bilinear_2x(x), atol=1e-6)
    # and its gradient (the transposed resampling)
    g = jax.random.normal(jax.random.key(3), (2, 10, 14, 3))
    got = jax.vjp(ops.upsample_bilinear_2x, x)[1](g)[0]
    want = jax.vjp(reference_ops.upsample_bilinear_2x, x)[1](g)[0]
    np.testing.assert_allclose(got, want, atol=1e-5)
