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
from typing import Callable

import gradio as gr
import numpy as np
from gradio.utils import get_upload_folder, is_in_or_equal

from ddim.errors import UserError
from ddim.images import save_gif, save_png
from ddim.spec import SAMPLERS, SPACINGS, SamplingSpec
from ddim.ui.checks import ANY_CLASS, MAX_ETA, MAX_SEED, UIError
from ddim.ui.results import Result
from ddim.ui.uploads import Upload
from ddim.ui.workbench import MAX_TRAJECTORY_IMAGES, MAX_TRAJECTORY_STEPS, Workbench

log = logging.getLogger("ddim.ui")

# Small model images are shown enlarged, with sharp pixels instead of a blur; commands wrap.
CSS = """
.pixelated img, .pixelated canvas { image-rendering: pixelated; }
.enlarged img { width: 100%; height: 100%; object-fit: contain; }
.info pre, .info code { white-space: pre-wrap; overflow-wrap: anywhere; }
"""

# Every event that runs the model shares this one queue slot and gets its inputs unprocessed.
ON_DEVICE = {"concurrency_id": "device", "concurrency_limit": 1, "preprocess": False}


def uploaded(payload) -> Upload | None:
    """An upload's file, undecoded, and its name (events run with ``preprocess=False``, see the module's doc).

    Gradio has already checked that the file is one it received (in its upload
    folder, inside the server's temporary directory); this checks it again.
    """
    if payload is None:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("path"), str):
        raise UIError("the upload is not a file")
    path = Path(payload["path"])
    if not is_in_or_equal(path, get_upload_folder()) or not path.is_file():
        raise UIError("an upload must be a file sent to this page")
    return Upload(path.read_bytes(), Path(payload.get("orig_name") or path.name).name)


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


def _progress_status(progress: gr.Progress) -> Callable[[str], None]:
    return lambda message: progress(0, desc=message)


def build_page(workbench: Workbench) -> gr.Blocks:
    """The whole page; launch it with ``css=CSS`` (see :func:`ddim.ui.server.serve`)."""
    downloads = Downloads(Path(get_upload_folder()) / "results")
    limits = workbench.limits
    with gr.Blocks(title="ddim", analytics_enabled=False, delete_cache=(1800, 3600)) as page:
        gr.Markdown(workbench.card.markdown(), elem_id="header")
        gr.Markdown(
            f"Limits of this server: {limits.max_images} images and {limits.max_steps} steps per request, "
            f"uploads up to {limits.max_upload_pixels / 1e6:g} megapixels. Requests run one at a time; "
            "uploaded images are centre-cropped and resized to the model's size, as in training.",
            elem_id="limits",
        )
        with gr.Tabs():
            with gr.Tab("Sample", id="sample"):
                _sample_tab(workbench, downloads)
            with gr.Tab("Interpolate", id="interpolate"):
                _interpolate_tab(workbench, downloads)
            with gr.Tab("Reconstruct", id="reconstruct"):
                _reconstruct_tab(workbench, downloads)
            with gr.Tab("Edit", id="edit"):
                _edit_tab(workbench, downloads)
            with gr.Tab("Inpaint", id="inpaint"):
                _inpaint_tab(workbench, downloads)
            with gr.Tab("Trajectory", id="trajectory"):
                _trajectory_tab(workbench, downloads)
    return page


# -- controls shared by the tabs ------------------------------------------------------------------

# The controls start at the spec's defaults, as `ddim sample` without options.
DEFAULTS = SamplingSpec()
SAMPLER_INFO = "dpmpp-2m/3m (DPM-Solver++) get closer to the converged image in few steps"
SPACING_INFO = "the time grid: uniform in t (DDIM's), in log-SNR, or Karras'"
# The guidance slider's range (the scale itself may be any number >= 0, as `ddim sample --guidance`).
MAX_GUIDANCE_SHOWN = 8.0
GUIDANCE_INFO = "classifier-free guidance: 1 is plain conditional sampling, 0 ignores the class, above 1 more like it"
ANY_CLASS_LABEL = "any: drawn from the seed, as often as in the training data"


def _steps(tab: str, limit: int, value: int = DEFAULTS.steps):
    return gr.Slider(1, limit, value=min(value, limit), step=1, label="steps (network calls per image)",
                     elem_id=f"{tab}-steps")


def _sampler_controls(tab: str, limit: int, stochastic: bool = True):
    """Steps, sampler, spacing and (for the verbs that take it) eta; returns them in the verbs' order."""
    steps = _steps(tab, limit)
    with gr.Row():
        sampler = gr.Dropdown(list(SAMPLERS), value=DEFAULTS.sampler, label="sampler", info=SAMPLER_INFO,
                              elem_id=f"{tab}-sampler", visible=stochastic)
        spacing = gr.Dropdown(list(SPACINGS), value=DEFAULTS.spacing, label="spacing", info=SPACING_INFO,
                              elem_id=f"{tab}-spacing")
    eta = gr.Slider(0, MAX_ETA, value=0, step=0.05, label="eta (0: deterministic; 1: DDPM-like; ddim only)",
                    elem_id=f"{tab}-eta", visible=stochastic)
    return steps, sampler, spacing, eta


