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

Status = Callable[[str], None]


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

    def summary(self) -> str:
        what = f"{len(self.images)} image{'s' if len(self.images) != 1 else ''}"
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

    def sample(self, num_images, steps, seed, eta, status: Status | None = None) -> Result:
        """The Sample page: ``num_images`` images from ``seed`` (as ``ddim sample`` makes them)."""
        num_images = self.check_integer("number of images", num_images, 1, self.limits.max_images, "--max-images")
        steps = self.check_integer("steps", steps, 1, self.limits.max_steps, "--max-steps")
        seed = self.check_integer("seed", seed, 0, MAX_SEED)
        eta = self.check_number("eta", eta, 0.0, MAX_ETA)
        batches = tuple(sorted({min(CLI_BATCH_SIZE, num_images - s) for s in range(0, num_images, CLI_BATCH_SIZE)}))
        images, seconds, compiled = self.on_device(
            ("generate", batches, steps),
            f"{num_images} images x {steps} steps",
            status,
            lambda: self.pipeline.generate(num_images, steps=steps, seed=seed, eta=eta, batch_size=CLI_BATCH_SIZE),
        )
        captions = [f"#{i} · seed {seed} · {steps} steps · eta {eta:g}" for i in range(num_images)]
        command = self.cli_command("sample", num=num_images, steps=steps, seed=seed, eta=f"{eta:g}")
        names = [f"seed{seed}_steps{steps}_eta{eta:g}_{i:04d}.png" for i in range(num_images)]
        return Result(images, captions, command, seconds, compiled, names=names,
                      details=f"Image #*i* is `NNNN.png` (*i* = NNNN) of this command:")

    @staticmethod
    def random_seed() -> int:
        return random.randint(0, MAX_SEED)

    # -- uploads --------------------------------------------------------------------------------

    def read_image(self, data: bytes, what: str = "the upload") -> np.ndarray:
        """Decode an uploaded image file to uint8 RGB ``(H, W, 3)``, or raise :class:`UIError`.

        Refuses anything Pillow cannot read, files that are damaged or truncated and
        images over ``limits.max_upload_pixels`` (checked from the header, before decoding).
        Transparent pixels are composited on white; EXIF rotation is applied.
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
            if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
                image = image.convert("RGBA")
                image = Image.alpha_composite(Image.new("RGBA", image.size, "white"), image)
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
        except UIError:
            raise
        except Image.DecompressionBombError:  # Pillow's own refusal, far above ours
            raise UIError(f"{what} is over the limit of {limit / 1e6:.1f} megapixels; downscale it first") from None
        except UnidentifiedImageError:
            raise UIError(f"{what} is not an image (PNG, JPEG, WebP, GIF, BMP or TIFF)") from None
        except (OSError, SyntaxError, ValueError) as error:  # Pillow's ways of saying "damaged"
            raise UIError(f"{what} is a damaged or truncated image ({error})") from None

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

    def cli_command(self, verb: str, **options) -> str:
        """The ``ddim`` command that does the same on this checkpoint."""
        parts = ["ddim", verb, "--checkpoint", str(self.card.checkpoint)]
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
