"""The page's checks on the values the browser sent: numbers, seeds, the server's limits, the sampling spec, classes.

Values arrive as the browser sent them (numbers may be strings, floats or out
of range); every check returns the value in its proper type or raises
:class:`UIError` with a message that names the field. The sampler settings
become one :class:`~ddim.spec.SamplingSpec`: the page checks only its own
ranges (the server's ``--max-steps``, eta up to 1), the spec checks the rest.
A class picker's value becomes a class id of the model (:func:`check_class`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

from ddim.errors import InputError, UserError
from ddim.spec import SamplingSpec

if TYPE_CHECKING:  # the sampling package imports JAX; these checks need only the class names
    from ddim.sampling.classes import ClassSpace

# Uploads larger than this are refused before decoding (a 6000x4000 photo is 24 MP). The
# model works at its own small size anyway; the limit bounds the memory one request can take.
MAX_UPLOAD_PIXELS = 25_000_000

# Seeds are 32-bit: ``jax.random.key`` keeps only the low 32 bits of larger integers.
MAX_SEED = 2**32 - 1

# Highest eta offered: 0 is deterministic DDIM, 1 the DDPM posterior (DDIM eq. 16).
MAX_ETA = 1.0

# The class picker's choice of no particular class: each image's class is drawn from the seed as the
# training data's classes are distributed (what `ddim sample` does without --class). Not a class name.
ANY_CLASS = "(any)"


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


class Range(NamedTuple):
    """The range the page allows for one number; ``option`` names the server option that sets it."""

    low: float
    high: float
    whole: bool = False
    option: str | None = None

    def check(self, name: str, value) -> int | float:
        if self.whole:
            return check_integer(name, value, int(self.low), int(self.high), self.option)
        return check_number(name, value, self.low, self.high, self.option)


def spec_ranges(limits: Limits, max_steps: int | None = None) -> dict[str, Range]:
    """The page's own ranges of the spec's numbers; ``max_steps`` below the server's limit is the page's own."""
    if max_steps is not None and max_steps < limits.max_steps:
        steps = Range(1, max_steps, whole=True)
    else:
        steps = Range(1, limits.max_steps, whole=True, option="--max-steps")
    return {"steps": steps, "eta": Range(0.0, MAX_ETA)}


def sampling_spec(values: Mapping[str, Any], ranges: Mapping[str, Range]) -> SamplingSpec:
    """One checked spec of the page's sampler values (``{"steps": "20", "sampler": "ddim", ...}``).

    Fields are set one at a time in the spec's order, so the first bad field is
    the one the message names; the spec's own :class:`~ddim.errors.InputError`
    becomes a :class:`UIError` with its words. Any field of the spec can be
    given (a new one needs no change here); fields left out keep their defaults.
    """
    names = [field.name for field in dataclasses.fields(SamplingSpec)]
    unknown = set(values) - set(names)
    if unknown:
        raise TypeError(f"not fields of SamplingSpec: {', '.join(sorted(unknown))}")
    spec = SamplingSpec()
    for name in (name for name in names if name in values):
        value = ranges[name].check(name, values[name]) if name in ranges else values[name]
        try:
            spec = spec.replace(**{name: value})
        except InputError as error:
            raise UIError(str(error)) from None
    return spec


def check_class(value, classes: "ClassSpace", name: str = "class") -> int | None:
    """The class id a picker sent, or None for :data:`ANY_CLASS` (also sent as None or "").

    A class is one of the model's names exactly (so a name made of digits is
    that name), or as :meth:`ClassSpace.class_id` reads it (any case, or an
    id). A name the model does not have is most likely a page opened before
    the server changed checkpoints; the message says to reload it.
    """
    if value is None or (isinstance(value, str) and value.strip() in ("", ANY_CLASS)):
        return None
    if not classes.conditional:
        raise UIError(f"this checkpoint is not class-conditional, so it takes no {name} (got {value!r})")
    if value in classes.names:
        return classes.names.index(value)
    try:
        return classes.class_id(value)
    except InputError:
        raise UIError(f"{name} {value!r} is not one of this checkpoint's {len(classes.names)} classes "
                      "(pick one from the menu; reload the page if the server has changed checkpoints)") from None


def check_guidance(spec: SamplingSpec, classes: "ClassSpace") -> None:
    """Refuse a guidance scale for a model without classes (the spec has checked its value)."""
    if spec.guidance is not None and not classes.conditional:
        raise UIError(f"this checkpoint is not class-conditional, so it takes no guidance scale "
                      f"(got {spec.guidance:g})")


def check_seed(seed, name: str = "seed") -> int:
    return check_integer(name, seed, 0, MAX_SEED)


def random_seed() -> int:
    return random.randint(0, MAX_SEED)


def check_integer(name: str, value, low: int, high: int, option: str | None = None) -> int:
    number = _as_number(name, value)
    if number != math.floor(number):
        raise UIError(f"{name} must be a whole number (got {value!r})")
    return int(_check_range(name, number, low, high, option, "d"))


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