def _class_controls(workbench: Workbench, tab: str, pickers=(("class", "class"),)):
    """The class picker(s) (``(id suffix, label)`` each) and the guidance slider; returns them in that order.

    A checkpoint without classes gets none of them: stand-ins that hold None
    take their places in the handlers' inputs (and are no part of the page's API).
    """
    if not workbench.classes.conditional:
        return [gr.State(None) for _ in range(len(pickers) + 1)]
    choices = [(ANY_CLASS_LABEL, ANY_CLASS)] + [(name, name) for name in workbench.classes.names]
    info = f"{len(workbench.classes.names)} classes; type to search"
    with gr.Row():
        controls = [gr.Dropdown(choices, value=ANY_CLASS, filterable=True, label=label, info=info,
                                elem_id=f"{tab}-{suffix}") for suffix, label in pickers]
    guidance = gr.Slider(0, MAX_GUIDANCE_SHOWN, value=1, step=0.25, label="guidance scale", info=GUIDANCE_INFO,
                         elem_id=f"{tab}-guidance")
    return [*controls, guidance]


def _seed(tab: str, label: str = "seed"):
    """A seed field with a random-seed button (no server round trip)."""
    with gr.Row(equal_height=True):
        seed = gr.Number(value=0, precision=0, minimum=0, maximum=MAX_SEED, label=label, scale=3,
                         elem_id=f"{tab}-seed")
        dice = gr.Button("random seed", size="sm", scale=1, elem_id=f"{tab}-random-seed")
    dice.click(None, None, seed, js=f"() => Math.floor(Math.random() * {MAX_SEED + 1})", api_visibility="private")
    return seed


def _upload(tab: str, label: str = "image"):
    return gr.Image(label=label, type="filepath", sources=["upload", "clipboard"], format="png",
                    elem_id=f"{tab}-upload", elem_classes=["pixelated"], height=300)


def _shown(label: str, tab: str, name: str):
    return gr.Image(label=label, interactive=False, format="png", buttons=["download", "fullscreen"],
                    elem_id=f"{tab}-{name}", elem_classes=["pixelated", "enlarged"], height=300)


def _gallery(tab: str, label: str, columns: int = 8):
    # "fit-content": as tall as its images (Gradio's "auto" is a fixed height with a scrollbar).
    return gr.Gallery(label=label, columns=columns, format="png", object_fit="contain", height="fit-content",
                      buttons=["download", "download_all", "fullscreen"], elem_classes=["pixelated"],
                      elem_id=f"{tab}-gallery")


# -- the tabs -------------------------------------------------------------------------------------


def _sample_tab(workbench: Workbench, downloads: Downloads) -> None:
    limits = workbench.limits
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            num = gr.Slider(1, limits.max_images, value=min(16, limits.max_images), step=1, label="images",
                            elem_id="sample-images")
            class_name, guidance = _class_controls(workbench, "sample")
            steps, sampler, spacing, eta = _sampler_controls("sample", limits.max_steps)
            seed = _seed("sample")
            run = gr.Button("Generate", variant="primary", elem_id="sample-run")
        with gr.Column(scale=3):
            gallery = _gallery("sample", "samples")
            info = gr.Markdown(elem_id="sample-info", elem_classes=["info"])

    @shown_in_page("Could not sample")
    def sample(num, steps, seed, eta, sampler, spacing, class_name, guidance, progress=gr.Progress()):
        result = workbench.sample(num, steps, seed, eta, sampler, spacing, status=_progress_status(progress),
                                  class_name=class_name, guidance=guidance)
        saved = downloads.save(result)
        return list(zip(saved.images, result.captions)), result.summary()

    run.click(sample, [num, steps, seed, eta, sampler, spacing, class_name, guidance], [gallery, info],
              api_name="sample", **ON_DEVICE)


