"""Uploaded files: decoded with checks (not an image, damaged, over the pixel limit) and painted masks.

Decoded as the command line reads image files (:func:`ddim.images.read_image`):
EXIF rotation applied, alpha dropped, RGB (grey for a one-channel model). The
pixel limit is checked from the header, before anything is decoded, so a tiny
file that claims a huge image (a decompression bomb) costs nothing.
"""

from __future__ import annotations

import dataclasses
import io
import warnings

import numpy as np

from ddim.ui.checks import UIError


@dataclasses.dataclass(frozen=True)
class Upload:
    """An uploaded file as the page received it: its bytes and the name it had on the user's machine."""

    data: bytes
    name: str = "IMAGE"


def require_upload(upload: Upload | None) -> Upload:
    if upload is None:
        raise UIError("upload an image first")
    return upload


def read_image(data: bytes, max_pixels: int, grey: bool = False, what: str = "the uploaded file") -> np.ndarray:
    """Decode an uploaded image file to uint8 ``(H, W, 3)`` (``(H, W, 1)`` if ``grey``), or raise :class:`UIError`.

    Refuses anything Pillow cannot read, files that are damaged or truncated and
    images over ``max_pixels`` (checked from the header, before decoding).
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our limit is lower
            image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > max_pixels:
            raise UIError(_too_large(what, width, height, max_pixels))
        image.load()
        image = ImageOps.exif_transpose(image)
        pixels = np.asarray(image.convert("L" if grey else "RGB"), dtype=np.uint8)
        return pixels[..., None] if grey else pixels
    except UIError:
        raise
    except Image.DecompressionBombError:  # Pillow's own refusal, far above ours
        raise UIError(f"{what} is over the limit of {max_pixels / 1e6:.1f} megapixels; downscale it first") from None
    except UnidentifiedImageError:
        raise UIError(f"{what} is not an image (PNG, JPEG, WebP, GIF, BMP or TIFF)") from None
    except (OSError, SyntaxError, ValueError) as error:  # Pillow's ways of saying "damaged"
        raise UIError(f"{what} is a damaged or truncated image ({error})") from None


def read_painted(data: bytes, max_pixels: int, grey: bool = False, what: str = "the painted mask") -> np.ndarray:
    """The region a painted layer marks, bool ``(H, W)``: its opaque pixels (alpha > 0).

    A layer without transparency is read as a mask image: white (brighter than
    mid-grey) marks the region, as ``ddim inpaint --mask`` reads it.
    """
    from PIL import Image

    read_image(data, max_pixels, grey, what)  # the same checks as any upload
    with Image.open(io.BytesIO(data)) as image:
        if "A" in image.getbands() or "transparency" in image.info:
            return np.asarray(image.convert("RGBA"))[..., 3] > 0
        return np.asarray(image.convert("L")) > 127


def check_mask(mask) -> np.ndarray:
    """The painted region as bool ``(H, W)``; an empty or missing one is refused."""
    mask = np.asarray(mask, dtype=bool) if mask is not None else None
    if mask is None or mask.ndim != 2 or not mask.any():
        raise UIError("paint the region to fill over the image with the brush first (nothing is marked)")
    return mask


def resize_mask(mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``mask`` at ``(height, width)`` ``shape``, nearest neighbour (a mask stays a mask)."""
    from PIL import Image

    image = Image.fromarray(mask.astype(np.uint8) * 255).resize((shape[1], shape[0]), Image.NEAREST)
    return np.asarray(image) > 127


def _too_large(what: str, width: int, height: int, max_pixels: int) -> str:
    return (
        f"{what} is {width}x{height} = {width * height / 1e6:.1f} megapixels, over the limit of "
        f"{max_pixels / 1e6:.1f} megapixels; downscale it first"
    )
