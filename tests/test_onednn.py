"""The convolutions on oneDNN (ddim/onednn.py, ddim/csrc/onednn_conv.cc) against XLA's."""

import functools
import platform
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim import onednn, ops
from tests import reference_ops
from tests.conftest import normal, run_once

# ddim installs oneDNN and builds the library on x86-64 Linux; there it must work, not skip.
SUPPORTED = sys.platform == "linux" and platform.machine() == "x86_64"
needs_onednn = pytest.mark.skipif(not SUPPORTED, reason="oneDNN convolutions are built on x86-64 Linux only")


def _values_and_gradients(fn, cotangent, x, kernel):
    out, vjp = jax.vjp(fn, x, kernel)
    return out, vjp(cotangent)


@needs_onednn
def test_available_where_installed():
    assert onednn.available(), onednn.unavailable_reason()


@needs_onednn
@pytest.mark.parametrize("size", [3, 1])
@pytest.mark.parametrize("shape,cin,cout", [((2, 8, 8), 3, 5), ((1, 6, 10), 16, 32), ((3, 4, 4), 32, 16)])
def test_values_and_gradients_match_xla(size, shape, cin, cout):
    x = normal(0, shape + (cin,))
    kernel = normal(1, (size, size, cin, cout), 0.2)
    cotangent = normal(2, shape + (cout,))
    out, (dx, dkernel) = run_once(functools.partial(_values_and_gradients, onednn.conv2d), cotangent, x, kernel)
    ref, (ref_dx, ref_dkernel) = run_once(
        functools.partial(_values_and_gradients, reference_ops.conv2d), cotangent, x, kernel
    )
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dkernel, ref_dkernel, rtol=1e-5, atol=1e-5 * float(jnp.abs(ref_dkernel).max()))


def _custom_call_targets(fn, *args) -> str:
    return jax.jit(jax.grad(lambda *a: (fn(*a) ** 2).sum(), argnums=(0, 1))).lower(*args).as_text()


@needs_onednn
@pytest.mark.parametrize("size", [1, 3])
def test_network_convolutions_run_on_onednn_in_float32_only(size):
    x, kernel = normal(0, (1, 4, 4, 8)), normal(1, (size, size, 8, 8))
    text = _custom_call_targets(ops.conv2d, x, kernel)
    for target in ("ddim_conv_forward", "ddim_conv_input_gradient", "ddim_conv_weight_gradient"):
        assert target in text
    # bfloat16 keeps XLA's convolution
    assert "ddim_conv" not in _custom_call_targets(ops.conv2d, x.astype(jnp.bfloat16), kernel.astype(jnp.bfloat16))


@needs_onednn
def test_other_kernel_sizes_keep_xla():
    x = normal(0, (1, 6, 6, 4))
    assert not onednn.applies(x, normal(1, (5, 5, 4, 4)))
    np.testing.assert_allclose(ops.conv2d(x, normal(1, (5, 5, 4, 4))), reference_ops.conv2d(x, normal(1, (5, 5, 4, 4))),
                               rtol=1e-5, atol=1e-5)


def test_without_onednn_the_network_keeps_xla(monkeypatch):
    monkeypatch.setattr(onednn, "available", lambda: False)
    x, kernel = normal(0, (1, 4, 4, 8)), normal(1, (3, 3, 8, 8))
    text = _custom_call_targets(ops.conv2d, x, kernel)
    assert "ddim_conv" not in text and "convolution" in text


def test_turned_off_by_environment(monkeypatch):
    monkeypatch.setattr(onednn, "_reason", onednn._reason)  # restored after the test
    monkeypatch.setenv("DDIM_ONEDNN", "0")
    available = onednn.available.__wrapped__  # the uncached check
    assert not available()
    assert "DDIM_ONEDNN" in onednn.unavailable_reason()


@needs_onednn
def test_build_failure_is_a_reason_not_an_exception(monkeypatch, tmp_path):
    monkeypatch.setattr(onednn, "_reason", onednn._reason)
    monkeypatch.setenv("DDIM_ONEDNN", "1")
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built there yet, so it must compile
    monkeypatch.delenv("DDIM_COMPILATION_CACHE", raising=False)
    assert not onednn.available.__wrapped__()
    assert "no-such-compiler" in onednn.unavailable_reason() or "No such file" in onednn.unavailable_reason()
