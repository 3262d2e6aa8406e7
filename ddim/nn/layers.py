"""The layers every block is made of: a fast convolution and Keras' scale-free BatchNorm."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from jax import lax

from ddim import ops
from ddim.config import ModelConfig

# Keras' Conv2D default initialiser; kept so training starts where the reference starts.
glorot_uniform = nn.initializers.glorot_uniform()


def compute_dtype(config: ModelConfig):
    """The network's compute dtype (parameters and outputs stay float32)."""
    return jnp.dtype(config.dtype)


class Conv(nn.Module):
    """A stride-1 'SAME' convolution with a bias (the parameters of ``nn.Conv``).

    The arithmetic is :func:`ddim.ops.conv2d`, which picks the fastest formulation
    on the current backend; parameters stay float32 and the computation runs in
    ``dtype``.
    """

    features: int
    kernel_size: int
    dtype: Any = jnp.float32
    kernel_init: Any = glorot_uniform

    @nn.compact
    def __call__(self, x):
        kernel = self.param(
            "kernel", self.kernel_init, (self.kernel_size, self.kernel_size, x.shape[-1], self.features), jnp.float32
        )
        bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
        x, kernel, bias = x.astype(self.dtype), kernel.astype(self.dtype), bias.astype(self.dtype)
        return ops.conv2d(x, kernel) + bias


class BatchNorm(nn.Module):
    """Keras' ``BatchNormalization(center=False, scale=False)``: momentum 0.99, epsilon 1e-3, no parameters.

    The variables, their names and the arithmetic are flax's ``nn.BatchNorm``'s with ``use_scale`` and
    ``use_bias`` off (running ``mean`` and ``var`` in ``batch_stats``), so checkpoints and bundles load either
    way; the training-mode normalisation is :func:`ddim.ops.batch_normalize`, whose hand-written gradient
    makes fewer passes over memory than autodiff of flax's.
    """

    use_running_average: bool
    momentum: float = 0.99
    epsilon: float = 1e-3
    dtype: Any = None

    @nn.compact
    def __call__(self, x):
        features = (x.shape[-1],)
        running_mean = self.variable("batch_stats", "mean", lambda: jnp.zeros(features, jnp.float32))
        running_var = self.variable("batch_stats", "var", lambda: jnp.ones(features, jnp.float32))
        if self.use_running_average:
            mean, var = running_mean.value, running_var.value
            y = (x - mean) * lax.rsqrt(var + self.epsilon)
        else:
            y, mean, var = ops.batch_normalize(x, self.epsilon)
            if not self.is_initializing():
                running_mean.value = self.momentum * running_mean.value + (1 - self.momentum) * mean
                running_var.value = self.momentum * running_var.value + (1 - self.momentum) * var
        return y.astype(self.dtype or x.dtype)


def batch_norm(train: bool, dtype) -> BatchNorm:
    """The residual blocks' normalisation, in training (batch statistics) or inference (running) mode."""
    return BatchNorm(use_running_average=not train, dtype=dtype)
