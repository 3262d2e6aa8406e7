"""Converting, tiling and saving images (uint8 NHWC arrays and PNG files)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from ddim.errors import UserError
import numpy as np


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