def _interpolate_tab(workbench: Workbench, downloads: Downloads) -> None:
    limits = workbench.limits
    gr.Markdown("Morph between two seeds or two images: their latents (an image's by DDIM inversion) are "
                "interpolated on the sphere and decoded. An uploaded image replaces the seed at its end.")
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            with gr.Row():
                with gr.Column():
                    start_seed = _seed("interpolate-start", "from seed")
                    start_image = _upload("interpolate-start", "or from an image")
                with gr.Column():
                    end_seed = _seed("interpolate-end", "to seed")
                    end_image = _upload("interpolate-end", "or to an image")
            frames = gr.Slider(2, max(2, limits.max_images), value=min(16, max(2, limits.max_images)), step=1,
                               label="frames (both ends included)", elem_id="interpolate-frames")
            start_class, end_class, guidance = _class_controls(
                workbench, "interpolate", (("start-class", "from class"), ("end-class", "to class")))
            steps, _, spacing, _ = _sampler_controls("interpolate", limits.max_steps, stochastic=False)
            run = gr.Button("Interpolate", variant="primary", elem_id="interpolate-run")
        with gr.Column(scale=2):
            strip = _gallery("interpolate", "frames", columns=16)
            with gr.Row():
                with gr.Column():
                    scrub = gr.Slider(0, 1, value=0, step=1, label="frame", elem_id="interpolate-scrub")
                    frame = _shown("frame", "interpolate", "frame")
                animation = _shown("animation (GIF)", "interpolate", "gif")
            info = gr.Markdown(elem_id="interpolate-info", elem_classes=["info"])
    paths = gr.State([])

    @shown_in_page("Could not interpolate")
    def interpolate(start_seed, start_image, end_seed, end_image, frames, steps, spacing, start_class, end_class,
                    guidance, progress=gr.Progress()):
        result = workbench.interpolate(start_seed, uploaded(start_image), end_seed, uploaded(end_image), frames,
                                       steps, spacing, status=_progress_status(progress), start_class=start_class,
                                       end_class=end_class, guidance=guidance)
        saved = downloads.save(result)
        count = len(saved.images)
        return (list(zip(saved.images, result.captions)), gr.Slider(0, count - 1, value=0, step=1), saved.images[0],
                saved.animation, result.summary(), saved.images)

    def show_frame(index, paths):
        if not paths:
            return None
        return paths[int(min(max(index or 0, 0), len(paths) - 1))]

    inputs = [start_seed, start_image, end_seed, end_image, frames, steps, spacing, start_class, end_class, guidance]
    run.click(interpolate, inputs, [strip, scrub, frame, animation, info, paths], api_name="interpolate", **ON_DEVICE)
    scrub.change(show_frame, [scrub, paths], frame, api_visibility="private", show_progress="hidden",
                 concurrency_limit=None)


def _reconstruct_tab(workbench: Workbench, downloads: Downloads) -> None:
    limits = workbench.limits
    gr.Markdown("Encode an image to the noise DDIM regenerates it from (inversion), then generate it back: "
                "how well the model can represent it. More steps, smaller error.")
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            image = _upload("reconstruct")
            steps, _, spacing, _ = _sampler_controls("reconstruct", limits.max_steps, stochastic=False)
            run = gr.Button("Reconstruct", variant="primary", elem_id="reconstruct-run")
        with gr.Column(scale=2):
            with gr.Row():
                seen = _shown("input, as the model sees it", "reconstruct", "input")
                output = _shown("reconstruction", "reconstruct", "output")
            info = gr.Markdown(elem_id="reconstruct-info", elem_classes=["info"])

    @shown_in_page("Could not reconstruct")
    def reconstruct(image, steps, spacing, progress=gr.Progress()):
        result = workbench.reconstruct(uploaded(image), steps, spacing, status=_progress_status(progress))
        saved = downloads.save(result)
        return saved.inputs[0], saved.images[0], result.summary()

    run.click(reconstruct, [image, steps, spacing], [seen, output, info], api_name="reconstruct", **ON_DEVICE)


def _edit_tab(workbench: Workbench, downloads: Downloads) -> None:
    limits = workbench.limits
    gr.Markdown("Image-to-image (SDEdit): the image is noised to *strength* and denoised into the model's "
                "world. About 0.3 keeps the composition and changes details; 0.6-0.8 keeps colours and layout; "
                "1 ignores the image.")
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            image = _upload("edit")
            strength = gr.Slider(0.05, 1.0, value=0.6, step=0.05, label="strength", elem_id="edit-strength")
            class_name, guidance = _class_controls(workbench, "edit")
            steps, sampler, spacing, eta = _sampler_controls("edit", limits.max_steps)
            seed = _seed("edit")
            run = gr.Button("Edit", variant="primary", elem_id="edit-run")
        with gr.Column(scale=2):
            with gr.Row():
                seen = _shown("input, as the model sees it", "edit", "input")
                output = _shown("edited", "edit", "output")
            info = gr.Markdown(elem_id="edit-info", elem_classes=["info"])

    @shown_in_page("Could not edit")
    def edit(image, strength, steps, seed, eta, sampler, spacing, class_name, guidance, progress=gr.Progress()):
        result = workbench.edit(uploaded(image), strength, steps, seed, eta, sampler, spacing,
                                status=_progress_status(progress), class_name=class_name, guidance=guidance)
        saved = downloads.save(result)
        return saved.inputs[0], saved.images[0], result.summary()

    run.click(edit, [image, strength, steps, seed, eta, sampler, spacing, class_name, guidance], [seen, output, info],
              api_name="edit", **ON_DEVICE)


