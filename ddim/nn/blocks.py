"""The UNet's residual block."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from ddim.nn.layers import Conv, batch_norm


class ResidualBlock(nn.Module):
    """BN -> 3x3 conv -> swish -> 3x3 conv, plus the input (through a 1x1 conv when widths differ).

    With a conditioning ``embedding`` (``(B, 1, 1, D)``: the noise level, and the
    class when there is one) the first convolution's output is scaled and
    shifted per channel, ``h * (1 + scale) + shift``, from a zero-initialised
    projection of the embedding (ADM's AdaGN, Dhariwal & Nichol 2021, section
    3; FiLM), so every block knows the noise level, not only the input layer.
    ``dropout`` drops features before the second convolution in training (as
    DDPM and ADM).
    """

    width: int
    dtype: Any = jnp.float32
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x, train: bool, embedding=None):
        residual = x if x.shape[-1] == self.width else Conv(self.width, 1, self.dtype, name="skip")(x)
        x = batch_norm(train, self.dtype)(x)
        x = Conv(self.width, 3, self.dtype)(x)
        if embedding is not None:
            scale_shift = nn.Dense(2 * self.width, dtype=self.dtype, kernel_init=nn.initializers.zeros,
                                   name="scale_shift")(nn.swish(embedding))
            scale, shift = jnp.split(scale_shift.astype(x.dtype), 2, axis=-1)
            x = x * (1.0 + scale) + shift
        x = nn.swish(x)
        if self.dropout:
            x = nn.Dropout(self.dropout, deterministic=not train)(x)
        x = Conv(self.width, 3, self.dtype)(x)
        return x + residual
