"""Converting, tiling and saving images (uint8 NHWC arrays and PNG files)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ddim.errors import InputError, UserError


class OutputError(UserError, RuntimeError):
    """An output directory cannot be used (the message says which and why)."""


def to_uint8(images) -> np.ndarray:
    """Float images in [0, 1] -> uint8 (values outside are clipped)."""
    images = np.asarray(images, dtype=np.float32)
    return np.clip(np.round(images * 255.0), 0, 255).astype(np.uint8)


def make_grid(images, rows: int | None = None, cols: int | None = None, padding: int = 2) -> np.ndarray:
    """Tile ``(N, H, W, C)`` uint8 images into one ``(rows*H', cols*W', C)`` image with white padding."""
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"expected images of shape (N, H, W, C), got {images.shape}")
    count, height, width, channels = images.shape
    if cols is None:
        cols = math.ceil(math.sqrt(count)) if rows is None else math.ceil(count / rows)
    if rows is None:
        rows = math.ceil(count / cols)
    if rows * cols < count:
        raise ValueError(f"a {rows}x{cols} grid cannot hold {count} images")
    cell_h, cell_w = height + padding, width + padding
    grid = np.full((rows * cell_h + padding, cols * cell_w + padding, channels), 255, dtype=images.dtype)
    for index, image in enumerate(images):
        row, col = divmod(index, cols)
        top, left = padding + row * cell_h, padding + col * cell_w
        grid[top : top + height, left : left + width] = image
    return grid


def save_png(image, path: str | Path) -> Path:
    """Write one ``(H, W, C)`` uint8 image as PNG, atomically (write to a temp file, then rename)."""
    from PIL import Image

    path = Path(path)
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    tmp = path.with_name(f".{path.name}.tmp")
    Image.fromarray(image).save(tmp, format="PNG")
    os.replace(tmp, path)
    return path


def prepare_output_dir(directory: str | Path, names: list[str], overwrite: bool = False) -> Path:
    """Create ``directory`` if needed and check it can take files ``names``.

    Refuses (with :class:`OutputError`) a path that is a file, a directory that is
    not writable, and existing files of the same names unless ``overwrite``.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise OutputError(f"output path {directory} exists and is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"cannot create output directory {directory}: {error.strerror or error}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputError(f"output directory {directory} is not writable")
    if not overwrite:
        existing = [name for name in names if (directory / name).exists()]
        if existing:
            raise OutputError(
                f"{directory / existing[0]} already exists ({len(existing)} file(s) would be overwritten); "
                "use --overwrite or another --out"
            )
    return directory


def save_images(images, directory: str | Path, grid: bool = True, overwrite: bool = False, start: int = 0) -> list[Path]:
    """Save uint8 images as ``NNNN.png`` (numbered from ``start``) and optionally ``grid.png``."""
    images = np.asarray(images)
    names = [f"{start + i:04d}.png" for i in range(len(images))] + (["grid.png"] if grid else [])
    directory = prepare_output_dir(directory, names, overwrite)
    paths = [save_png(image, directory / name) for image, name in zip(images, names)]
    if grid:
        paths.append(save_png(make_grid(images), directory / "grid.png"))
    return paths


def save_gif(frames, path: str | Path, duration_ms: int = 100, overwrite: bool = False) -> Path:
    """Write ``(T, H, W, C)`` uint8 frames as a looping animated GIF, atomically.

    Refuses (with :class:`OutputError`) an existing file unless ``overwrite``.
    """
    from PIL import Image

    path = Path(path)
    if path.exists() and not overwrite:
        raise OutputError(f"{path} already exists; use --overwrite or another --out")
    frames = np.asarray(frames)
    if frames.ndim == 4 and frames.shape[-1] == 1:
        frames = frames[..., 0]
    pictures = [Image.fromarray(frame) for frame in frames]
    tmp = path.with_name(f".{path.name}.tmp")
    pictures[0].save(tmp, format="GIF", save_all=True, append_images=pictures[1:], duration=duration_ms, loop=0)
    os.replace(tmp, path)
    return path


def read_image(path: str | Path, channels: int = 3) -> np.ndarray:
    """One image file as uint8 ``(H, W, channels)`` (EXIF orientation applied; alpha dropped).

    Raises :class:`InputError` naming the file when it is missing or not an image.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    path = Path(path)
    try:
        with Image.open(path) as image:
            image = ImageOps.exif_transpose(image)
            image = image.convert("RGB" if channels == 3 else "L")
            pixels = np.asarray(image, dtype=np.uint8)
    except FileNotFoundError:
        raise InputError(f"image {path} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"image {path} is a directory, not an image file") from None
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise InputError(f"cannot read image {path}: {str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
    return pixels if pixels.ndim == 3 else pixels[..., None]


def read_mask(path: str | Path) -> np.ndarray:
    """A mask image as bool ``(H, W)``: True (white, brighter than mid-grey) marks the region to fill."""
    return read_image(path, channels=1)[..., 0] > 127


def center_crop_resize(image, size: int) -> np.ndarray:
    """The training preprocessing of one uint8 ``(H, W, C)`` image: centre crop to a square, antialiased resize.

    The same function as the input pipeline's
    (:func:`ddim.data.preprocess.center_crop_resize`), so a photo gives the
    model the pixels it would have seen in training.
    """
    from ddim.data.preprocess import center_crop_resize as preprocess

    return preprocess(np.asarray(image, np.uint8), size)
