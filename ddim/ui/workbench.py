"""What the web page does, without the web: validate a request, run it on the device, describe the result.

A :class:`Workbench` holds one loaded :class:`~ddim.sampling.Pipeline` and the
server's :class:`Limits`. Each page calls one of its methods with the values the
browser sent, as they came (numbers may be strings, floats or out of range; an
upload is raw bytes): the method checks them and raises :class:`UIError` with a
message naming the field, or runs the pipeline and returns a :class:`Result`.
Requests run one at a time on the device (a lock, besides the web queue), and
the workbench remembers which shapes it has compiled, so the first request of a
shape can say that it compiles. Gradio is not needed here: the tests call these
methods directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import random
import shlex
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from ddim.errors import UserError

# Uploads larger than this are refused before decoding (a 6000x4000 photo is 24 MP). The
# model works at its own small size anyway; the limit bounds the memory one request can take.
MAX_UPLOAD_PIXELS = 25_000_000

# Seeds are 32-bit: ``jax.random.key`` keeps only the low 32 bits of larger integers.
MAX_SEED = 2**32 - 1

# ``ddim sample``'s default --batch-size. The page generates in batches of the same size, so
# that the command it prints reproduces its images pixel for pixel (tested).
CLI_BATCH_SIZE = 64

# Highest eta offered: 0 is deterministic DDIM, 1 the DDPM posterior (DDIM eq. 16).
MAX_ETA = 1.0

# The Trajectory page sends every step's images to the browser: at most this many steps and images.
MAX_TRAJECTORY_STEPS = 100
MAX_TRAJECTORY_IMAGES = 16

# Milliseconds per frame of the animated GIFs (as `ddim interpolate` and `ddim sample --trajectory`).
INTERPOLATION_FRAME_MS = 120
TRAJECTORY_FRAME_MS = 250

Status = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Upload:
    """An uploaded file as the page received it: its bytes and the name it had on the user's machine."""

    data: bytes
    name: str = "IMAGE"


@dataclasses.dataclass(frozen=True)
class Sampling:
    """The checked settings of the reverse process: steps, sampler, spacing, eta."""

    steps: int
    sampler: str = "ddim"
    spacing: str = "uniform"
    eta: float = 0.0

    @property
    def program(self) -> tuple:
        """What selects a compiled program (eta is traced: changing it compiles nothing)."""
        return self.steps, self.sampler, self.spacing

    def caption(self) -> str:
        text = f"{self.steps} steps · {self.sampler} · {self.spacing}"
        return text + (f" · eta {self.eta:g}" if self.eta else "")

    def options(self, eta: bool = True) -> dict:
        """The ``ddim`` command-line options that select these settings."""
        options = {"steps": self.steps, "sampler": self.sampler, "spacing": self.spacing}
        return {**options, "eta": f"{self.eta:g}"} if eta else options

    def arguments(self) -> dict:
        """The keyword arguments of the pipeline's verbs."""
        return {"steps": self.steps, "sampler": self.sampler, "spacing": self.spacing, "eta": self.eta}


class UIError(UserError, ValueError):
    """A request the page cannot run (bad value, unreadable upload, over a limit); the message is for the user."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask for (``ddim serve --max-images/--max-steps``)."""

    max_images: int = 64
    max_steps: int = 1000
    max_upload_pixels: int = MAX_UPLOAD_PIXELS

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or value < 1:
                raise UIError(f"{field.name.replace('_', '-')} must be a whole number >= 1 (got {value!r})")


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """What the page's header says about the checkpoint and the device."""

    checkpoint: Path | None
    workdir: Path | None
    step: int | None
    config_name: str
    image_size: int
    parameters: int
    device: str

    @classmethod
    def of(cls, pipeline) -> "ModelCard":
        import jax

        path = Path(pipeline.path) if pipeline.path is not None else None
        # <workdir>/checkpoints/<step> (or <workdir>/best/<step>): name the work directory too.
        workdir = path.parent.parent if path is not None and path.parent.name in ("checkpoints", "best") else None
        parameters = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(pipeline.variables["params"]))
        return cls(
            checkpoint=path,
            workdir=workdir,
            step=pipeline.step,
            config_name=pipeline.config.name,
            image_size=pipeline.config.model.image_size,
            parameters=parameters,
            device=describe_devices(jax.devices()),
        )

    def markdown(self) -> str:
        size = f"{self.image_size}x{self.image_size}"
        where = f"work directory `{self.workdir}` · " if self.workdir is not None else ""
        return (
            f"**ddim** · {where}checkpoint `{self.checkpoint}` (step {self.step}, config `{self.config_name}`) · "
            f"{size} images · {format_count(self.parameters)} parameters (EMA weights) · device: {self.device}"
        )


