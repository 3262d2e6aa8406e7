"""The 3x3 convolutions on oneDNN (ddim/onednn.py, ddim/csrc/onednn_conv.cc) against XLA's."""

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
@pytest.mark.parametrize("shape,cin,cout", [((2, 8, 8), 3, 5), ((1, 6, 10), 16, 32), ((3, 4, 4), 32, 16)])
def test_values_and_gradients_match_xla(shape, cin, cout):
    x = normal(0, shape + (cin,))
    kernel = normal(1, (3, 3, cin, cout), 0.2)
    cotangent = normal(2, shape + (cout,))
    out, (dx, dkernel) = run_once(functools.partial(_values_and_gradients, onednn.conv3x3), cotangent, x, kernel)
    ref, (ref_dx, ref_dkernel) = run_once(
        functools.partial(_values_and_gradients, reference_ops.conv2d), cotangent, x, kernel
    )
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dkernel, ref_dkernel, rtol=1e-5, atol=1e-5 * float(jnp.abs(ref_dkernel).max()))


def _custom_call_targets(fn, *args) -> str:
    return jax.jit(jax.grad(lambda *a: (fn(*a) ** 2).sum(), argnums=(0, 1))).lower(*args).as_text()


@needs_onednn
def test_network_convolution_runs_on_onednn_in_float32_only():
    x, kernel = normal(0, (1, 4, 4, 8)), normal(1, (3, 3, 8, 8))
    text = _custom_call_targets(ops.conv2d, x, kernel)
    assert "ddim_conv3x3_forward" in text and "ddim_conv3x3_weight_gradient" in text
    # bfloat16 and 1x1 kernels keep XLA's convolution and matmul
    assert "ddim_conv3x3" not in _custom_call_targets(ops.conv2d, x.astype(jnp.bfloat16), kernel.astype(jnp.bfloat16))
    assert "ddim_conv3x3" not in _custom_call_targets(ops.conv2d, x, normal(2, (1, 1, 8, 8)))


def test_without_onednn_the_network_keeps_xla(monkeypatch):
    monkeypatch.setattr(onednn, "available", lambda: False)
    x, kernel = normal(0, (1, 4, 4, 8)), normal(1, (3, 3, 8, 8))
    text = _custom_call_targets(ops.conv2d, x, kernel)
    assert "ddim_conv3x3" not in text and "convolution" in text


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
