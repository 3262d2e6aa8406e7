"""The layers every block is made of: a fast convolution and Keras' scale-free BatchNorm."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

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


def batch_norm(train: bool, dtype) -> nn.BatchNorm:
    """Keras' ``BatchNormalization(center=False, scale=False)``: momentum 0.99, epsilon 1e-3, no parameters."""
    return nn.BatchNorm(
        use_running_average=not train, use_bias=False, use_scale=False, momentum=0.99, epsilon=1e-3, dtype=dtype
    )
