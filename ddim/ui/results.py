"""What a page shows for a request: images with captions and file names, notes, the summary under them."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings

import numpy as np

from ddim.spec import SamplingSpec
from ddim.ui.device import Setup


@dataclasses.dataclass
class Result:
    """What a page shows: images with captions, how to reproduce them, how long it took."""

    images: np.ndarray
    captions: list[str]
    command: str
    seconds: float
    setup: Setup  # what the time includes besides running (compiling, or reading the compilation cache)
    details: str = ""
    names: list[str] = dataclasses.field(default_factory=list)  # file names for downloads
    inputs: np.ndarray | None = None  # uploaded images as the model saw them (cropped and resized)
    extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # more images to offer, by file name
    animation: np.ndarray | None = None  # frames of an animated GIF
    animation_name: str = "animation.gif"
    noun: str = "image"  # what the images are, for the summary ("16 images in 2.10 s")
    frame_ms: int = 100

    def summary(self) -> str:
        what = plural(len(self.images), self.noun)
        lines = [f"{what} in {self.seconds:.2f} s{self.setup.note()}."]
        if self.details:
            lines.append(self.details)
        if self.command:
            lines.append(f"```\n{self.command}\n```")
        return "\n\n".join(lines)


def caption(spec: SamplingSpec) -> str:
    """``20 steps · ddim · uniform`` (then eta and guidance when they are set)."""
    text = f"{spec.steps} steps · {spec.sampler} · {spec.spacing}"
    if spec.eta:
        text += f" · eta {spec.eta:g}"
    if spec.guidance is not None:
        text += f" · guidance {spec.guidance:g}"
    return text


def file_stem(seed: int, spec: SamplingSpec) -> str:
    """``seed7_20steps_ddim_uniform_eta0``: the settings in a download's name."""
    stem = f"seed{seed}_{spec.steps}steps_{spec.sampler}_{spec.spacing}_eta{spec.eta:g}"
    return stem if spec.guidance is None else f"{stem}_guidance{spec.guidance:g}"


def class_label(names, ids, index: int) -> str:
    """``class daisy · `` for image ``index`` of class ids ``ids``; nothing without classes (``ids`` None)."""
    return "" if ids is None else f"class {names[int(ids[index])]} · "


def classes_in_order(names, ids) -> str:
    """``Classes in the grid's order: daisy, rose.``; nothing without classes."""
    return "" if ids is None else f"Classes in the grid's order: {', '.join(names[int(i)] for i in ids)}."


def frame_class(names, ends, index: int, frames: int) -> str:
    """`` · class daisy`` at an interpolation's ends, `` · class daisy → rose`` between; ``ends``: 2 ids or None."""
    if ends is None:
        return ""
    start, end = (names[i] for i in ends)
    if start == end or index in (0, frames - 1):
        return f" · class {start if index < frames - 1 else end}"
    return f" · class {start} → {end}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def join(*parts: str) -> str:
    """The non-empty parts, separated by spaces."""
    return " ".join(part for part in parts if part)


def notes_text(notes: list[str]) -> str:
    return " ".join(f"Note: {note}." for note in dict.fromkeys(notes))


@contextlib.contextmanager
def collect_notices(notes: list[str]):
    """Collect the pipeline's notices (``UserWarning``: an image resized to the model's size) into ``notes``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        yield
    notes.extend(str(w.message) for w in caught if issubclass(w.category, UserWarning))
