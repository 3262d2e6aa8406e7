"""Generating images from a trained model: the jitted sampler and the Python API.

>>> import ddim
>>> pipe = ddim.load("runs/flowers64")            # a work directory or a checkpoint step dir
>>> images = pipe.generate(16, steps=20, seed=0)  # uint8, (16, 64, 64, 3)
>>> ddim.save_images(images, "samples/")
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ddim import parallel, samplers
from ddim.config import Config
from ddim.images import to_uint8
from ddim.model import DiffusionModel


@functools.cache
def generate_fn(model: DiffusionModel, out_sharding=None) -> Callable:
    """``f(variables, rng, num_images, diffusion_steps, eta, sampler="ddim", spacing="uniform") -> float images``, jitted.

    ``num_images``, ``diffusion_steps``, ``sampler`` and ``spacing`` are static
    (the loop, its length and the array shapes: one compiled loop per
    combination); ``eta`` is traced, so changing it does not recompile. With
    ``out_sharding`` (batch-sharded over a mesh) XLA splits the whole sampler
    along the batch. Cached per model (flax modules are hashable dataclasses).
    """

    def generate(variables, rng, num_images, diffusion_steps, eta, sampler="ddim", spacing="uniform"):
        return model.apply(
            variables, rng, num_images, diffusion_steps, eta, sampler=sampler, spacing=spacing,
            method=DiffusionModel.generate,
        )

    return jax.jit(
        generate,
        static_argnames=("num_images", "diffusion_steps", "sampler", "spacing"),
        out_shardings=out_sharding,
    )


def check_sampler_settings(steps: int, sampler: str, spacing: str, eta: float) -> None:
    """``ValueError`` (one sentence) for a bad step count, sampler or spacing name, or eta."""
    if steps < 1:
        raise ValueError(f"the number of diffusion steps must be >= 1, got {steps}")
    solver = samplers.get_sampler(sampler)
    samplers.check_spacing(spacing)
    if not eta >= 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    if eta > 0 and not solver.stochastic:
        raise ValueError(f"eta > 0 needs the ddim sampler ({sampler} is deterministic), got eta {eta}")


def generate_images(
    model: DiffusionModel,
    variables: dict[str, Any],
    num_images: int,
    steps: int,
    seed: int = 0,
    eta: float = 0.0,
    batch_size: int | None = None,
    on_batch: Callable[[int], None] | None = None,
    sampler: str = "ddim",
    spacing: str = "uniform",
) -> np.ndarray:
    """Generate ``num_images`` uint8 images in batches of at most ``batch_size``.

    Batch ``i`` uses ``fold_in(key(seed), i)``, so the images depend only on
    the seed, the batch size, the sampler settings and the checkpoint.
    ``on_batch(n)`` is called after each batch of ``n`` images (for progress bars).
    """
    if num_images < 1:
        raise ValueError(f"the number of images must be >= 1, got {num_images}")
    check_sampler_settings(steps, sampler, spacing, eta)
    batch_size = min(batch_size or num_images, num_images)
    if batch_size < 1:
        raise ValueError(f"the batch size must be >= 1, got {batch_size}")
    mesh = parallel.data_mesh()
    variables = parallel.replicate(variables, mesh)
    base = jax.random.key(seed)
    outputs = []
    for index, start in enumerate(range(0, num_images, batch_size)):
        count = min(batch_size, num_images - start)
        # Split the batch over the devices when it divides evenly; otherwise every device does all.
        sharding = parallel.batch_sharded(mesh) if count % mesh.devices.size == 0 else parallel.replicated(mesh)
        fn = generate_fn(model, sharding)
        images = fn(variables, jax.random.fold_in(base, index), count, steps, jnp.float32(eta), sampler, spacing)
        outputs.append(to_uint8(parallel.to_host(images)))
        if on_batch is not None:
            on_batch(count)
    return np.concatenate(outputs)


class Pipeline:
    """A trained model ready to sample: ``Pipeline.generate(n, steps, seed) -> uint8 (n, H, W, C)``."""

    def __init__(self, config: Config, variables: dict[str, Any], step: int | None = None, path: Path | None = None):
        self.config = config
        self.model = DiffusionModel(config.model)
        self.variables = variables
        self.step = step
        self.path = path

    def generate(
        self,
        num_images: int = 16,
        steps: int = 20,
        seed: int = 0,
        eta: float = 0.0,
        batch_size: int | None = None,
        on_batch: Callable[[int], None] | None = None,
        sampler: str = "ddim",
        spacing: str = "uniform",
    ) -> np.ndarray:
        """Sample ``num_images`` images with the EMA weights: uint8 ``(num_images, H, W, C)``.

        - ``steps`` >= 1: network calls per image (the cost of sampling).
        - ``seed``: same seed, arguments and checkpoint give the same pixels.
        - ``sampler``: ``"ddim"`` (the default; DDIM eq. 12), ``"dpmpp-2m"``
          (DPM-Solver++(2M), second order: closer to the converged result in
          few steps) or ``"dpmpp-3m"`` (third order); see :mod:`ddim.samplers`.
        - ``spacing``: the time grid, ``"uniform"`` (default), ``"logsnr"`` or ``"karras"``.
        - ``eta`` >= 0: DDIM's fresh noise per step (eq. 16; 0 is deterministic,
          1 is DDPM-like); only the ``ddim`` sampler takes ``eta > 0``.
        - ``batch_size``: images generated at once (bounds memory); ``on_batch(n)``
          is called after each batch of ``n``.

        Raises ``ValueError`` (one sentence) for a non-positive count or step
        count, an unknown sampler or spacing (listing the valid ones) or a bad eta.
        """
        return generate_images(
            self.model, self.variables, num_images, steps, seed, eta, batch_size, on_batch, sampler, spacing
        )

    def __repr__(self) -> str:
        return f"Pipeline(name={self.config.name!r}, step={self.step}, path={str(self.path)!r})"


def load(path: str | Path, step: int | None = None) -> Pipeline:
    """Load a pipeline from a work directory, its ``checkpoints`` folder or a checkpoint step dir.

    Needs nothing but the checkpoint: the config stored beside the weights
    rebuilds the model. Raises :class:`ddim.checkpoint.CheckpointError`.
    """
    from ddim.checkpoint import CheckpointError, locate
    from ddim.model import init_variables
    from ddim.train.state import ema_variables

    checkpointer, latest = locate(checkpoint=path)
    step = latest if step is None else step
    config = checkpointer.restore_config(step)
    state = checkpointer.restore_state(step)
    checkpointer.close()
    try:
        variables = jax.tree.map(jnp.asarray, ema_variables(state))
    except (KeyError, TypeError) as error:
        raise CheckpointError(f"checkpoint {checkpointer.directory / str(step)} has no EMA weights ({error})") from None
    # The weights must fit the model their stored config describes (shapes and structure).
    model = DiffusionModel(config.model)
    expected = jax.eval_shape(lambda: init_variables(model, jax.random.key(0)))
    expected_shapes = jax.tree.map(lambda x: x.shape, expected)
    if jax.tree.map(lambda x: x.shape, variables) != expected_shapes:
        raise CheckpointError(
            f"checkpoint {checkpointer.directory / str(step)} does not match its config "
            f"({config.name}: widths {config.model.widths}, image size {config.model.image_size})"
        )
    return Pipeline(config, variables, step=step, path=checkpointer.directory / str(step))
