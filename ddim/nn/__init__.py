"""The denoising network, one file per kind of part.

- :mod:`~ddim.nn.layers`: the convolution and normalisation every block uses.
- :mod:`~ddim.nn.embeddings`: what the network is told besides the image (the noise level, the class, a student's guidance scale).
- :mod:`~ddim.nn.blocks`: the residual block.
- :mod:`~ddim.nn.unet`: the UNet that puts them together.
"""

from ddim.nn.blocks import ResidualBlock
from ddim.nn.embeddings import ClassEmbedding, GuidanceEmbedding, sinusoidal_embedding
from ddim.nn.layers import Conv, batch_norm, compute_dtype
from ddim.nn.unet import UNet

__all__ = ["ClassEmbedding", "Conv", "GuidanceEmbedding", "ResidualBlock", "UNet", "batch_norm", "compute_dtype", "sinusoidal_embedding"]
