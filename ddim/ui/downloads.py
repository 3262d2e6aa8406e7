"""The files a page offers for download: one folder of PNGs (and a GIF) per request, the oldest removed."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ddim.images import save_gif, save_png
from ddim.ui.results import Result


class Downloads:
    """The files a page offers for download (PNG, GIF), named after their settings.

    They live in per-request folders under ``root``, inside Gradio's cache (so Gradio
    serves them without copying them) in the server's temporary directory, removed
    when it stops; only the newest ``keep`` folders are kept.
    """

    def __init__(self, root: str | Path, keep: int = 32):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def folder(self) -> Path:
        """A new folder for one request's files (the oldest folders beyond ``keep`` are removed)."""
        folder = Path(tempfile.mkdtemp(dir=self.root))
        folders = sorted((p for p in self.root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        for old in folders[: max(0, len(folders) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
        return folder

    def save(self, result: Result) -> "Saved":
        folder = self.folder()
        images = [str(save_png(image, folder / name)) for image, name in zip(result.images, result.names)]
        extras = {name: str(save_png(image, folder / name)) for name, image in result.extras.items()}
        inputs = [str(save_png(image, folder / f"input_{i}.png")) for i, image in enumerate(result.inputs)] \
            if result.inputs is not None else []
        animation = None
        if result.animation is not None:
            animation = str(save_gif(result.animation, folder / result.animation_name, duration_ms=result.frame_ms))
        return Saved(images, inputs, extras, animation)


class Saved:
    """The paths of one result's files."""

    def __init__(self, images: list[str], inputs: list[str], extras: dict[str, str], animation: str | None):
        self.images, self.inputs, self.extras, self.animation = images, inputs, extras, animation
