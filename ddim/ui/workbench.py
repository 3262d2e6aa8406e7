"""What the web page does, without the web: one method per page, run on the device, described for the page.

A :class:`Workbench` holds one loaded :class:`~ddim.sampling.Pipeline` and the
server's :class:`Limits`. Each page calls one of its methods with the values the
browser sent, as they came: the method checks them (:mod:`ddim.ui.checks`,
:mod:`ddim.ui.uploads`) and raises :class:`UIError` with a message naming the
field, or runs the pipeline in the device slot (:mod:`ddim.ui.device`) and
returns a :class:`Result` (:mod:`ddim.ui.results`) with the command that
reproduces it (:mod:`ddim.ui.command`). The sampler settings travel as one
:class:`~ddim.spec.SamplingSpec`: a page passes them as keywords, a field added
to the spec (``guidance=``) passes through the verbs unchanged. A
class-conditional model's pages also take the class picker's value
(``class_name``: a class, or :data:`ANY_CLASS` for classes drawn from the seed);
the captions say which class each image is. Gradio is not needed here: the
tests call these methods directly.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Hashable, Mapping

import numpy as np

from ddim.spec import SamplingSpec
from ddim.ui.card import ModelCard, describe_devices, format_count  # noqa: F401 - re-exported
from ddim.ui.checks import (  # noqa: F401 - MAX_* and ANY_CLASS re-exported
    ANY_CLASS,
    MAX_ETA,
    MAX_SEED,
    MAX_UPLOAD_PIXELS,
    Limits,
    UIError,
    check_class,
    check_guidance,
    check_integer,
    check_number,
    check_seed,
    random_seed,
    sampling_spec,
    spec_ranges,
)
from ddim.ui.command import class_argument, cli_command
from ddim.ui.device import DeviceSlot, Status
from ddim.ui.results import (
    Result,
    caption,
    class_label,
    classes_in_order,
    collect_notices,
    file_stem,
    frame_class,
    join,
    notes_text,
)
from ddim.ui.uploads import Upload, check_mask, read_image, read_painted, require_upload, resize_mask

# ``ddim sample``'s default --batch-size. The page generates in batches of the same size, so
# that the command it prints reproduces its images pixel for pixel (tested).
CLI_BATCH_SIZE = 64

# The Trajectory page sends every step's images to the browser: at most this many steps and images.
MAX_TRAJECTORY_STEPS = 100
MAX_TRAJECTORY_IMAGES = 16

# Milliseconds per frame of the animated GIFs (as `ddim interpolate` and `ddim sample --trajectory`).
INTERPOLATION_FRAME_MS = 120
TRAJECTORY_FRAME_MS = 250


class Workbench:
    """A loaded pipeline behind the web page: one method per page, one request at a time on the device.

    The pages that sample take ``steps``, ``sampler``, ``spacing`` and ``eta``
    and any further field of :class:`~ddim.spec.SamplingSpec` as a keyword
    (``**sampling``); the deterministic pages (interpolate, reconstruct) take
    ``steps``, ``spacing`` and further fields the same way. The pages that
    generate (all but reconstruct) take a class (``class_name``; interpolate:
    ``start_class`` and ``end_class``) and ``guidance`` for a class-conditional model.
    """

    def __init__(self, pipeline, limits: Limits | None = None):
        self.pipeline = pipeline
        self.classes = pipeline.class_space
        self.limits = limits or Limits()
        self.card = ModelCard.of(pipeline)
        self.device = DeviceSlot()

    # -- the pages ------------------------------------------------------------------------------

    def sample(self, num_images, steps, seed, eta=0.0, sampler="ddim", spacing="uniform",
               status: Status | None = None, class_name=None, **sampling) -> Result:
        """The Sample page: ``num_images`` images from ``seed``, as ``ddim sample`` makes them."""
        num_images = self.check_count(num_images)
        seed = check_seed(seed)
        values = dict(steps=steps, sampler=sampler, spacing=spacing, eta=eta, **sampling)
        spec = self.sampling_spec(values)
        chosen, ids = self.image_classes(class_name, spec, num_images, seed)
        batches = tuple(sorted({min(CLI_BATCH_SIZE, num_images - s) for s in range(0, num_images, CLI_BATCH_SIZE)}))
        images, seconds, setup = self.on_device(
            ("generate", batches, spec.static, guided(spec)), f"{num_images} images x {spec.steps} steps", status,
            lambda: self.pipeline.generate(num_images, seed=seed, batch_size=CLI_BATCH_SIZE, spec=spec, classes=ids),
        )
        names = self.classes.names
        captions = [f"#{i} · seed {seed} · {class_label(names, ids, i)}{caption(spec)}" for i in range(num_images)]
        command = self.command("sample", num=num_images, seed=seed, **self.class_option(chosen), spec=spec,
                               spec_fields=values)
        files = [f"{file_stem(seed, spec)}_{i:04d}.png" for i in range(num_images)]
        return Result(images, captions, command, seconds, setup, names=files,
                      details="Image #*i* is `NNNN.png` (*i* = NNNN) of this command:")

    def interpolate(self, start_seed, start_image: Upload | None, end_seed, end_image: Upload | None, frames, steps,
                    spacing="uniform", status: Status | None = None, start_class=None, end_class=None,
                    **sampling) -> Result:
        """The Interpolate page: the frames between two seeds or two uploaded images (inverted), both ends included.

        A class-conditional model's frames go from ``start_class`` to
        ``end_class``; "any" at an end is the class its seed draws (that
        seed's single image on the Sample page).
        """
        frames = check_integer("frames", frames, 2, self.limits.max_images, "--max-images")
        values = dict(steps=steps, spacing=spacing, **sampling)
        spec = self.sampling_spec(values)
        start, start_label = self._interpolation_end("start", start_seed, start_image)
        end, end_label = self._interpolation_end("end", end_seed, end_image)
        classes = self._end_classes((start_class, start_seed), (end_class, end_seed), spec=spec)
        options = self._interpolation_options(classes)
        notes: list[str] = []

        def work():
            with collect_notices(notes):
                a, b = self._latent(start, spec), self._latent(end, spec)
                return self.pipeline.interpolate(a, b, frames=frames, spec=spec, batch_size=CLI_BATCH_SIZE, **options)

        inverts = any(kind == "image" for kind, _ in (start, end))
        images, seconds, setup = self.on_device(
            ("interpolate", frames, inverts, spec.static, guided(spec), classes is not None),
            f"{frames} frames x {spec.steps} steps", status, work)
        named = self.class_option(*dict.fromkeys(classes or ()))  # one --class when both ends have it
        command = self.command("interpolate", **{"from": start_label, "to": end_label}, frames=frames, **named,
                               spec=spec, spec_fields=values)
        captions = [f"frame {i} of {frames}{frame_class(self.classes.names, classes, i, frames)}"
                    for i in range(frames)]
        return Result(images, captions, command, seconds, setup, details=notes_text(notes),
                      names=[f"interpolation_{i:04d}.png" for i in range(frames)],
                      animation=images, animation_name="interpolation.gif", noun="frame", frame_ms=INTERPOLATION_FRAME_MS)

    def reconstruct(self, upload: Upload | None, steps, spacing="uniform", status: Status | None = None,
                    **sampling) -> Result:
        """The Reconstruct page: invert an uploaded image and generate it back; the error says how close."""
        pixels = self.read_image(require_upload(upload).data)
        values = dict(steps=steps, spacing=spacing, **sampling)
        spec = self.sampling_spec(values)
        notes: list[str] = []

        def work():
            with collect_notices(notes):
                return self.pipeline.reconstruct([pixels], spec=spec)

        result, seconds, setup = self.on_device(
            ("reconstruct", spec.static), f"inverting and regenerating 1 image x {spec.steps} steps", status, work)
        error = float(result.errors[0])
        psnr = 10 * math.log10(1.0 / error) if error > 0 else math.inf
        details = (f"Mean squared error {error:.5f} per pixel and channel on [0, 1] values "
                   f"(PSNR {psnr:.1f} dB), {spec.steps} steps, {spec.spacing} spacing.")
        command = self.command("reconstruct", upload.name, spec=spec, spec_fields=values)
        return Result(result.images, [f"reconstruction · MSE {error:.5f}"], command, seconds, setup,
                      details=join(details, notes_text(notes)), names=["reconstruction.png"], inputs=result.inputs)

    def edit(self, upload: Upload | None, strength, steps, seed, eta=0.0, sampler="ddim", spacing="uniform",
             status: Status | None = None, class_name=None, **sampling) -> Result:
        """The Edit page (SDEdit): noise the uploaded image to ``strength`` and denoise it."""
        pixels = self.read_image(require_upload(upload).data)
        strength = check_number("strength", strength, 0.0, 1.0)
        if strength == 0.0:
            raise UIError("strength must be above 0 (0 would return the image unchanged), got 0")
        seed = check_seed(seed)
        values = dict(steps=steps, sampler=sampler, spacing=spacing, eta=eta, **sampling)
        spec = self.sampling_spec(values)
        chosen, ids = self.image_classes(class_name, spec, 1, seed)
        inputs, notes = self.model_view([pixels])

        def work():
            with collect_notices([]):  # the note on resizing came with model_view
                return self.pipeline.edit([pixels], strength=strength, seed=seed, spec=spec, classes=ids)

        images, seconds, setup = self.on_device(
            ("edit", strength == 1.0, spec.static, guided(spec)), f"editing 1 image x {spec.steps} steps", status, work)
        command = self.command("edit", upload.name, strength=f"{strength:g}", seed=seed, **self.class_option(chosen),
                               spec=spec, spec_fields=values)
        label = f"strength {strength:g} · seed {seed} · {class_label(self.classes.names, ids, 0)}{caption(spec)}"
        return Result(images, [label], command, seconds, setup,
                      details=notes_text(notes), names=[f"edit_strength{strength:g}_seed{seed}.png"], inputs=inputs)

    def inpaint(self, upload: Upload | None, mask, steps, seed, eta=0.0, sampler="ddim", spacing="uniform",
                status: Status | None = None, class_name=None, **sampling) -> Result:
        """The Inpaint page: fill the region ``mask`` marks (bool ``(H, W)``, True = fill) in the uploaded image.

        A mask of another size than the image is resized to it (nearest neighbour), with a note.
        """
        pixels = self.read_image(require_upload(upload).data)
        seed = check_seed(seed)
        values = dict(steps=steps, sampler=sampler, spacing=spacing, eta=eta, **sampling)
        spec = self.sampling_spec(values)
        chosen, ids = self.image_classes(class_name, spec, 1, seed)
        mask = check_mask(mask)
        inputs, notes = self.model_view([pixels])
        if mask.shape != pixels.shape[:2]:
            notes.append(f"the mask ({mask.shape[1]}x{mask.shape[0]}) was resized to the image's size "
                         f"({pixels.shape[1]}x{pixels.shape[0]})")
            mask = resize_mask(mask, pixels.shape[:2])

        def work():
            with collect_notices([]):
                return self.pipeline.inpaint([pixels], mask, seed=seed, spec=spec, classes=ids)

        images, seconds, setup = self.on_device(
            ("inpaint", spec.static, guided(spec)), f"inpainting 1 image x {spec.steps} steps", status, work)
        command = self.command("inpaint", upload.name, mask="mask.png", seed=seed, **self.class_option(chosen),
                               spec=spec, spec_fields=values)
        mask_image = np.repeat(mask[..., None].astype(np.uint8) * 255, 3, axis=-1)
        label = f"inpainted · seed {seed} · {class_label(self.classes.names, ids, 0)}{caption(spec)}"
        return Result(images, [label], command, seconds, setup,
                      details=join(notes_text(notes), "`mask.png` (white = filled) is offered for download."),
                      names=[f"inpaint_seed{seed}.png"], inputs=inputs, extras={"mask.png": mask_image})

    def trajectory(self, num_images, steps, seed, eta=0.0, sampler="ddim", spacing="uniform",
                   status: Status | None = None, class_name=None, **sampling) -> Result:
        """The Trajectory page: the predicted clean images after every step of the reverse process."""
        from ddim.images import make_grid

        num_images = check_integer("number of images", num_images, 1,
                                   min(self.limits.max_images, MAX_TRAJECTORY_IMAGES), "--max-images")
        seed = check_seed(seed)
        values = dict(steps=steps, sampler=sampler, spacing=spacing, eta=eta, **sampling)
        spec = self.sampling_spec(values, max_steps=MAX_TRAJECTORY_STEPS)
        chosen, ids = self.image_classes(class_name, spec, num_images, seed)
        frames, seconds, setup = self.on_device(
            ("trajectory", num_images, spec.static, guided(spec)), f"{num_images} images x {spec.steps} steps", status,
            lambda: self.pipeline.trajectory(num_images, seed=seed, batch_size=CLI_BATCH_SIZE, spec=spec, classes=ids),
        )
        grids = np.stack([make_grid(frame) for frame in frames])
        count = len(grids)
        command = self.command("sample", "--trajectory", num=num_images, seed=seed, **self.class_option(chosen),
                               spec=spec, spec_fields=values)
        # The GIF holds the final frame a little longer, as `ddim sample --trajectory` writes it.
        animation = np.concatenate([grids, np.repeat(grids[-1:], 4, axis=0)])
        return Result(grids, [f"after step {k + 1} of {count}" for k in range(count)], command, seconds, setup,
                      names=[f"step_{k + 1:04d}.png" for k in range(count)],
                      details=join("The predicted clean image after each step, coarse to fine; the last is the sample.",
                                   classes_in_order(self.classes.names, ids), "`trajectory.gif` of this command:"),
                      animation=animation, animation_name="trajectory.gif", noun="frame", frame_ms=TRAJECTORY_FRAME_MS)

    random_seed = staticmethod(random_seed)

    # -- classes --------------------------------------------------------------------------------

    def image_classes(self, class_name, spec: SamplingSpec, count: int, seed: int):
        """``(class picked or None for "any", class id of each of count images)``; ``(None, None)`` without classes.

        "Any" draws the ids from ``seed`` as the pipeline (and ``ddim sample``
        without ``--class``) does; the pipeline then gets them as chosen, so the
        captions name the classes the images were made with.
        """
        chosen = check_class(class_name, self.classes)
        check_guidance(spec, self.classes)
        if not self.classes.conditional:
            return None, None
        return chosen, self.pipeline.class_ids(chosen, count, seed)

    def class_option(self, *ids) -> dict[str, list[str]]:
        """The command's ``--class`` options for the classes picked (none for "any": the command draws the same)."""
        return {"class": [class_argument(self.classes, int(i)) for i in ids if i is not None]}

    def _end_classes(self, *ends, spec: SamplingSpec) -> list[int] | None:
        """The class id at each end of an interpolation, ``(class picked, seed)`` each; "any" draws from that seed."""
        ids = []
        for which, (value, seed) in zip(("start", "end"), ends):
            ids.append(check_class(value, self.classes, f"{which} class"))
            if ids[-1] is None and self.classes.conditional:
                ids[-1] = int(self.pipeline.class_ids(None, 1, check_seed(seed, f"{which} seed"))[0])
        check_guidance(spec, self.classes)
        return ids if self.classes.conditional else None

    def _interpolation_options(self, classes: list[int] | None) -> dict[str, Any]:
        """``classes=[start, end]`` for :meth:`Pipeline.interpolate`, when the model has classes."""
        return {} if classes is None else {"classes": classes}

    # -- checks and uploads ---------------------------------------------------------------------

    def check_count(self, num_images) -> int:
        return check_integer("number of images", num_images, 1, self.limits.max_images, "--max-images")

    check_seed = staticmethod(check_seed)

    def sampling_spec(self, values: Mapping[str, Any], max_steps: int | None = None) -> SamplingSpec:
        """The checked spec of a page's sampler values, within the server's limits (or a page's lower ``max_steps``)."""
        return sampling_spec(values, spec_ranges(self.limits, max_steps))

    def read_image(self, data: bytes, what: str = "the uploaded file") -> np.ndarray:
        """Decode an upload as the model's channels need it, within the server's pixel limit (see :mod:`ddim.ui.uploads`)."""
        return read_image(data, self.limits.max_upload_pixels, self._grey, what)

    def read_painted(self, data: bytes, what: str = "the painted mask") -> np.ndarray:
        """The region a painted layer (or a mask image) marks, bool ``(H, W)``."""
        return read_painted(data, self.limits.max_upload_pixels, self._grey, what)

    @property
    def _grey(self) -> bool:
        return self.pipeline.config.model.channels == 1

    def model_view(self, images: list[np.ndarray]) -> tuple[np.ndarray, list[str]]:
        """The images as the model sees them (centre-cropped and resized to its size), and the note saying so."""
        from ddim.images import to_uint8
        from ddim.sampling import prepare_images

        notes: list[str] = []
        with collect_notices(notes):
            prepared, _ = prepare_images(images, self.pipeline.config.model.image_size,
                                         self.pipeline.config.model.channels)
        return to_uint8(prepared), notes

    # -- shared machinery -----------------------------------------------------------------------

    def on_device(self, shape: Hashable, description: str, status: Status | None, work: Callable[[], Any]):
        """Run ``work`` alone on the device: ``(its result, seconds, its Setup)`` (see :class:`DeviceSlot`)."""
        return self.device.run(shape, description, status, work)

    def command(self, verb: str, *arguments: str, **options) -> str:
        """The ``ddim`` command that does the same on this model (see :func:`ddim.ui.command.cli_command`)."""
        return cli_command(self.card.checkpoint, verb, *arguments, pretrained=self.card.pretrained, **options)

    def _interpolation_end(self, which: str, seed, upload: Upload | None) -> tuple[tuple[str, Any], str]:
        """An end of the Interpolate page, ``(("seed", seed) or ("image", pixels)), its label in the command)``."""
        if upload is not None:
            return ("image", self.read_image(upload.data, f"the uploaded {which} file")), upload.name
        seed = check_seed(seed, f"{which} seed")
        return ("seed", seed), str(seed)

    def _latent(self, end: tuple[str, Any], spec: SamplingSpec) -> np.ndarray:
        """The latent of an interpolation end: a seed's noise, or an image inverted with ``spec``."""
        kind, value = end
        if kind == "seed":
            return self.pipeline.latents(1, seed=value)[0]
        return self.pipeline.invert([value], spec=spec)[0]


def guided(spec: SamplingSpec) -> bool:
    """Whether the spec's guidance doubles the network's batch (another compiled program); 1 is plain conditional."""
    return spec.guidance is not None and spec.guidance != 1.0
