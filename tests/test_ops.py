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


def test_in_forward_mode_the_convolution_and_the_upsampling_take_a_jvp_equal_to_the_references():
    x, kernel = normal(8, (2, 8, 8, 4)), normal(9, (3, 3, 4, 5), 0.2)
    dx, dkernel = normal(10, (2, 8, 8, 4)), normal(11, (3, 3, 4, 5), 0.2)
    with ops.forward_mode():
        conv = jax.jvp(ops.conv2d, (x, kernel), (dx, dkernel))
        up = jax.jvp(ops.upsample_bilinear_2x, (x,), (dx,))
    for got, want in zip(conv, jax.jvp(reference_ops.conv2d, (x, kernel), (dx, dkernel))):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    for got, want in zip(up, jax.jvp(reference_ops.upsample_bilinear_2x, (x,), (dx,))):
        np.testing.assert_allclose(got, want, atol=1e-5)
    with pytest.raises(TypeError, match="forward-mode"):  # outside it, the custom gradient is reverse mode only
        jax.jvp(ops.upsample_bilinear_2x, (x,), (dx,))


@pytest.mark.parametrize("shape", [(4, 6, 5, 3), (2, 4, 4, 16)])
def test_batch_normalize_values_and_gradients_match_autodiff(shape):
    # Nonzero cotangents for the statistics too, so every term of the hand-written gradient is checked.
    x = 3.0 + 2.0 * normal(4, shape)
    cotangent = (normal(5, shape), normal(6, shape[-1:]), normal(7, shape[-1:]))
    fn = functools.partial(ops.batch_normalize, epsilon=1e-3)
    reference = functools.partial(reference_ops.batch_normalize, epsilon=1e-3)
    out, (got,) = values_and_gradients(fn, cotangent, x)
    ref, (want,) = values_and_gradients(reference, cotangent, x)
    for o, r in zip(out, ref):
        np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # The normalised output alone, as in training: the statistics' cotangents are symbolic zeros.
    y_only = lambda x: ops.batch_normalize(x, 1e-3)[0]  # noqa: E731
    _, (got,) = values_and_gradients(y_only, cotangent[0], x)
    _, (want,) = values_and_gradients(lambda x: reference(x)[0], cotangent[0], x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_batch_normalize_of_a_constant_channel_is_zero_with_a_finite_gradient():
    x = normal(8, (2, 3, 3, 2)).at[..., 1].set(5.0)
    y, mean, var = ops.batch_normalize(x, 1e-3)
    assert float(var[1]) == 0.0 and np.all(np.asarray(y[..., 1]) == 0.0)
    gradient = jax.grad(lambda x: (ops.batch_normalize(x, 1e-3)[0] ** 2).sum())(x)
    assert np.all(np.isfinite(np.asarray(gradient)))


def test_materialize_is_the_identity_with_the_identity_gradient():
    x = normal(9, (3, 1, 1, 8))
    g = normal(10, (3, 1, 1, 8))
    out, (got,) = values_and_gradients(ops.materialize, g, x)
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(got, g)