def describe_devices(devices: Sequence[Any]) -> str:
    """``'cpu'``, ``'4 x NVIDIA H100 80GB HBM3 (gpu)'``, ..."""
    kinds = sorted({getattr(d, "device_kind", "?") for d in devices})
    platform = devices[0].platform if devices else "?"
    count = f"{len(devices)} x " if len(devices) > 1 else ""
    kind = ", ".join(kinds)
    return platform if kind.lower() == platform else f"{count}{kind} ({platform})"


def format_count(count: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return str(count)


@dataclasses.dataclass
class Result:
    """What a page shows: images with captions, how to reproduce them, how long it took."""

    images: np.ndarray
    captions: list[str]
    command: str
    seconds: float
    compiled: bool
    details: str = ""
    names: list[str] = dataclasses.field(default_factory=list)  # file names for downloads
    inputs: np.ndarray | None = None  # uploaded images as the model saw them (cropped and resized)
    extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # more images to offer, by file name
    animation: np.ndarray | None = None  # frames of an animated GIF
    animation_name: str = "animation.gif"
    noun: str = "image"  # what the images are, for the summary ("16 images in 2.10 s")
    frame_ms: int = 100

    def summary(self) -> str:
        what = _plural(len(self.images), self.noun)
        note = " (including compiling for this shape: the first request of a shape compiles, later ones reuse it)"
        lines = [f"{what} in {self.seconds:.2f} s{note if self.compiled else ''}."]
        if self.details:
            lines.append(self.details)
        if self.command:
            lines.append(f"```\n{self.command}\n```")
        return "\n\n".join(lines)


class Workbench:
    """A loaded pipeline behind the web page: one method per page, one request at a time on the device."""

    def __init__(self, pipeline, limits: Limits | None = None):
        self.pipeline = pipeline
        self.limits = limits or Limits()
        self.card = ModelCard.of(pipeline)
        self._device = threading.Lock()
        self._compiled: set[Hashable] = set()

    # -- the pages ------------------------------------------------------------------------------

    def sample(self, num_images, steps, seed, eta=0.0, sampler="ddim", spacing="uniform",
               status: Status | None = None) -> Result:
        """The Sample page: ``num_images`` images from ``seed``, as ``ddim sample`` makes them."""
        num_images = self.check_count(num_images)
        seed = self.check_seed(seed)
        settings = self.check_sampling(steps, sampler, spacing, eta)
        batches = tuple(sorted({min(CLI_BATCH_SIZE, num_images - s) for s in range(0, num_images, CLI_BATCH_SIZE)}))
        images, seconds, compiled = self.on_device(
            ("generate", batches, settings.program),
            f"{num_images} images x {settings.steps} steps",
            status,
            lambda: self.pipeline.generate(num_images, seed=seed, batch_size=CLI_BATCH_SIZE, **settings.arguments()),
        )
        captions = [f"#{i} · seed {seed} · {settings.caption()}" for i in range(num_images)]
        command = self.cli_command("sample", num=num_images, seed=seed, **settings.options())
        stem = f"seed{seed}_{settings.steps}steps_{settings.sampler}_{settings.spacing}_eta{settings.eta:g}"
        return Result(images, captions, command, seconds, compiled, names=[f"{stem}_{i:04d}.png" for i in range(num_images)],
                      details="Image #*i* is `NNNN.png` (*i* = NNNN) of this command:")

    def interpolate(self, start_seed, start_image: Upload | None, end_seed, end_image: Upload | None, frames, steps,
                    spacing="uniform", status: Status | None = None) -> Result:
        """The Interpolate page: the frames between two seeds or two uploaded images (inverted), both ends included."""
        frames = self.check_integer("frames", frames, 2, self.limits.max_images, "--max-images")
        settings = self.check_sampling(steps, "ddim", spacing, 0.0)
        ends, labels, notes = [], [], []
        for which, seed, upload in (("start", start_seed, start_image), ("end", end_seed, end_image)):
            if upload is not None:
                pixels = self.read_image(upload.data, f"the uploaded {which} file")
                ends.append(("image", pixels))
                labels.append(upload.name)
            else:
                seed = self.check_seed(seed, f"{which} seed")
                ends.append(("seed", seed))
                labels.append(str(seed))

        def work():
            latents = []
            with _notices(notes):
                for kind, value in ends:
                    if kind == "seed":
                        latents.append(self.pipeline.latents(1, value)[0])
                    else:
                        latents.append(self.pipeline.invert([value], steps=settings.steps, spacing=settings.spacing)[0])
                return self.pipeline.interpolate(latents[0], latents[1], frames, steps=settings.steps,
                                                 spacing=settings.spacing, batch_size=CLI_BATCH_SIZE)

        inverts = sum(kind == "image" for kind, _ in ends)
        images, seconds, compiled = self.on_device(
            ("interpolate", frames, inverts > 0, settings.program), f"{frames} frames x {settings.steps} steps", status, work)
        command = self.cli_command("interpolate", **{"from": labels[0], "to": labels[1]}, frames=frames,
                                   steps=settings.steps, spacing=settings.spacing)
        captions = [f"frame {i} of {frames}" for i in range(frames)]
        return Result(images, captions, command, seconds, compiled, details=_notes_text(notes),
                      names=[f"interpolation_{i:04d}.png" for i in range(frames)],
                      animation=images, animation_name="interpolation.gif", noun="frame", frame_ms=INTERPOLATION_FRAME_MS)

    def reconstruct(self, upload: Upload | None, steps, spacing="uniform", status: Status | None = None) -> Result:
        """The Reconstruct page: invert an uploaded image and generate it back; the error says how close."""
        pixels = self.read_image(self.require_upload(upload).data)
        settings = self.check_sampling(steps, "ddim", spacing, 0.0)
        notes: list[str] = []

        def work():
            with _notices(notes):
                return self.pipeline.reconstruct([pixels], steps=settings.steps, spacing=settings.spacing)

        result, seconds, compiled = self.on_device(
            ("reconstruct", settings.program), f"inverting and regenerating 1 image x {settings.steps} steps", status, work)
        error = float(result.errors[0])
        psnr = 10 * math.log10(1.0 / error) if error > 0 else math.inf
        details = (f"Mean squared error {error:.5f} per pixel and channel on [0, 1] values "
                   f"(PSNR {psnr:.1f} dB), {settings.steps} steps, {settings.spacing} spacing.")
        command = self.cli_command("reconstruct", upload.name, steps=settings.steps, spacing=settings.spacing)
        return Result(result.images, [f"reconstruction · MSE {error:.5f}"], command, seconds, compiled,
                      details=_join(details, _notes_text(notes)), names=["reconstruction.png"], inputs=result.inputs)

    def edit(self, upload: Upload | None, strength, steps, seed, eta=0.0, sampler="ddim", spacing="uniform",
             status: Status | None = None) -> Result:
        """The Edit page (SDEdit): noise the uploaded image to ``strength`` and denoise it."""
        pixels = self.read_image(self.require_upload(upload).data)
        strength = self.check_number("strength", strength, 0.0, 1.0)
        if strength == 0.0:
            raise UIError("strength must be above 0 (0 would return the image unchanged), got 0")
        seed = self.check_seed(seed)
        settings = self.check_sampling(steps, sampler, spacing, eta)
        inputs, notes = self.model_view([pixels])

        def work():
            with _notices([]):  # the note on resizing came with model_view
                return self.pipeline.edit([pixels], strength=strength, seed=seed, **settings.arguments())

        images, seconds, compiled = self.on_device(
            ("edit", strength == 1.0, settings.program), f"editing 1 image x {settings.steps} steps", status, work)
        command = self.cli_command("edit", upload.name, strength=f"{strength:g}", seed=seed, **settings.options())
        caption = f"strength {strength:g} · seed {seed} · {settings.caption()}"
        return Result(images, [caption], command, seconds, compiled, details=_notes_text(notes),
                      names=[f"edit_strength{strength:g}_seed{seed}.png"], inputs=inputs)

    def inpaint(self, upload: Upload | None, mask, steps, seed, eta=0.0, sampler="ddim", spacing="uniform",
                status: Status | None = None) -> Result:
        """The Inpaint page: fill the region ``mask`` marks (bool ``(H, W)``, True = fill) in the uploaded image.

        A mask of another size than the image is resized to it (nearest neighbour), with a note.
        """
        pixels = self.read_image(self.require_upload(upload).data)
        seed = self.check_seed(seed)
        settings = self.check_sampling(steps, sampler, spacing, eta)
        mask = np.asarray(mask, dtype=bool) if mask is not None else None
        if mask is None or mask.ndim != 2 or not mask.any():
            raise UIError("paint the region to fill over the image with the brush first (nothing is marked)")
        inputs, notes = self.model_view([pixels])
        if mask.shape != pixels.shape[:2]:
            notes.append(f"the mask ({mask.shape[1]}x{mask.shape[0]}) was resized to the image's size "
                         f"({pixels.shape[1]}x{pixels.shape[0]})")
            mask = _resize_mask(mask, pixels.shape[:2])

        def work():
            with _notices([]):
                return self.pipeline.inpaint([pixels], mask, seed=seed, **settings.arguments())

        images, seconds, compiled = self.on_device(
            ("inpaint", settings.program), f"inpainting 1 image x {settings.steps} steps", status, work)
        command = self.cli_command("inpaint", upload.name, mask="mask.png", seed=seed, **settings.options())
        mask_image = np.repeat(mask[..., None].astype(np.uint8) * 255, 3, axis=-1)
        return Result(images, [f"inpainted · seed {seed} · {settings.caption()}"], command, seconds, compiled,
                      details=_join(_notes_text(notes), "`mask.png` (white = filled) is offered for download."),
                      names=[f"inpaint_seed{seed}.png"], inputs=inputs, extras={"mask.png": mask_image})

    def trajectory(self, num_images, steps, seed, eta=0.0, sampler="ddim", spacing="uniform",
                   status: Status | None = None) -> Result:
        """The Trajectory page: the predicted clean images after every step of the reverse process."""
        num_images = self.check_integer("number of images", num_images, 1,
                                        min(self.limits.max_images, MAX_TRAJECTORY_IMAGES), "--max-images")
        seed = self.check_seed(seed)
        settings = self.check_sampling(steps, sampler, spacing, eta, max_steps=MAX_TRAJECTORY_STEPS)
        frames, seconds, compiled = self.on_device(
            ("trajectory", num_images, settings.program), f"{num_images} images x {settings.steps} steps", status,
            lambda: self.pipeline.trajectory(num_images, seed=seed, batch_size=CLI_BATCH_SIZE, **settings.arguments()),
        )
        from ddim.images import make_grid

        grids = np.stack([make_grid(frame) for frame in frames])
        count = len(grids)
        captions = [f"after step {k + 1} of {count}" for k in range(count)]
        command = self.cli_command("sample", "--trajectory", num=num_images, seed=seed, **settings.options())
        # The GIF holds the final frame a little longer, as `ddim sample --trajectory` writes it.
        animation = np.concatenate([grids, np.repeat(grids[-1:], 4, axis=0)])
        return Result(grids, captions, command, seconds, compiled, names=[f"step_{k + 1:04d}.png" for k in range(count)],
                      details="The predicted clean image after each step, coarse to fine; the last is the sample. "
                              "`trajectory.gif` of this command:", animation=animation, animation_name="trajectory.gif", noun="frame",
                      frame_ms=TRAJECTORY_FRAME_MS)

    @staticmethod
    def random_seed() -> int:
        return random.randint(0, MAX_SEED)

    # -- checks ---------------------------------------------------------------------------------

    def check_count(self, num_images) -> int:
        return self.check_integer("number of images", num_images, 1, self.limits.max_images, "--max-images")

    @staticmethod
    def check_seed(seed, name: str = "seed") -> int:
        return Workbench.check_integer(name, seed, 0, MAX_SEED)

    def check_sampling(self, steps, sampler, spacing, eta, max_steps: int | None = None) -> Sampling:
        """Steps within the server's limit, a known sampler and spacing, eta in [0, 1] (> 0 only for ddim)."""
        from ddim import samplers

        if max_steps is not None and max_steps < self.limits.max_steps:
            steps = self.check_integer("steps", steps, 1, max_steps)
        else:
            steps = self.check_integer("steps", steps, 1, self.limits.max_steps, "--max-steps")
        sampler = self.check_choice("sampler", sampler, tuple(samplers.SAMPLERS))
        spacing = self.check_choice("spacing", spacing, tuple(samplers.SPACINGS))
        eta = self.check_number("eta", eta, 0.0, MAX_ETA)
        if eta > 0 and not samplers.SAMPLERS[sampler].stochastic:
            raise UIError(f"eta > 0 needs the ddim sampler ({sampler} is deterministic): set eta to 0 or pick ddim")
        return Sampling(steps, sampler, spacing, eta)

    @staticmethod
    def check_choice(name: str, value, choices: Sequence[str]) -> str:
        if value not in choices:
            raise UIError(f"unknown {name} {value!r} (choose from {', '.join(choices)})")
        return value

    @staticmethod
    def require_upload(upload: Upload | None) -> Upload:
        if upload is None:
            raise UIError("upload an image first")
        return upload

    def model_view(self, images: list[np.ndarray]) -> tuple[np.ndarray, list[str]]:
        """The images as the model sees them (centre-cropped and resized to its size), and the note saying so."""
        from ddim.images import to_uint8
        from ddim.sampling import prepare_images

        notes: list[str] = []
        with _notices(notes):
            prepared, _ = prepare_images(images, self.pipeline.config.model.image_size,
                                         self.pipeline.config.model.channels)
        return to_uint8(prepared), notes

    # -- uploads --------------------------------------------------------------------------------

    def read_image(self, data: bytes, what: str = "the uploaded file") -> np.ndarray:
        """Decode an uploaded image file to uint8 RGB ``(H, W, 3)``, or raise :class:`UIError`.

        Refuses anything Pillow cannot read, files that are damaged or truncated and
        images over ``limits.max_upload_pixels`` (checked from the header, before decoding).
        Decoded as the command line reads image files (:func:`ddim.images.read_image`):
        EXIF rotation applied, alpha dropped, RGB (grey for a one-channel model).
        """
        from PIL import Image, ImageOps, UnidentifiedImageError

        limit = self.limits.max_upload_pixels
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our limit is lower
                image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > limit:
                raise UIError(self._too_large(what, width, height))
            image.load()
            image = ImageOps.exif_transpose(image)
            grey = self.pipeline.config.model.channels == 1
            pixels = np.asarray(image.convert("L" if grey else "RGB"), dtype=np.uint8)
            return pixels[..., None] if grey else pixels
        except UIError:
            raise
        except Image.DecompressionBombError:  # Pillow's own refusal, far above ours
            raise UIError(f"{what} is over the limit of {limit / 1e6:.1f} megapixels; downscale it first") from None
        except UnidentifiedImageError:
            raise UIError(f"{what} is not an image (PNG, JPEG, WebP, GIF, BMP or TIFF)") from None
        except (OSError, SyntaxError, ValueError) as error:  # Pillow's ways of saying "damaged"
            raise UIError(f"{what} is a damaged or truncated image ({error})") from None

    def read_painted(self, data: bytes, what: str = "the painted mask") -> np.ndarray:
        """The region a painted layer marks, bool ``(H, W)``: its opaque pixels (alpha > 0).

        A layer without transparency is read as a mask image: white (brighter than
        mid-grey) marks the region, as ``ddim inpaint --mask`` reads it.
        """
        from PIL import Image

        self.read_image(data, what)  # the same checks as any upload
        with Image.open(io.BytesIO(data)) as image:
            if "A" in image.getbands() or "transparency" in image.info:
                return np.asarray(image.convert("RGBA"))[..., 3] > 0
            return np.asarray(image.convert("L")) > 127

    def _too_large(self, what: str, width: int, height: int) -> str:
        return (
            f"{what} is {width}x{height} = {width * height / 1e6:.1f} megapixels, over the limit of "
            f"{self.limits.max_upload_pixels / 1e6:.1f} megapixels; downscale it first"
        )

    # -- shared machinery -----------------------------------------------------------------------

    def on_device(self, shape: Hashable, description: str, status: Status | None, work: Callable[[], Any]):
        """Run ``work`` alone on the device; returns ``(its result, seconds, whether it compiled)``.

        ``shape`` names the compiled programs ``work`` needs: the first request with a
        new one is announced as compiling (the persistent compilation cache, when on,
        makes that quick after the first run of the server).
        """
        with self._device:
            compiles = shape not in self._compiled
            if status is not None:
                status(f"compiling for {description} (first request of this shape; later ones reuse it)..."
                       if compiles else f"running {description}...")
            started = time.perf_counter()
            result = work()
            seconds = time.perf_counter() - started
            self._compiled.add(shape)
        return result, seconds, compiles

    def cli_command(self, verb: str, *arguments: str, **options) -> str:
        """The ``ddim`` command that does the same on this checkpoint (uploads named as the user named them)."""
        parts = ["ddim", verb, *arguments, "--checkpoint", str(self.card.checkpoint)]
        for name, value in options.items():
            parts += [f"--{name.replace('_', '-')}", str(value)]
        return shlex.join(parts)

    @staticmethod
    def check_integer(name: str, value, low: int, high: int, option: str | None = None) -> int:
        number = _as_number(name, value)
        if number != math.floor(number):
            raise UIError(f"{name} must be a whole number (got {value!r})")
        return int(_check_range(name, number, low, high, option, "d"))

    @staticmethod
    def check_number(name: str, value, low: float, high: float, option: str | None = None) -> float:
        return float(_check_range(name, _as_number(name, value), low, high, option))


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _join(*parts: str) -> str:
    return " ".join(part for part in parts if part)


def _notes_text(notes: list[str]) -> str:
    return " ".join(f"Note: {note}." for note in dict.fromkeys(notes))


@contextlib.contextmanager
def _notices(notes: list[str]):
    """Collect the pipeline's notices (``UserWarning``: an image resized to the model's size) into ``notes``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        yield
    notes.extend(str(w.message) for w in caught if issubclass(w.category, UserWarning))


def _resize_mask(mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    image = Image.fromarray(mask.astype(np.uint8) * 255).resize((shape[1], shape[0]), Image.NEAREST)
    return np.asarray(image) > 127


def _as_number(name: str, value) -> float:
    if isinstance(value, bool) or value is None or (isinstance(value, str) and not value.strip()):
        raise UIError(f"{name} is missing or not a number (got {value!r})")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UIError(f"{name} must be a number (got {value!r})") from None
    if not math.isfinite(number):
        raise UIError(f"{name} must be a finite number (got {value!r})")
    return number


def _check_range(name: str, number: float, low: float, high: float, option: str | None, form: str = "g") -> float:
    if not low <= number <= high:
        limit = f" (the server's {option})" if option else ""
        got = format(int(number), form) if form == "d" and abs(number) < 1e18 else format(number, "g")
        raise UIError(f"{name} must be between {low:{form}} and {high:{form}}{limit}, got {got}")
    return number
