"""User inputs of the verbs, checked and made into model-ready arrays: images, masks and latents.

Every check raises :class:`ddim.errors.InputError` with one sentence saying
what is wrong with which input.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from ddim.errors import InputError
from ddim.images import center_crop_resize, read_image, read_mask, to_uint8


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
