"""The Gradio page over a :class:`~ddim.ui.workbench.Workbench`: a header, one tab per page.

Every event that runs the model shares one queue slot (``concurrency_id="device"``,
limit 1), so requests run one at a time on the device while the server itself keeps
answering (Gradio serves pages and queues from its event loop; handlers run in
worker threads). Those events run with ``preprocess=False``: numbers and files
reach the handlers as the browser sent them, so that the workbench's checks, not
Gradio's generic ones, word the error (Gradio would decode an upload before the
handler runs, and a text file or a damaged image would fail with a bare "Error").
Every error becomes a message in the page (:func:`shown_in_page`) and the server
goes on serving.
"""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import gradio as gr
import numpy as np
from gradio.utils import get_upload_folder, is_in_or_equal

from ddim.errors import UserError
from ddim.images import save_png
from ddim.ui.workbench import MAX_ETA, MAX_SEED, Result, UIError, Workbench

log = logging.getLogger("ddim.ui")

# Small model images are shown enlarged: keep their pixels sharp instead of blurring them.
CSS = ".pixelated img, .pixelated canvas { image-rendering: pixelated; }"

# Every event that runs the model shares this one queue slot and gets its inputs unprocessed.
ON_DEVICE = {"concurrency_id": "device", "concurrency_limit": 1, "preprocess": False}


def upload_bytes(payload) -> bytes | None:
    """The file of an upload, undecoded (events run with ``preprocess=False``, see the module's doc).

    Gradio has already checked that the file is one it received (in its upload
    folder, inside the server's temporary directory); this checks it again.
    """
    if payload is None:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("path"), str):
        raise UIError("the upload is not a file")
    path = Path(payload["path"])
    if not is_in_or_equal(path, get_upload_folder()):
        raise UIError("an upload must be a file sent to this page")
    return path.read_bytes()


def shown_in_page(title: str) -> Callable:
    """Decorate a handler so that every failure is a message in the page, never a dead server.

    A :class:`ddim.errors.UserError` or ``ValueError`` (what the workbench and the
    pipeline raise for bad input) shows its own message; anything else is a bug:
    its traceback goes to the server's log and the page says so.
    """

    def decorate(handler: Callable) -> Callable:
        @functools.wraps(handler)
        def guarded(*args, **kwargs):
            try:
                return handler(*args, **kwargs)
            except gr.Error:
                raise
            except (UserError, ValueError) as error:
                raise gr.Error(str(error), title=title, print_exception=False) from None
            except Exception as error:  # noqa: BLE001 - the server must survive any request
                log.exception("request failed")
                raise gr.Error(
                    f"internal error ({type(error).__name__}: {error}); the server keeps running, "
                    "the traceback is in its log", title=title, print_exception=False,
                ) from None

        return guarded

    return decorate


class Downloads:
    """The PNG files a page offers for download, named after their settings.

    They live in per-request folders under ``root``, inside Gradio's cache (so Gradio
    serves them without copying them) in the server's temporary directory, removed
    when it stops; only the newest ``keep`` folders are kept.
    """

    def __init__(self, root: str | Path, keep: int = 32):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def save(self, images: Sequence[np.ndarray], names: Sequence[str]) -> list[str]:
        folder = Path(tempfile.mkdtemp(dir=self.root))
        paths = [str(save_png(image, folder / name)) for image, name in zip(images, names)]
        folders = sorted((p for p in self.root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        for old in folders[: max(0, len(folders) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
        return paths


def _progress_status(progress: gr.Progress) -> Callable[[str], None]:
    return lambda message: progress(0, desc=message)


def gallery_value(downloads: Downloads, result: Result) -> list[tuple[str, str]]:
    return list(zip(downloads.save(result.images, result.names), result.captions))


def build_page(workbench: Workbench) -> gr.Blocks:
    """The whole page; launch it with ``css=CSS`` (see :func:`ddim.ui.server.serve`)."""
    downloads = Downloads(Path(get_upload_folder()) / "results")
    limits = workbench.limits
    with gr.Blocks(title="ddim", analytics_enabled=False, delete_cache=(1800, 3600)) as page:
        gr.Markdown(workbench.card.markdown(), elem_id="header")
        gr.Markdown(
            f"Limits of this server: {limits.max_images} images and {limits.max_steps} steps per request, "
            f"uploads up to {limits.max_upload_pixels / 1e6:g} megapixels. Requests run one at a time.",
            elem_id="limits",
        )
        with gr.Tabs():
            with gr.Tab("Sample", id="sample"):
                _sample_tab(workbench, downloads)
    return page


def _sample_tab(workbench: Workbench, downloads: Downloads) -> None:
    limits = workbench.limits
    with gr.Row():
        with gr.Column(scale=1, min_width=280):
            num = gr.Slider(1, limits.max_images, value=min(16, limits.max_images), step=1, label="images",
                            elem_id="sample-images")
            steps = gr.Slider(1, limits.max_steps, value=min(20, limits.max_steps), step=1, label="steps",
                              elem_id="sample-steps")
            eta = gr.Slider(0, MAX_ETA, value=0, step=0.05, label="eta (0: deterministic DDIM, 1: DDPM-like)",
                            elem_id="sample-eta")
            with gr.Row(equal_height=True):
                seed = gr.Number(value=0, precision=0, minimum=0, maximum=MAX_SEED, label="seed", scale=3,
                                 elem_id="sample-seed")
                dice = gr.Button("random seed", size="sm", scale=1, elem_id="sample-random-seed")
            run = gr.Button("Generate", variant="primary", elem_id="sample-run")
        with gr.Column(scale=3):
            gallery = gr.Gallery(
                label="samples", columns=8, format="png", object_fit="contain", height="auto",
                buttons=["download", "download_all", "fullscreen"], elem_classes=["pixelated"],
                elem_id="sample-gallery",
            )
            info = gr.Markdown(elem_id="sample-info")

    @shown_in_page("Could not sample")
    def sample(num, steps, seed, eta, progress=gr.Progress()):
        result = workbench.sample(num, steps, seed, eta, status=_progress_status(progress))
        return gallery_value(downloads, result), result.summary()

    # A new seed needs no server round trip.
    dice.click(None, None, seed, js=f"() => Math.floor(Math.random() * {MAX_SEED + 1})", api_visibility="private")
    run.click(sample, [num, steps, seed, eta], [gallery, info], api_name="sample", **ON_DEVICE)
