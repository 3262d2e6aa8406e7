"""Reading one image file with Pillow: every format, mode and orientation to RGB, or a reason it is bad.

:func:`read_image` never raises for a bad file: it returns a :class:`Decoded`
whose ``reason`` is one of :data:`REASONS`, so one unreadable photo among
thousands is skipped and reported instead of stopping a run. Only numpy and
Pillow are imported, so preprocessing worker processes start fast.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np

from ddim.data.preprocess import center_crop_resize

# Extensions scanned in an image folder (lower case); other files are ignored, not reported as bad.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".jpe", ".webp", ".bmp", ".dib", ".tif", ".tiff", ".gif")

# Why a file was skipped (keys of the report's counts), with the words of the warning line.
REASONS = {
    "empty": "empty file (0 bytes)",
    "unreadable": "cannot be read",
    "not_an_image": "not an image Pillow can read",
    "truncated": "truncated or corrupt image data",
    "too_large": "decompression bomb: more pixels than data.max_image_pixels",
    "too_small": "smaller than data.min_image_size",
}

# Transparent pixels are composited on this background (white, as most viewers show them).
BACKGROUND = (255, 255, 255)


@dataclass
class Decoded:
    """The result of reading one file: pixels, or why there are none."""

    pixels: np.ndarray | None
    """The preprocessed ``(size, size, 3)`` uint8 image, or None for a bad file."""
    width: int = 0
    """Width of the source image after EXIF orientation (0 when unknown)."""
    height: int = 0
    reason: str = ""
    """A key of :data:`REASONS` when the file is bad."""
    detail: str = ""
    """What Pillow or the OS said, for the report."""


def _to_rgb(image):
    """Any Pillow mode as 8-bit RGB: alpha composited on :data:`BACKGROUND`, 16-bit and float rescaled."""
    from PIL import Image

    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        # 16-bit grey: keep the high byte, as Pillow itself reads 16-bit RGB files.
        values = np.asarray(image, dtype=np.int64)
        image = Image.fromarray(np.clip(values >> 8, 0, 255).astype(np.uint8), "L")
    elif image.mode == "F":
        values = np.asarray(image, dtype=np.float64)
        scale = 255.0 if np.nanmax(values, initial=0.0) <= 1.0 else 1.0  # [0, 1] floats or already 0..255
        image = Image.fromarray(np.clip(np.round(np.nan_to_num(values) * scale), 0, 255).astype(np.uint8), "L")
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (image.mode in ("L", "RGB") and "transparency" in image.info):
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, BACKGROUND + (255,))
        image = Image.alpha_composite(background, image)
    if image.mode != "RGB":
        image = image.convert("RGB")  # L, 1, CMYK (Pillow undoes Adobe's inverted CMYK), YCbCr, LAB, HSV
    return image


def read_image(path: str, size: int, min_size: int, max_pixels: int) -> Decoded:
    """Decode ``path`` (first frame of an animation, EXIF orientation applied) and preprocess it.

    ``min_size``: the smallest accepted shorter side; ``max_pixels``: Pillow's
    decompression-bomb limit (width x height).
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        if os.path.getsize(path) == 0:
            return Decoded(None, reason="empty")
        file = open(path, "rb")
    except OSError as error:
        return Decoded(None, reason="unreadable", detail=error.strerror or str(error))
    Image.MAX_IMAGE_PIXELS = max_pixels
    with file, warnings.catch_warnings():
        # Pillow warns above MAX_IMAGE_PIXELS and only fails at twice that; refuse at the limit itself.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(file) as image:
                image.load()  # the first frame of GIFs, animated WebPs and multi-page TIFFs
                image = ImageOps.exif_transpose(image)
                width, height = image.size
                if min(width, height) < min_size:
                    return Decoded(None, width, height, "too_small", f"{width}x{height} < {min_size}")
                rgb = np.asarray(_to_rgb(image))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
            return Decoded(None, reason="too_large", detail=str(error).split(". ")[0])
        except UnidentifiedImageError:
            return Decoded(None, reason="not_an_image")
        except MemoryError:
            return Decoded(None, reason="too_large", detail="out of memory while decoding")
        except Exception as error:  # noqa: BLE001 - decoders raise OSError, ValueError, SyntaxError, ...
            return Decoded(None, reason="truncated", detail=str(error) or type(error).__name__)
    return Decoded(center_crop_resize(rgb, size), width, height)
