"""Multi-head self-attention over the pixels of a feature map (DDPM's attention block, ADM's multi-head form)."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ddim.nn.layers import Conv


class SelfAttention(nn.Module):
    """``x + proj(attention(norm(x)))`` with ``heads`` heads over all ``H * W`` positions.

    As DDPM (Ho et al. 2020, appendix B) and ADM (Dhariwal & Nichol 2021,
    section 3: more heads help): GroupNorm, 1x1 query/key/value projections,
    scaled dot-product attention, and a zero-initialised 1x1 output projection,
    so a new attention layer starts as the identity and leaves the network it
    joins unchanged.
    """

    heads: int = 1
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        batch, height, width, channels = x.shape
        head_dims = channels // self.heads
        normed = nn.GroupNorm(num_groups=math.gcd(32, channels), dtype=self.dtype, name="norm")(x)
        qkv = Conv(3 * channels, 1, self.dtype, name="qkv")(normed)
        qkv = qkv.reshape(batch, height * width, 3, self.heads, head_dims)
        attended = jax.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
        attended = attended.reshape(batch, height, width, channels)
        return x + Conv(channels, 1, self.dtype, kernel_init=nn.initializers.zeros, name="proj")(attended)