def _inpaint_tab(workbench: Workbench, downloads: Downloads) -> None:
    limits = workbench.limits
    gr.Markdown("Upload an image and paint over the region to fill with the brush; the model fills it "
                "consistently with the rest, which it keeps.")
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            editor = gr.ImageEditor(
                label="image: paint the region to fill", type="filepath", sources=["upload", "clipboard"],
                format="png", image_mode="RGBA", transforms=(), layers=False, elem_id="inpaint-editor",
                brush=gr.Brush(colors=[("#ff00ff", 0.7)], color_mode="fixed", default_size="auto"), height=420,
            )
            class_name, guidance = _class_controls(workbench, "inpaint")
            steps, sampler, spacing, eta = _sampler_controls("inpaint", limits.max_steps)
            seed = _seed("inpaint")
            run = gr.Button("Inpaint", variant="primary", elem_id="inpaint-run")
        with gr.Column(scale=2):
            with gr.Row():
                seen = _shown("input, as the model sees it", "inpaint", "input")
                mask = _shown("mask (white = filled)", "inpaint", "mask")
                output = _shown("inpainted", "inpaint", "output")
            info = gr.Markdown(elem_id="inpaint-info", elem_classes=["info"])

    @shown_in_page("Could not inpaint")
    def inpaint(value, steps, seed, eta, sampler, spacing, class_name, guidance, progress=gr.Progress()):
        image, painted = editor_image_and_mask(editor, value, workbench)
        result = workbench.inpaint(image, painted, steps, seed, eta, sampler, spacing,
                                   status=_progress_status(progress), class_name=class_name, guidance=guidance)
        saved = downloads.save(result)
        return saved.inputs[0], saved.extras["mask.png"], saved.images[0], result.summary()

    run.click(inpaint, [editor, steps, seed, eta, sampler, spacing, class_name, guidance], [seen, mask, output, info],
              api_name="inpaint", **ON_DEVICE)


def editor_image_and_mask(editor: gr.ImageEditor, value, workbench: Workbench) -> tuple[Upload | None, np.ndarray | None]:
    """The editor's background image (as an upload) and the painted region (True where any layer is painted).

    The value arrives unprocessed; the editor's own preprocessing turns it into
    files (it may hold the images the browser sent separately); the background
    file is then read with the workbench's checks, like any upload.
    """
    if value is None:
        return None, None
    try:
        files = editor.preprocess(editor.data_model.model_validate(value))
    except Exception as error:  # noqa: BLE001 - a broken payload is the sender's fault, not a bug
        raise UIError(f"the image editor's content cannot be read ({type(error).__name__}: {error})") from None
    if not files or not files.get("background"):
        return None, None
    background = Path(files["background"])
    image = Upload(background.read_bytes(), "IMAGE")
    painted = None
    for layer in files.get("layers") or []:
        marked = workbench.read_painted(Path(layer).read_bytes())
        painted = marked if painted is None or painted.shape != marked.shape else painted | marked
    return image, painted


def _trajectory_tab(workbench: Workbench, downloads: Downloads) -> None:
    limits = workbench.limits
    gr.Markdown("The image the model predicts after every step of the reverse process, for one seed: coarse "
                "shapes first, details last.")
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            num = gr.Slider(1, min(limits.max_images, MAX_TRAJECTORY_IMAGES), value=1, step=1, label="images",
                            elem_id="trajectory-images")
            class_name, guidance = _class_controls(workbench, "trajectory")
            steps, sampler, spacing, eta = _sampler_controls("trajectory", min(limits.max_steps, MAX_TRAJECTORY_STEPS))
            seed = _seed("trajectory")
            run = gr.Button("Show the trajectory", variant="primary", elem_id="trajectory-run")
        with gr.Column(scale=2):
            frames = _gallery("trajectory", "predicted image after each step", columns=10)
            animation = _shown("animation (GIF)", "trajectory", "gif")
            info = gr.Markdown(elem_id="trajectory-info", elem_classes=["info"])

    @shown_in_page("Could not show the trajectory")
    def trajectory(num, steps, seed, eta, sampler, spacing, class_name, guidance, progress=gr.Progress()):
        result = workbench.trajectory(num, steps, seed, eta, sampler, spacing, status=_progress_status(progress),
                                      class_name=class_name, guidance=guidance)
        saved = downloads.save(result)
        return list(zip(saved.images, result.captions)), saved.animation, result.summary()

    run.click(trajectory, [num, steps, seed, eta, sampler, spacing, class_name, guidance], [frames, animation, info],
              api_name="trajectory", **ON_DEVICE)
