"""Generating images from a trained model: the jitted sampler and the Python API.

>>> import ddim
>>> pipe = ddim.load("runs/flowers64")            # a work directory or a checkpoint step dir
>>> images = pipe.generate(16, steps=20, seed=0)  # uint8, (16, 64, 64, 3)
>>> ddim.save_images(images, "samples/")
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ddim import parallel
from ddim.config import Config
from ddim.errors import InputError
from ddim.images import center_crop_resize, read_image, read_mask, to_uint8
from ddim.model import DiffusionModel
from ddim.spec import SamplingSpec


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


# --- the jitted verbs ---------------------------------------------------------------------------


def _generate_from_latents(model, variables, rng, latents, eta, *, steps, sampler, spacing, keep_trajectory=False):
    return model.apply(
        variables, rng, latents.shape[0], steps, eta, initial_noise=latents, sampler=sampler, spacing=spacing,
        keep_trajectory=keep_trajectory, method=DiffusionModel.generate,
    )


def _trajectory(model, variables, rng, latents, eta, **statics):
    return _generate_from_latents(model, variables, rng, latents, eta, keep_trajectory=True, **statics)[1]


def _invert(model, variables, rng, images, *, steps, spacing):
    return model.apply(variables, images, steps, spacing, method=DiffusionModel.invert)


def _edit(model, variables, rng, images, strength, eta, *, steps, sampler, spacing):
    return model.apply(variables, rng, images, strength, steps, eta, sampler, spacing, method=DiffusionModel.edit)


def _inpaint(model, variables, rng, images, masks, eta, *, steps, sampler, spacing):
    return model.apply(variables, rng, images, masks, steps, eta, sampler, spacing, method=DiffusionModel.inpaint)


@functools.cache
def _jitted(verb: Callable, model: DiffusionModel, out_sharding, statics: tuple) -> Callable:
    """``verb`` jitted for one model, output sharding and set of static settings (one compile each)."""
    return jax.jit(functools.partial(verb, model, **dict(statics)), out_shardings=out_sharding)


def _place(array: np.ndarray, sharding) -> jax.Array:
    """A host array as a global array with ``sharding`` (every process holds the whole array)."""
    array = np.asarray(array)
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def _map_batches(verb, model, variables, arrays, batch_size, seed=0, traced=(), on_batch=None, statics=(),
                 batch_axis=0):
    """Run ``verb`` over ``arrays`` (each ``(N, ...)``) in batches of at most ``batch_size``, on every device.

    Batch ``i`` gets the key ``fold_in(key(seed), i)`` (as :func:`generate_images`),
    is split over the mesh when its size divides the device count (else
    replicated) and comes back to the host; ``traced`` are extra scalar
    arguments; the outputs are concatenated along ``batch_axis``.
    """
    mesh = parallel.data_mesh()
    variables = parallel.replicate(variables, mesh)
    base = jax.random.key(seed)
    count_all = len(arrays[0])
    outputs = []
    for index, start in enumerate(range(0, count_all, batch_size)):
        count = min(batch_size, count_all - start)
        split = count % mesh.devices.size == 0
        sharding = parallel.batch_sharded(mesh) if split else parallel.replicated(mesh)
        out_sharding = sharding
        if batch_axis != 0 and split:
            out_sharding = NamedSharding(mesh, PartitionSpec(*([None] * batch_axis), parallel.DATA_AXIS))
        fn = _jitted(verb, model, out_sharding, tuple(sorted(statics)))
        batch = [_place(array[start : start + count], sharding) for array in arrays]
        result = fn(variables, jax.random.fold_in(base, index), *batch, *traced)
        outputs.append(np.asarray(parallel.to_host(result)))
        if on_batch is not None:
            on_batch(count)
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
) -> np.ndarray:
    """Generate ``num_images`` uint8 images with ``spec`` in batches of at most ``batch_size``.

    Batch ``i`` uses ``fold_in(key(seed), i)``, so the images depend only on
    the seed, the batch size, the sampling spec and the checkpoint.
    ``latents`` (``(num_images, H, W, C)``, checked by the caller) replace the
    seeded initial noise. ``on_batch(n)`` is called after each batch of ``n``
    images (for progress bars).
    """
    if num_images < 1:
        raise InputError(f"the number of images must be >= 1, got {num_images}")
    batch_size = min(batch_size or num_images, num_images)
    if batch_size < 1:
        raise InputError(f"the batch size must be >= 1, got {batch_size}")
    if latents is not None:
        statics = (("steps", spec.steps), ("sampler", spec.sampler), ("spacing", spec.spacing))
        images = _map_batches(_generate_from_latents, model, variables, [latents], batch_size, seed,
                              (jnp.float32(spec.eta),), on_batch, statics)
        return to_uint8(images)
    mesh = parallel.data_mesh()
    variables = parallel.replicate(variables, mesh)
    base = jax.random.key(seed)
    outputs = []
    for index, start in enumerate(range(0, num_images, batch_size)):
        count = min(batch_size, num_images - start)
        # Split the batch over the devices when it divides evenly; otherwise every device does all.
        sharding = parallel.batch_sharded(mesh) if count % mesh.devices.size == 0 else parallel.replicated(mesh)
        fn = generate_fn(model, sharding)
        images = fn(variables, jax.random.fold_in(base, index), count, spec.steps, jnp.float32(spec.eta),
                    spec.sampler, spec.spacing)
        outputs.append(to_uint8(parallel.to_host(images)))
        if on_batch is not None:
            on_batch(count)
    return np.concatenate(outputs)


# --- user images, masks and latents -------------------------------------------------------------


def prepare_images(images, image_size: int, channels: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """User images as float32 ``(N, S, S, C)`` in [0, 1] for a model of size ``S``, and their original sizes.

    ``images``: a uint8 array (or float in [0, 1]) ``(N, H, W, C)`` or one
    ``(H, W, C)`` image, or a list of such images or image file paths (sizes may
    differ). Images of another size are centre-cropped and resized with the
    training preprocessing, with a ``UserWarning`` saying so. Raises
    :class:`InputError` for an empty batch, a wrong shape or channel count,
    floats outside [0, 1] or an unreadable file.
    """
    if isinstance(images, (str, Path)):
        images = [images]
    if isinstance(images, np.ndarray) or hasattr(images, "__array__") and not isinstance(images, (list, tuple)):
        array = np.asarray(images)
        if array.ndim == 3:
            array = array[None]
        if array.ndim != 4:
            raise InputError(f"images must have shape (N, H, W, C) or (H, W, C), got {array.shape}")
        items = list(array)
    else:
        items = [read_image(item, channels) if isinstance(item, (str, Path)) else np.asarray(item) for item in images]
    if not items:
        raise InputError("no images given (an empty batch)")
    prepared, sizes, resized = [], [], []
    for index, item in enumerate(items):
        if item.ndim == 2:
            item = item[..., None]
        if item.ndim != 3:
            raise InputError(f"image {index} must have shape (H, W, C), got {item.shape}")
        if item.shape[-1] != channels:
            raise InputError(f"image {index} has {item.shape[-1]} channels, the model takes {channels}")
        if min(item.shape[:2]) < 1:
            raise InputError(f"image {index} is empty (shape {item.shape})")
        if item.dtype == np.uint8:
            floats = item.astype(np.float32) / 255.0
        elif np.issubdtype(item.dtype, np.floating):
            floats = item.astype(np.float32)
            if not np.all(np.isfinite(floats)) or floats.min() < 0.0 or floats.max() > 1.0:
                raise InputError(f"float image {index} must have values in [0, 1] (uint8 images take 0..255)")
        else:
            raise InputError(f"image {index} must be uint8 or float in [0, 1], got dtype {item.dtype}")
        sizes.append(item.shape[:2])
        if item.shape[:2] != (image_size, image_size):
            resized.append(index)
            floats = center_crop_resize(to_uint8(floats), image_size).astype(np.float32) / 255.0
        prepared.append(floats)
    if resized:
        height, width = sizes[resized[0]]
        warnings.warn(
            f"{len(resized)} image(s) (the first {width}x{height}) centre-cropped and resized to "
            f"{image_size}x{image_size}, the model's size (the training preprocessing)",
            UserWarning,
            stacklevel=3,
        )
    return np.stack(prepared), sizes


def prepare_masks(masks, sizes: list[tuple[int, int]], image_size: int) -> np.ndarray:
    """Masks as float32 ``(N, S, S, 1)``, 1 where to fill, preprocessed like their images.

    ``masks``: one mask for every image or one per image; each a bool, uint8
    (white, > 127 = fill) or float (> 0.5 = fill) array ``(H, W)`` or
    ``(H, W, 1)``, a stack ``(N, H, W[, 1])``, or a mask image file. Each must
    have its image's height and width (before resizing). Raises
    :class:`InputError` otherwise, or when a mask marks nothing to fill.
    """
    if isinstance(masks, (str, Path)):
        masks = [read_mask(masks)]
    elif isinstance(masks, (list, tuple)):
        masks = [read_mask(m) if isinstance(m, (str, Path)) else np.asarray(m) for m in masks]
    else:
        array = np.asarray(masks)
        if array.ndim == 4 or (array.ndim == 3 and array.shape[-1] != 1):
            masks = list(array)
        else:
            masks = [array]
    if len(masks) == 1 and len(sizes) > 1:
        masks = masks * len(sizes)
    if len(masks) != len(sizes):
        raise InputError(f"{len(masks)} masks for {len(sizes)} images (give one mask, or one per image)")
    prepared = []
    for index, (mask, size) in enumerate(zip(masks, sizes)):
        if mask.ndim == 3 and mask.shape[-1] == 1:
            mask = mask[..., 0]
        if mask.ndim == 3:  # an RGB mask image given as an array: any bright channel
            mask = mask.max(axis=-1)
        if mask.ndim != 2:
            raise InputError(f"mask {index} must have shape (H, W) or (H, W, 1), got {tuple(mask.shape)}")
        if mask.shape != tuple(size):
            raise InputError(
                f"mask {index} is {mask.shape[1]}x{mask.shape[0]} but its image is {size[1]}x{size[0]} "
                "(width x height): they must be the same size"
            )
        if mask.dtype == bool:
            fill = mask
        elif mask.dtype == np.uint8:
            fill = mask > 127
        elif np.issubdtype(mask.dtype, np.number):
            fill = mask > 0.5
        else:
            raise InputError(f"mask {index} must be bool, uint8 or float, got dtype {mask.dtype}")
        if tuple(size) != (image_size, image_size):
            fill = center_crop_resize(fill[..., None].astype(np.uint8) * 255, image_size)[..., 0] > 127
        if not fill.any():
            raise InputError(f"mask {index} marks nothing to fill (white or True = the region to fill)")
        prepared.append(fill.astype(np.float32)[..., None])
    return np.stack(prepared)


def check_latents(latents, shape: tuple[int, int, int]) -> np.ndarray:
    """Latents as float32 ``(N, *shape)`` (one ``shape`` latent is a batch of one), else :class:`InputError`."""
    array = np.asarray(latents, dtype=np.float32) if latents is not None else None
    if array is not None and array.ndim == len(shape):
        array = array[None]
    if array is None or array.ndim != len(shape) + 1 or array.shape[1:] != tuple(shape) or len(array) == 0:
        got = None if array is None else array.shape
        raise InputError(f"latents must have shape (N, {', '.join(map(str, shape))}) with N >= 1, got {got}")
    if not np.all(np.isfinite(array)):
        raise InputError("latents must be finite")
    return array


class Reconstruction(NamedTuple):
    """What :meth:`Pipeline.reconstruct` returns."""

    images: np.ndarray
    """The reconstructions, uint8 ``(N, H, W, C)``."""
    errors: np.ndarray
    """Per-image mean squared error over pixels and channels, on [0, 1] values, ``(N,)``."""
    latents: np.ndarray
    """The inverted latents, float32 ``(N, H, W, C)``."""
    inputs: np.ndarray
    """The inputs as the model saw them (after any crop and resize), uint8."""


class Pipeline:
    """A trained model and its verbs: generate, invert, reconstruct, interpolate, edit, inpaint.

    Every verb is jitted with static step counts (one compile per setting),
    batched (``batch_size`` bounds memory), deterministic for a seed, and runs
    on every device of the mesh. Images come back as uint8 ``(N, H, W, C)``.
    Bad arguments raise :class:`ddim.images.InputError`, a ``ValueError``
    whose one sentence says what is wrong.
    """

    def __init__(self, config: Config, variables: dict[str, Any], step: int | None = None, path: Path | None = None):
        self.config = config
        self.model = DiffusionModel(config.model)
        self.variables = variables
        self.step = step
        self.path = path

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.model.image_shape

    def _batch_size(self, batch_size: int | None, count: int) -> int:
        if batch_size is not None and batch_size < 1:
            raise InputError(f"the batch size must be >= 1, got {batch_size}")
        return min(batch_size or count, count)

    def generate(
        self,
        num_images: int | None = None,
        steps: int | None = None,
        seed: int = 0,
        eta: float | None = None,
        batch_size: int | None = None,
        on_batch: Callable[[int], None] | None = None,
        sampler: str | None = None,
        spacing: str | None = None,
        latents: np.ndarray | None = None,
        *,
        spec: SamplingSpec | None = None,
    ) -> np.ndarray:
        """Sample images with the EMA weights: uint8 ``(num_images, H, W, C)``.

        - ``num_images`` >= 1 (default 16, or the number of ``latents``).
        - ``spec``: a :class:`ddim.spec.SamplingSpec`; ``steps``, ``sampler``,
          ``spacing`` and ``eta`` change single fields of it (default: 20 steps of
          deterministic DDIM on the uniform grid). ``steps`` >= 1 is the cost of
          sampling; ``sampler`` is ``"ddim"`` (DDIM eq. 12), ``"dpmpp-2m"`` or
          ``"dpmpp-3m"`` (see :mod:`ddim.samplers`); ``spacing`` is ``"uniform"``,
          ``"logsnr"`` or ``"karras"``; ``eta`` >= 0 is DDIM's fresh noise per step
          (eq. 16; only the ``ddim`` sampler takes ``eta > 0``).
        - ``seed``: same seed, arguments and checkpoint give the same pixels.
        - ``latents``: float ``(N, H, W, C)`` initial noise instead of the
          seeded one (from :meth:`latents`, :meth:`invert` or :meth:`interpolate`'s
          inputs); ``generate(latents=pipe.latents(n, seed))`` gives the pixels of
          ``generate(n, seed=seed)``.
        - ``batch_size``: images generated at once (bounds memory); ``on_batch(n)``
          is called after each batch of ``n``.

        Raises ``ValueError`` (one sentence) for a non-positive count or step
        count, an unknown sampler or spacing (listing the valid ones), a bad
        eta, or latents of the wrong shape or count.
        """
        spec = SamplingSpec.of(spec, steps=steps, sampler=sampler, spacing=spacing, eta=eta)
        if latents is not None:
            latents = check_latents(latents, self.image_shape)
            if num_images is not None and num_images != len(latents):
                raise InputError(f"num_images is {num_images} but {len(latents)} latents were given")
            num_images = len(latents)
        num_images = 16 if num_images is None else num_images
        return generate_images(self.model, self.variables, num_images, spec, seed, batch_size, on_batch, latents)

    def latents(self, num_images: int = 1, seed: int = 0, batch_size: int | None = None) -> np.ndarray:
        """The initial noise ``generate(num_images, seed=seed, batch_size=batch_size)`` starts from, float32."""
        if num_images < 1:
            raise InputError(f"the number of latents must be >= 1, got {num_images}")
        batch_size = self._batch_size(batch_size, num_images)
        base, shape, parts = jax.random.key(seed), self.image_shape, []
        for index, start in enumerate(range(0, num_images, batch_size)):
            count = min(batch_size, num_images - start)
            init_rng, _ = jax.random.split(jax.random.fold_in(base, index))  # as DiffusionModel.generate
            parts.append(np.asarray(jax.random.normal(init_rng, (count, *shape), jnp.float32)))
        return np.concatenate(parts)

    def trajectory(
        self,
        num_images: int = 16,
        steps: int | None = None,
        seed: int = 0,
        eta: float | None = None,
        sampler: str | None = None,
        spacing: str | None = None,
        batch_size: int | None = None,
        latents: np.ndarray | None = None,
        on_batch: Callable[[int], None] | None = None,
        *,
        spec: SamplingSpec | None = None,
    ) -> np.ndarray:
        """The predicted clean images after every step of :meth:`generate`: uint8 ``(steps, N, H, W, C)``.

        Same arguments as :meth:`generate`; the last frame is its sample. Shows
        how the reverse process settles the image, coarse to fine.
        """
        spec = SamplingSpec.of(spec, steps=steps, sampler=sampler, spacing=spacing, eta=eta)
        if latents is None:
            if num_images < 1:
                raise InputError(f"the number of images must be >= 1, got {num_images}")
            latents = self.latents(num_images, seed, batch_size)
        latents = check_latents(latents, self.image_shape)
        statics = (("steps", spec.steps), ("sampler", spec.sampler), ("spacing", spec.spacing))
        frames = _map_batches(_trajectory, self.model, self.variables, [latents], self._batch_size(batch_size, len(latents)),
                              seed, (jnp.float32(spec.eta),), on_batch, statics=statics, batch_axis=1)
        return to_uint8(frames)

    def invert(self, images, steps: int | None = None, spacing: str | None = None, batch_size: int | None = None,
               on_batch: Callable[[int], None] | None = None, *, spec: SamplingSpec | None = None) -> np.ndarray:
        """Encode images to latents: deterministic DDIM run from the data to the noise (DDIM eq. 13).

        ``images``: uint8 (or float in [0, 1]) ``(N, H, W, C)``, one image, or a
        list of images or files (see :func:`prepare_images`). The time grid is
        :meth:`generate`'s for the same ``steps`` (>= 1) and ``spacing`` (of
        ``spec``; inversion is always deterministic DDIM), so
        ``generate(latents=invert(x, steps), steps=steps)`` reconstructs ``x``,
        the closer the more steps (:meth:`reconstruct`). Deterministic; returns
        float32 latents ``(N, H, W, C)``. See :meth:`ddim.model.DiffusionModel.invert`.
        """
        spec = _inversion_spec(spec, steps, spacing)
        prepared, _ = prepare_images(images, self.config.model.image_size, self.config.model.channels)
        return self._invert_prepared(prepared, spec, batch_size, on_batch)

    def _invert_prepared(self, prepared, spec: SamplingSpec, batch_size, on_batch=None):
        statics = (("steps", spec.steps), ("spacing", spec.spacing))
        return _map_batches(_invert, self.model, self.variables, [prepared], self._batch_size(batch_size, len(prepared)),
                            on_batch=on_batch, statics=statics)

    def reconstruct(self, images, steps: int | None = None, spacing: str | None = None, batch_size: int | None = None,
                    *, spec: SamplingSpec | None = None) -> Reconstruction:
        """Invert then generate with the same ``steps`` and ``spacing``: how well the model encodes ``images``.

        Returns a :class:`Reconstruction`: the uint8 reconstructions, the
        per-image mean squared error on [0, 1] pixels (the measure of the DDIM
        paper's Table 2), the latents and the inputs as the model saw them.
        """
        spec = _inversion_spec(spec, steps, spacing)
        prepared, _ = prepare_images(images, self.config.model.image_size, self.config.model.channels)
        batch_size = self._batch_size(batch_size, len(prepared))
        latents = self._invert_prepared(prepared, spec, batch_size)
        statics = (("steps", spec.steps), ("sampler", "ddim"), ("spacing", spec.spacing))
        floats = _map_batches(_generate_from_latents, self.model, self.variables, [latents], batch_size, 0,
                              (jnp.float32(0.0),), statics=statics)
        errors = np.mean((floats.astype(np.float64) - prepared) ** 2, axis=(1, 2, 3))
        return Reconstruction(to_uint8(floats), errors, latents, to_uint8(prepared))

    def interpolate(self, a, b, frames: int = 16, steps: int | None = None, spacing: str | None = None,
                    batch_size: int | None = None, *, spec: SamplingSpec | None = None) -> np.ndarray:
        """Images along the spherical interpolation (slerp) from latent ``a`` to latent ``b``: uint8 ``(frames, H, W, C)``.

        ``a`` and ``b``: latents ``(H, W, C)`` (or a batch of one), e.g. from
        :meth:`latents` (a seed) or :meth:`invert` (a real image); ``frames`` >= 2
        includes both ends. Decoded with deterministic DDIM (``steps``, ``spacing``;
        use the ones the latents were inverted with). See :func:`ddim.diffusion.slerp`.
        """
        from ddim.diffusion import slerp

        spec = _inversion_spec(spec, steps, spacing)
        a, b = check_latents(a, self.image_shape), check_latents(b, self.image_shape)
        if len(a) != 1 or len(b) != 1:
            raise InputError(f"interpolate takes one latent at each end, got {len(a)} and {len(b)}")
        if not isinstance(frames, (int, np.integer)) or frames < 2:
            raise InputError(f"frames must be an integer >= 2 (both ends included), got {frames!r}")
        if not (np.any(a) and np.any(b)):
            raise InputError("a latent to interpolate is all zeros (it has no direction)")
        path = np.array(slerp(a[0], b[0], np.linspace(0.0, 1.0, frames)))
        path[0], path[-1] = a[0], b[0]  # the ends exactly, not to rounding
        return self.generate(latents=path, spec=spec, batch_size=batch_size)

    def edit(self, images, strength: float = 0.6, steps: int | None = None, seed: int = 0, sampler: str | None = None,
             spacing: str | None = None, eta: float | None = None, batch_size: int | None = None,
             *, spec: SamplingSpec | None = None) -> np.ndarray:
        """Image-to-image editing (SDEdit, Meng et al. 2021): noise ``images`` to ``strength`` and denoise.

        ``strength`` in (0, 1]: the diffusion time the inputs are noised to;
        about 0.3 keeps the composition and changes details, 0.6-0.8 keeps
        colours and rough layout, 1 is plain sampling from the seed's noise
        (equal to ``generate(len(images), seed=seed)``). ``spec.steps`` >= 1 network
        calls run from ``strength`` to the clean end with the spec's sampler,
        spacing and eta (as :meth:`generate`). Returns uint8 ``(N, H, W, C)``.
        """
        if isinstance(strength, bool) or not isinstance(strength, (int, float, np.floating, np.integer)) \
                or not 0.0 < strength <= 1.0:
            raise InputError(f"strength must be in (0, 1], got {strength!r}")
        spec = SamplingSpec.of(spec, steps=steps, sampler=sampler, spacing=spacing, eta=eta)
        prepared, _ = prepare_images(images, self.config.model.image_size, self.config.model.channels)
        batch_size = self._batch_size(batch_size, len(prepared))
        if strength == 1.0:  # plain sampling: the input is not used at all
            return self.generate(len(prepared), seed=seed, batch_size=batch_size, spec=spec)
        statics = (("steps", spec.steps), ("sampler", spec.sampler), ("spacing", spec.spacing))
        floats = _map_batches(_edit, self.model, self.variables, [prepared], batch_size, seed,
                              (jnp.float32(strength), jnp.float32(spec.eta)), statics=statics)
        return to_uint8(floats)

    def inpaint(self, images, mask, steps: int | None = None, seed: int = 0, sampler: str | None = None,
                spacing: str | None = None, eta: float | None = None, batch_size: int | None = None,
                *, spec: SamplingSpec | None = None) -> np.ndarray:
        """Fill the masked region of ``images`` consistently with the rest (RePaint-style, without resampling).

        ``mask``: white/True/1 = the region to fill; one mask for all images or
        one per image, as a bool/uint8/float array of the image's height and
        width or a mask image file (see :func:`prepare_masks`). Outside the mask
        the result keeps the input's pixels. ``spec`` (or ``steps``, ``sampler``,
        ``spacing``, ``eta``) and ``seed`` as :meth:`generate`. Returns uint8 ``(N, H, W, C)``.
        """
        spec = SamplingSpec.of(spec, steps=steps, sampler=sampler, spacing=spacing, eta=eta)
        prepared, sizes = prepare_images(images, self.config.model.image_size, self.config.model.channels)
        masks = prepare_masks(mask, sizes, self.config.model.image_size)
        statics = (("steps", spec.steps), ("sampler", spec.sampler), ("spacing", spec.spacing))
        floats = _map_batches(_inpaint, self.model, self.variables, [prepared, masks],
                              self._batch_size(batch_size, len(prepared)), seed, (jnp.float32(spec.eta),), statics=statics)
        return to_uint8(floats)

    def __repr__(self) -> str:
        return f"Pipeline(name={self.config.name!r}, step={self.step}, path={str(self.path)!r})"


def _inversion_spec(spec: SamplingSpec | None, steps: int | None, spacing: str | None) -> SamplingSpec:
    """The spec of a deterministic DDIM pass (inversion and decoding): ``spec``'s steps and spacing only."""
    spec = SamplingSpec.of(spec, steps=steps, spacing=spacing)
    return SamplingSpec(steps=spec.steps, spacing=spec.spacing, guidance=spec.guidance)


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
