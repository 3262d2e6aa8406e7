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

from ddim import parallel
from ddim.config import Config
from ddim.images import to_uint8
from ddim.model import DiffusionModel


@functools.cache
def generate_fn(model: DiffusionModel, out_sharding=None) -> Callable:
    """``f(variables, rng, num_images, diffusion_steps, eta) -> float images``, jitted.

    ``num_images`` and ``diffusion_steps`` are static (the loop length and the
    array shapes); ``eta`` is traced, so changing it does not recompile. With
    ``out_sharding`` (batch-sharded over a mesh) XLA splits the whole sampler
    along the batch. Cached per model (flax modules are hashable dataclasses).
    """

    def generate(variables, rng, num_images, diffusion_steps, eta):
        return model.apply(variables, rng, num_images, diffusion_steps, eta, method=DiffusionModel.generate)

    return jax.jit(generate, static_argnames=("num_images", "diffusion_steps"), out_shardings=out_sharding)


def generate_images(
    model: DiffusionModel,
    variables: dict[str, Any],
    num_images: int,
    steps: int,
    seed: int = 0,
    eta: float = 0.0,
    batch_size: int | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Generate ``num_images`` uint8 images in batches of at most ``batch_size``.

    Batch ``i`` uses ``fold_in(key(seed), i)``, so the images depend only on
    the seed, the batch size and the checkpoint. ``on_batch(n)`` is called
    after each batch of ``n`` images (for progress bars).
    """
    if num_images < 1:
        raise ValueError(f"the number of images must be >= 1, got {num_images}")
    if steps < 1:
        raise ValueError(f"the number of diffusion steps must be >= 1, got {steps}")
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
        images = fn(variables, jax.random.fold_in(base, index), count, steps, jnp.float32(eta))
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
    ) -> np.ndarray:
        """Sample with the EMA weights; same arguments and checkpoint give the same pixels."""
        return generate_images(self.model, self.variables, num_images, steps, seed, eta, batch_size, on_batch)

    def __repr__(self) -> str:
        return f"Pipeline(name={self.config.name!r}, step={self.step}, path={str(self.path)!r})"


def load(path: str | Path, step: int | None = None, warn: Callable[[str], None] | None = None) -> Pipeline:
    """Load a pipeline from a work directory, its ``checkpoints`` folder or a checkpoint step dir.

    Needs nothing but the checkpoint: the config stored beside the weights
    rebuilds the model. Without a step (none given, no step directory named),
    the newest intact checkpoint is used: a damaged newer one is skipped with
    a one-line warning through ``warn`` (default: stderr) and set aside when
    no training run owns the directory. Raises
    :class:`ddim.checkpoint.CheckpointError`, also for a damaged named step.
    """
    from ddim.checkpoint import CheckpointError, locate
    from ddim.model import init_variables
    from ddim.train.state import ema_variables

    checkpointer, named = locate(checkpoint=path)
    try:
        found = checkpointer.restore(
            lambda s: (checkpointer.restore_config(s), checkpointer.restore_state(s)),
            step=step if step is not None else named,
            warn=warn,
        )
    finally:
        checkpointer.close()
    if found is None:
        raise CheckpointError(f"no checkpoints in {checkpointer.directory} (train first: ddim train --workdir ...)")
    step, (config, state) = found
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
