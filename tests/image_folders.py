"""Tiny generated image folders for the data tests: every format and mode, and every kind of bad file."""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

from tests.conftest import tiny_config


def smooth_image(seed: int, height: int, width: int) -> np.ndarray:
    """A smooth random RGB image (compresses like a photo, survives JPEG recognisably)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((width, height), Image.BILINEAR))


def png16_rgb(pixels16: np.ndarray) -> bytes:
    """A 16-bit-per-channel RGB PNG (Pillow cannot write one)."""
    height, width, _ = pixels16.shape
    raw = b"".join(b"\0" + pixels16[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def write_good_images(root: Path, size: int = 24) -> dict[str, np.ndarray]:
    """One file per supported format and mode; returns the RGB each should decode to (before resizing)."""
    root.mkdir(parents=True, exist_ok=True)
    expected: dict[str, np.ndarray] = {}
    rgb = smooth_image(0, size, size + 8)

    def save(name: str, image: Image.Image, want: np.ndarray, **options) -> None:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        image.save(root / name, **options)
        expected[name] = want

    save("rgb.png", Image.fromarray(rgb), rgb)
    save("RGB_UPPER.PNG", Image.fromarray(rgb[::-1]), rgb[::-1])
    save("photo.bmp", Image.fromarray(rgb), rgb)
    save("photo.tiff", Image.fromarray(rgb), rgb)
    save("photo.webp", Image.fromarray(rgb), rgb, lossless=True)
    grey = rgb[..., 0]
    save("grey.png", Image.fromarray(grey, "L"), np.repeat(grey[..., None], 3, -1))
    palette = Image.fromarray(rgb).quantize(16)
    save("palette.png", palette, np.asarray(palette.convert("RGB")))
    # RGBA: the left half fully transparent (composited on white), the right half opaque.
    alpha = np.zeros(rgb.shape[:2], np.uint8)
    alpha[:, rgb.shape[1] // 2 :] = 255
    rgba = np.dstack([rgb, alpha])
    want = rgb.copy()
    want[:, : rgb.shape[1] // 2] = 255
    save("alpha.png", Image.fromarray(rgba, "RGBA"), want)
    save("grey_alpha.png", Image.fromarray(np.dstack([grey, alpha]), "LA"),
         np.repeat(np.where(alpha > 0, grey, 255)[..., None], 3, -1))
    # 16-bit grey and 16-bit RGB: the high byte of each value.
    save("grey16.png", Image.fromarray(grey.astype(np.uint16) * 257), np.repeat(grey[..., None], 3, -1))
    (root / "rgb16.png").write_bytes(png16_rgb(rgb.astype(np.uint16) * 257 + 3))
    expected["rgb16.png"] = rgb
    # CMYK JPEG (compared loosely: lossy), and an EXIF-rotated JPEG (orientation 6: rotate 90° clockwise).
    cmyk = Image.fromarray(rgb).convert("CMYK")
    save("cmyk.jpg", cmyk, np.asarray(cmyk.convert("RGB")), quality=95)
    exif = Image.Exif()
    exif[0x0112] = 6
    save("sub/rotated.jpg", Image.fromarray(rgb), np.rot90(rgb, -1), quality=95, exif=exif)
    # An animated GIF: its first frame is used.
    frames = [Image.fromarray(np.full_like(rgb, value)) for value in (40, 200)]
    frames[0].save(root / "anim.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    expected["anim.gif"] = np.full_like(rgb, 40)
    return expected


LOSSY = {"cmyk.jpg", "sub/rotated.jpg", "anim.gif", "palette.png"}


def write_bad_files(root: Path, size: int = 24) -> dict[str, str]:
    """One file per kind of bad file; returns the reason each should be skipped for."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "empty.png").write_bytes(b"")
    (root / "text.jpg").write_text("this is not an image\n")
    buffer = io.BytesIO()
    Image.fromarray(smooth_image(1, 4 * size, 4 * size)).save(buffer, "JPEG", quality=95)
    (root / "truncated.jpg").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    buffer = io.BytesIO()
    Image.fromarray(smooth_image(2, 4 * size, 4 * size)).save(buffer, "PNG")
    (root / "truncated.png").write_bytes(buffer.getvalue()[:-40])
    Image.fromarray(smooth_image(3, size // 2, size)).save(root / "tiny.png")
    Image.fromarray(smooth_image(4, 600, 600)).save(root / "bomb.png")  # bad with max_image_pixels < 360,000
    (root / "locked.png").write_bytes((root / "tiny.png").read_bytes())  # made unreadable by the test
    (root / "dangling.png").symlink_to(root / "missing-target.png")
    return {
        "empty.png": "empty",
        "text.jpg": "not_an_image",
        "truncated.jpg": "truncated",
        "truncated.png": "truncated",
        "tiny.png": "too_small",
        "bomb.png": "too_large",
        "locked.png": "unreadable",
        "dangling.png": "unreadable",
    }


def write_plain_folder(root: Path, count: int, classes: tuple[str, ...] = (), size: int = 20, start: int = 0) -> list[str]:
    """``count`` PNGs (in class subfolders round-robin, or at the top); returns their relative paths."""
    paths = []
    for i in range(start, start + count):
        folder = f"{classes[i % len(classes)]}/" if classes else ""
        path = f"{folder}img_{i:05d}.png"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(smooth_image(100 + i, size + i % 5, size + 3)).save(root / path)
        paths.append(path)
    return paths


def folder_config(root, *overrides):
    """The tiny test config, training on the image folder ``root``."""
    return tiny_config(f"data.image_dir={json.dumps(str(root))}", *overrides)


def quiet(messages=None):
    """A log function: drops every message, or appends it to ``messages``."""
    return (lambda message: None) if messages is None else messages.append
