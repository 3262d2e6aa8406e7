"""Generating images from a trained model.

- :mod:`~ddim.sampling.process`: the reverse process and DDIM's tools as functions of a model's ``denoise``.
- :mod:`~ddim.sampling.programs`: those verbs compiled, and the one loop that runs them over batches and devices.
- :mod:`~ddim.sampling.inputs`: user images, masks and latents, checked.
- :mod:`~ddim.sampling.pipeline`: :class:`Pipeline`, the user's object with the verbs, and :func:`load`.

>>> import ddim
>>> pipe = ddim.load("runs/flowers64")            # a work directory or a checkpoint step dir
>>> images = pipe.generate(16, steps=20, seed=0)  # uint8, (16, 64, 64, 3)
>>> ddim.save_images(images, "samples/")
"""

from ddim.sampling.inputs import check_latents, prepare_images, prepare_masks
from ddim.sampling.pipeline import Pipeline, Reconstruction, load
from ddim.sampling.programs import generate_images, map_batches
from ddim.spec import SamplingSpec

__all__ = [
    "Pipeline",
    "Reconstruction",
    "SamplingSpec",
    "check_latents",
    "generate_images",
    "load",
    "map_batches",
    "prepare_images",
    "prepare_masks",
]
