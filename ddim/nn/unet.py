"""The UNet of the Keras example "Denoising Diffusion Implicit Models" (A. Béres), with the recipe's options.

Residual blocks without normalisation scale/offset, average pooling down,
bilinear upsampling up, a sinusoidal embedding of the noise variance broadcast
over the image and concatenated to the input, and a zero-initialised output
convolution so the untrained network outputs zero. Options (``ModelConfig``):
self-attention after the blocks of chosen resolutions, the noise embedding in
every block by scale and shift, and dropout. With the defaults the parameters
and the computation are the Keras example's.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from ddim import ops
from ddim.config import ModelConfig
from ddim.nn.attention import SelfAttention
from ddim.nn.blocks import ResidualBlock
from ddim.nn.embeddings import ClassEmbedding, GuidanceEmbedding, sinusoidal_embedding
from ddim.nn.layers import Conv, compute_dtype


class UNet(nn.Module):
    """Maps ``noisy_images`` and the noise variance of each image to the prediction target.

    What it predicts (the noise, or the velocity) is the objective's business
    (:mod:`ddim.objective`); the network only sees images and noise levels.
    ``cond`` carries further conditioning (a pytree, as guided-diffusion's
    ``model_kwargs``): a class-conditional network reads ``cond["label"]``
    (``(B,)`` class ids, -1 for the null class; no ``cond`` means the null
    class), and with ``cond["label_to"]`` and ``cond["label_mix"]`` (``(B,)``
    ids and weights in [0, 1]) a mix of two classes. Its
    :class:`ClassEmbedding` is added to the noise level's sinusoidal features
    (``model.class_embedding = "noise-features"``), so the class reaches every
    place the noise level does, or, as ADM, a unit-normal class vector is added
    to the output of the noise embedding's MLP that every block reads
    (``"adm"``). A distilled student with ``guidance_input`` also reads
    ``cond["guidance"]`` (``(B,)`` scales; 1 when absent), added to the noise
    level's features by :class:`GuidanceEmbedding`. Every hyperparameter comes
    from ``config`` (a :class:`ddim.config.ModelConfig`).
    """

    config: ModelConfig

    def block(self, width: int, x, train: bool, embedding):
        """A residual block, followed by self-attention when ``x``'s resolution is in ``attention_resolutions``."""
        c, dtype = self.config, compute_dtype(self.config)
        x = ResidualBlock(width, dtype, c.dropout)(x, train, embedding)
        if x.shape[1] in c.attention_resolutions:
            x = SelfAttention(c.attention_heads, dtype)(x)
        return x

    @nn.compact
    def __call__(self, noisy_images, noise_variances, train: bool, cond=None):
        c, dtype = self.config, compute_dtype(self.config)
        batch, height, width, _ = noisy_images.shape
        noise_embedding = sinusoidal_embedding(
            noise_variances, c.embedding_dims, c.embedding_min_frequency, c.embedding_max_frequency
        )
        class_vectors = None
        if c.class_conditional:
            cond = cond or {}
            labels = cond["label"] if "label" in cond else jnp.full((batch,), -1, jnp.int32)
            if c.class_embedding == "adm":
                # ADM's label_emb: unit-normal vectors the size of the block embedding, added after its MLP.
                classes = ClassEmbedding(c.num_classes, 4 * c.embedding_dims, nn.initializers.normal(1.0),
                                         name="classes")
            else:
                classes = ClassEmbedding(c.num_classes, c.embedding_dims, name="classes")
            class_vectors = classes(labels, cond.get("label_to"), cond.get("label_mix"))
            if c.class_embedding == "noise-features":
                noise_embedding = noise_embedding + class_vectors
        if c.guidance_input:
            noise_embedding = noise_embedding + GuidanceEmbedding(c.embedding_dims, name="guidance")(
                (cond or {}).get("guidance"), batch)
        block_embedding = None
        if c.embedding_injection == "every-block":
            # ADM's time embedding: an MLP of the sinusoidal features, shared by every block.
            hidden = nn.swish(nn.Dense(4 * c.embedding_dims, dtype=dtype, name="embedding_in")(noise_embedding))
            block_embedding = nn.Dense(4 * c.embedding_dims, dtype=dtype, name="embedding_out")(hidden)
            if c.class_conditional and c.class_embedding == "adm":
                block_embedding = block_embedding + class_vectors.astype(block_embedding.dtype)
        # Keras upsamples the 1x1 embedding to the image size with nearest-neighbour: a broadcast.
        embedding = jnp.broadcast_to(ops.materialize(noise_embedding), (batch, height, width, c.embedding_dims))
        x = Conv(c.widths[0], 1, dtype, name="stem")(noisy_images)
        x = jnp.concatenate([x, embedding.astype(x.dtype)], axis=-1)

        skips = []
        for level_width in c.widths[:-1]:
            for _ in range(c.block_depth):
                x = self.block(level_width, x, train, block_embedding)
                skips.append(x)
            x = ops.average_pool_2x(x)
        for _ in range(c.block_depth):
            x = self.block(c.widths[-1], x, train, block_embedding)
        for level_width in reversed(c.widths[:-1]):
            x = ops.upsample_bilinear_2x(x)
            for _ in range(c.block_depth):
                x = jnp.concatenate([x, skips.pop()], axis=-1)
                x = self.block(level_width, x, train, block_embedding)
        # Zero-initialised so the untrained model outputs zero (the identity denoiser for noise prediction).
        x = Conv(noisy_images.shape[-1], 1, dtype, kernel_init=nn.initializers.zeros, name="head")(x)
        return x.astype(jnp.float32)
