"""The Gradio page over a :class:`~ddim.ui.workbench.Workbench`: a header, one tab per verb.

The tabs are built from the shared controls (:mod:`ddim.ui.controls`); their events
run on the device queue with raw inputs (:mod:`ddim.ui.events`) and offer their
results for download (:mod:`ddim.ui.downloads`).
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr
from gradio.utils import get_upload_folder

from ddim.ui import controls
from ddim.ui.downloads import Downloads
from ddim.ui.events import ON_DEVICE, editor_image_and_mask, progress_status, shown_in_page, uploaded
from ddim.ui.workbench import MAX_TRAJECTORY_IMAGES, MAX_TRAJECTORY_STEPS, Workbench

# Small model images are shown enlarged, with sharp pixels instead of a blur; commands wrap.
CSS = """
.pixelated img, .pixelated canvas { image-rendering: pixelated; }
.enlarged img { width: 100%; height: 100%; object-fit: contain; }
.info pre, .info code { white-space: pre-wrap; overflow-wrap: anywhere; }
"""


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
            # A distilled student has no ODE to run backwards or from part way: those tabs need its teacher.
            if not workbench.pipeline.rules.distilled:
                with gr.Tab("Reconstruct", id="reconstruct"):
                    _reconstruct_tab(workbench, downloads)
                with gr.Tab("Edit", id="edit"):
                    _edit_tab(workbench, downloads)
            with gr.Tab("Inpaint", id="inpaint"):
                _inpaint_tab(workbench, downloads)
            with gr.Tab("Trajectory", id="trajectory"):
                _trajectory_tab(workbench, downloads)
    return page



# -- the tabs -------------------------------------------------------------------------------------


def _sample_tab(workbench: Workbench, downloads: Downloads) -> None:
    limits = workbench.limits
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            num = gr.Slider(1, limits.max_images, value=min(16, limits.max_images), step=1, label="images",
                            elem_id="sample-images")
            class_name, guidance = controls.class_controls(workbench, "sample")
            steps, sampler, spacing, eta = controls.sampler_controls("sample", limits.max_steps, workbench=workbench)
            seed = controls.seed_field("sample")
            run = gr.Button("Generate", variant="primary", elem_id="sample-run")
        with gr.Column(scale=3):
            gallery = controls.gallery("sample", "samples")
            info = gr.Markdown(elem_id="sample-info", elem_classes=["info"])

    @shown_in_page("Could not sample")
    def sample(num, steps, seed, eta, sampler, spacing, class_name, guidance, progress=gr.Progress()):
        result = workbench.sample(num, steps, seed, eta, sampler, spacing, status=progress_status(progress),
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
                    start_seed = controls.seed_field("interpolate-start", "from seed")
                    start_image = controls.upload_field("interpolate-start", "or from an image")
                with gr.Column():
                    end_seed = controls.seed_field("interpolate-end", "to seed")
                    end_image = controls.upload_field("interpolate-end", "or to an image")
            frames = gr.Slider(2, max(2, limits.max_images), value=min(16, max(2, limits.max_images)), step=1,
                               label="frames (both ends included)", elem_id="interpolate-frames")
            start_class, end_class, guidance = controls.class_controls(
                workbench, "interpolate", (("start-class", "from class"), ("end-class", "to class")))
            steps, _, spacing, _ = controls.sampler_controls("interpolate", limits.max_steps, stochastic=False,
                                                             workbench=workbench)
            run = gr.Button("Interpolate", variant="primary", elem_id="interpolate-run")
        with gr.Column(scale=2):
            strip = controls.gallery("interpolate", "frames", columns=16)
            with gr.Row():
                with gr.Column():
                    scrub = gr.Slider(0, 1, value=0, step=1, label="frame", elem_id="interpolate-scrub")
                    frame = controls.shown_image("frame", "interpolate", "frame")
                animation = controls.shown_image("animation (GIF)", "interpolate", "gif")
            info = gr.Markdown(elem_id="interpolate-info", elem_classes=["info"])
    paths = gr.State([])

    @shown_in_page("Could not interpolate")
    def interpolate(start_seed, start_image, end_seed, end_image, frames, steps, spacing, start_class, end_class,
                    guidance, progress=gr.Progress()):
        result = workbench.interpolate(start_seed, uploaded(start_image), end_seed, uploaded(end_image), frames,
                                       steps, spacing, status=progress_status(progress), start_class=start_class,
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
            image = controls.upload_field("reconstruct")
            steps, _, spacing, _ = controls.sampler_controls("reconstruct", limits.max_steps, stochastic=False,
                                                             workbench=workbench, guidance=False)
            run = gr.Button("Reconstruct", variant="primary", elem_id="reconstruct-run")
        with gr.Column(scale=2):
            with gr.Row():
                seen = controls.shown_image("input, as the model sees it", "reconstruct", "input")
                output = controls.shown_image("reconstruction", "reconstruct", "output")
            info = gr.Markdown(elem_id="reconstruct-info", elem_classes=["info"])

    @shown_in_page("Could not reconstruct")
    def reconstruct(image, steps, spacing, progress=gr.Progress()):
        result = workbench.reconstruct(uploaded(image), steps, spacing, status=progress_status(progress))
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
            image = controls.upload_field("edit")
            strength = gr.Slider(0.05, 1.0, value=0.6, step=0.05, label="strength", elem_id="edit-strength")
            class_name, guidance = controls.class_controls(workbench, "edit")
            steps, sampler, spacing, eta = controls.sampler_controls("edit", limits.max_steps, workbench=workbench)
            seed = controls.seed_field("edit")
            run = gr.Button("Edit", variant="primary", elem_id="edit-run")
        with gr.Column(scale=2):
            with gr.Row():
                seen = controls.shown_image("input, as the model sees it", "edit", "input")
                output = controls.shown_image("edited", "edit", "output")
            info = gr.Markdown(elem_id="edit-info", elem_classes=["info"])

    @shown_in_page("Could not edit")
    def edit(image, strength, steps, seed, eta, sampler, spacing, class_name, guidance, progress=gr.Progress()):
        result = workbench.edit(uploaded(image), strength, steps, seed, eta, sampler, spacing,
                                status=progress_status(progress), class_name=class_name, guidance=guidance)
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
            class_name, guidance = controls.class_controls(workbench, "inpaint")
            steps, sampler, spacing, eta = controls.sampler_controls("inpaint", limits.max_steps, workbench=workbench)
            seed = controls.seed_field("inpaint")
            run = gr.Button("Inpaint", variant="primary", elem_id="inpaint-run")
        with gr.Column(scale=2):
            with gr.Row():
                seen = controls.shown_image("input, as the model sees it", "inpaint", "input")
                mask = controls.shown_image("mask (white = filled)", "inpaint", "mask")
                output = controls.shown_image("inpainted", "inpaint", "output")
            info = gr.Markdown(elem_id="inpaint-info", elem_classes=["info"])

    @shown_in_page("Could not inpaint")
    def inpaint(value, steps, seed, eta, sampler, spacing, class_name, guidance, progress=gr.Progress()):
        image, painted = editor_image_and_mask(editor, value, workbench)
        result = workbench.inpaint(image, painted, steps, seed, eta, sampler, spacing,
                                   status=progress_status(progress), class_name=class_name, guidance=guidance)
        saved = downloads.save(result)
        return saved.inputs[0], saved.extras["mask.png"], saved.images[0], result.summary()

    run.click(inpaint, [editor, steps, seed, eta, sampler, spacing, class_name, guidance], [seen, mask, output, info],
              api_name="inpaint", **ON_DEVICE)


def _trajectory_tab(workbench: Workbench, downloads: Downloads) -> None:
    limits = workbench.limits
    gr.Markdown("The image the model predicts after every step of the reverse process, for one seed: coarse "
                "shapes first, details last.")
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            num = gr.Slider(1, min(limits.max_images, MAX_TRAJECTORY_IMAGES), value=1, step=1, label="images",
                            elem_id="trajectory-images")
            class_name, guidance = controls.class_controls(workbench, "trajectory")
            steps, sampler, spacing, eta = controls.sampler_controls(
                "trajectory", min(limits.max_steps, MAX_TRAJECTORY_STEPS), workbench=workbench)
            seed = controls.seed_field("trajectory")
            run = gr.Button("Show the trajectory", variant="primary", elem_id="trajectory-run")
        with gr.Column(scale=2):
            frames = controls.gallery("trajectory", "predicted image after each step", columns=10)
            animation = controls.shown_image("animation (GIF)", "trajectory", "gif")
            info = gr.Markdown(elem_id="trajectory-info", elem_classes=["info"])

    @shown_in_page("Could not show the trajectory")
    def trajectory(num, steps, seed, eta, sampler, spacing, class_name, guidance, progress=gr.Progress()):
        result = workbench.trajectory(num, steps, seed, eta, sampler, spacing, status=progress_status(progress),
                                      class_name=class_name, guidance=guidance)
        saved = downloads.save(result)
        return list(zip(saved.images, result.captions)), saved.animation, result.summary()

    run.click(trajectory, [num, steps, seed, eta, sampler, spacing, class_name, guidance], [frames, animation, info],
              api_name="trajectory", **ON_DEVICE)
