"""The UNet's residual block."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from ddim.nn.layers import Conv, batch_norm


class ResidualBlock(nn.Module):
    """BN -> 3x3 conv -> swish -> 3x3 conv, plus the input (through a 1x1 conv when widths differ)."""

    width: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        residual = x if x.shape[-1] == self.width else Conv(self.width, 1, self.dtype, name="skip")(x)
        x = batch_norm(train, self.dtype)(x)
        x = nn.swish(Conv(self.width, 3, self.dtype)(x))
        x = Conv(self.width, 3, self.dtype)(x)
        return x + residual
