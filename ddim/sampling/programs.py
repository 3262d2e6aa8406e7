"""The compiled verbs and the one loop that runs them over batches on every device.

A *program* is a verb of :mod:`ddim.sampling.process` with its static
settings bound (the spec's steps, sampler and spacing; for seeded sampling the
batch size) and jitted once per model, output sharding and settings.
:func:`map_batches` runs a program over host arrays batch by batch, splitting
each batch over the device mesh, and is the only batching loop of the verbs.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ddim import parallel
from ddim.errors import InputError
from ddim.images import to_uint8
from ddim.model import DiffusionModel
from ddim.sampling import process
from ddim.spec import SamplingSpec


def program_spec(spec: SamplingSpec) -> SamplingSpec:
    """What a compiled program is specialised on: :attr:`SamplingSpec.static`."""
    return spec.static


# --- the programs: (model, variables, rng, *batch arrays, *traced scalars, cond, **statics) ----------------------


def sample(model, variables, rng, eta, cond, *, spec, num_images):
    return process.generate(model, variables, rng, num_images, spec, eta=eta, cond=cond)


def sample_from(model, variables, rng, latents, eta, cond, *, spec):
    return process.generate(model, variables, rng, latents.shape[0], spec, eta=eta, latents=latents, cond=cond)


def trajectory(model, variables, rng, latents, eta, cond, *, spec):
    return process.generate(model, variables, rng, latents.shape[0], spec, eta=eta, latents=latents, cond=cond,
                            keep_trajectory=True)[1]


def invert(model, variables, rng, images, cond, *, spec):
    return process.invert(model, variables, images, spec, cond=cond)


def edit(model, variables, rng, images, strength, eta, cond, *, spec):
    return process.edit(model, variables, rng, images, strength, spec, eta=eta, cond=cond)


def inpaint(model, variables, rng, images, masks, eta, cond, *, spec):
    return process.inpaint(model, variables, rng, images, masks, spec, eta=eta, cond=cond)


@functools.cache
def _jitted(program: Callable, model: DiffusionModel, out_sharding, statics: tuple) -> Callable:
    """``program`` jitted for one model, output sharding and set of static settings (one compile each)."""
    return jax.jit(functools.partial(program, model, **dict(statics)), out_shardings=out_sharding)


def program_fn(program: Callable, model: DiffusionModel, spec: SamplingSpec, *, num_images: int | None = None,
               out_sharding=None) -> Callable:
    """``program`` as :func:`map_batches` runs it on a batch: bound to ``model``, ``spec``'s static settings and (for
    seeded sampling) ``num_images``, jitted once per combination; ``f(variables, rng, *batch arrays, *traced, cond)``."""
    statics = (("spec", program_spec(spec)),) + ((("num_images", num_images),) if num_images is not None else ())
    return _jitted(program, model, out_sharding, statics)


def _place(array: np.ndarray, sharding) -> jax.Array:
    """A host array as a global array with ``sharding`` (every process holds the whole array)."""
    array = np.asarray(array)
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def check_batch_size(batch_size: int | None, count: int) -> int:
    """The batch size to use for ``count`` items (default: all at once), else :class:`InputError`."""
    if batch_size is not None and batch_size < 1:
        raise InputError(f"the batch size must be >= 1, got {batch_size}")
    return min(batch_size or count, count)


def map_batches(
    program: Callable,
    model: DiffusionModel,
    variables,
    spec: SamplingSpec,
    *,
    count: int,
    batch_size: int | None = None,
    arrays: Sequence[np.ndarray] = (),
    traced: Sequence[Any] = (),
    cond=None,
    seed: int = 0,
    on_batch: Callable[[int], None] | None = None,
    batch_axis: int = 0,
) -> np.ndarray:
    """Run ``program`` over ``count`` items in batches of at most ``batch_size``, on every device.

    ``arrays`` (each ``(count, ...)``) and every leaf of the ``cond`` pytree are
    cut into the batches; a program without arrays (seeded sampling) gets the
    batch size as its static ``num_images``. Batch ``i`` gets the key
    ``fold_in(key(seed), i)``, so results depend only on the seed, the batch
    size, the spec and the checkpoint. A batch is split over the mesh when its
    size divides the device count (else replicated) and comes back to the
    host; ``traced`` are extra scalar arguments (``eta``, a strength); the
    outputs are concatenated along ``batch_axis``. ``on_batch(n)`` is called
    after each batch of ``n`` (for progress bars).
    """
    mesh = parallel.data_mesh()
    variables = parallel.replicate(variables, mesh)
    base, batch_size = jax.random.key(seed), check_batch_size(batch_size, count)
    outputs = []
    for index, start in enumerate(range(0, count, batch_size)):
        size = min(batch_size, count - start)
        split = size % mesh.devices.size == 0
        sharding = parallel.batch_sharded(mesh) if split else parallel.replicated(mesh)
        out_sharding = sharding
        if batch_axis != 0 and split:
            out_sharding = NamedSharding(mesh, PartitionSpec(*([None] * batch_axis), parallel.DATA_AXIS))
        fn = program_fn(program, model, spec, num_images=None if arrays else size, out_sharding=out_sharding)
        batch = [_place(array[start : start + size], sharding) for array in arrays]
        batch_cond = jax.tree.map(lambda leaf: _place(leaf[start : start + size], sharding), cond)
        result = fn(variables, jax.random.fold_in(base, index), *batch, *traced, batch_cond)
        outputs.append(np.asarray(parallel.to_host(result)))
        if on_batch is not None:
            on_batch(size)
    return np.concatenate(outputs, axis=batch_axis)


def generate_images(
    model: DiffusionModel,
    variables: dict[str, Any],
    num_images: int,
    spec: SamplingSpec,
    seed: int = 0,
    batch_size: int | None = None,
    on_batch: Callable[[int], None] | None = None,
    latents: np.ndarray | None = None,
    cond=None,
) -> np.ndarray:
    """Generate ``num_images`` uint8 images with ``spec`` in batches of at most ``batch_size``.

    ``latents`` (``(num_images, H, W, C)``, checked by the caller) replace the
    seeded initial noise; see :func:`map_batches` for the batching and seeds.
    """
    if num_images < 1:
        raise InputError(f"the number of images must be >= 1, got {num_images}")
    arrays = [] if latents is None else [latents]
    images = map_batches(sample if latents is None else sample_from, model, variables, spec, count=num_images,
                         batch_size=batch_size, arrays=arrays, traced=(jnp.float32(spec.eta),), cond=cond,
                         seed=seed, on_batch=on_batch)
    return to_uint8(images)


def seeded_latents(image_shape, num_images: int, seed: int = 0, batch_size: int | None = None) -> np.ndarray:
    """The initial noise that seeded sampling of ``num_images`` with ``batch_size`` starts from, float32."""
    if num_images < 1:
        raise InputError(f"the number of latents must be >= 1, got {num_images}")
    batch_size = check_batch_size(batch_size, num_images)
    base, parts = jax.random.key(seed), []
    for index, start in enumerate(range(0, num_images, batch_size)):
        count = min(batch_size, num_images - start)
        noise, _ = process.initial_noise(jax.random.fold_in(base, index), count, image_shape)
        parts.append(np.asarray(noise))
    return np.concatenate(parts)
