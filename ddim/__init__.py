"""ddim: denoising diffusion implicit models (Song et al. 2020) on JAX and Flax.

>>> import ddim
>>> pipe = ddim.load("runs/flowers64")
>>> images = pipe.generate(16, steps=20, seed=0)   # uint8 (16, 64, 64, 3)
>>> ddim.save_images(images, "samples/")
"""

import os as _os

# TensorFlow (the input pipeline, and imported by some dependencies) logs INFO lines from C++
# at import time; they are noise for users of this package.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from ddim import runtime as _runtime  # noqa: E402

# Before anything initialises JAX's backend: the CPU speed flags (see ddim/runtime.py).
_runtime.configure_xla_flags()

from ddim.config import Config, load_config  # noqa: E402
from ddim.images import make_grid, save_images  # noqa: E402

__version__ = "0.1.0"

__all__ = ["Config", "load", "load_config", "make_grid", "save_images", "Pipeline", "__version__"]


def __getattr__(name):
    # Heavy (JAX/Flax) parts load on first use, so `import ddim` and the CLI start fast.
    if name in ("load", "Pipeline"):
        from ddim import sampling

        return getattr(sampling, name)
    raise AttributeError(f"module 'ddim' has no attribute {name!r}")
