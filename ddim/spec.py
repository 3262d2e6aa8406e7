"""What to sample with: :class:`SamplingSpec`, and the registry of samplers and spacings.

One frozen value carries the sampler settings from the command line, the web
page or a Python call through the pipeline to the compiled program and into
the evaluation record; it is checked once, when it is made. The registry is
the one list of sampler and spacing names: the solvers in
:mod:`ddim.samplers` are built from it, and the command line's help and
checks read it. Nothing here imports JAX, so ``ddim --help`` stays instant.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import string
from dataclasses import dataclass
from typing import Any, NamedTuple

from ddim.errors import InputError


class SamplerKind(NamedTuple):
    """A registered sampler: its order, whether it takes ``eta`` (fresh noise), one line about it, and whether only
    a consistency student samples with it."""

    order: int
    stochastic: bool
    summary: str
    consistency: bool = False


SAMPLERS: dict[str, SamplerKind] = {
    "ddim": SamplerKind(1, True, "DDIM's update (DDIM eq. 12; eq. 16's fresh noise with eta > 0), first order"),
    "dpmpp-2m": SamplerKind(2, False, "DPM-Solver++(2M) (Lu et al. 2022, Algorithm 2), second order, deterministic"),
    "dpmpp-3m": SamplerKind(3, False, "DPM-Solver++ third-order multistep, deterministic"),
    "consistency": SamplerKind(1, False, "multistep consistency sampling (Song et al. 2023, Algorithm 1): the "
                               "image prediction re-noised with fresh noise to the next time; consistency students "
                               "only", consistency=True),
}
"""Every sampler by its name; :mod:`ddim.samplers` builds one solver per entry."""

SPACINGS: dict[str, str] = {
    "uniform": "DDIM's grid, t = 1, 1 - 1/steps, ..., 1/steps",
    "logsnr": "uniform in log-SNR, from t = 1 to t = 0",
    "karras": "Karras et al. 2022 (EDM) eq. 5 with rho = 7, from t = 1 to t = 0",
}
"""Every time grid by its name (see :func:`ddim.samplers.time_grid`)."""

DEFAULT_STEPS = 20

# Which sampler and grid to use, by the FID of samples: docs/research/samplers.md#sample-quality-by-fid.
# `ddim sample`'s tip, its --help and the web page's help lines are built from these.
FID_BEST_SPACING = "uniform"
FEW_STEPS = 10  # at most this many steps, FEW_STEPS_BEST scored best (measured at 5 and 10)
FEW_STEPS_BEST = ("dpmpp-2m", "logsnr")
FEW_STEPS_MEASURED_ON = ("flowers32-noise",)
"""The bundled models whose records hold that few-step comparison (their ``advice``); `ddim sample`'s tip is for
models of their image size only (32x32: at 64x64 fewer steps were never compared)."""


WORDS: dict[str, tuple[str, str]] = {
    "steps": ("the number of diffusion steps", "{} steps"),
    "sampler": ("sampler", "the {} sampler"),
    "spacing": ("spacing", "the {} grid"),
    "eta": ("eta", "eta {}"),
    "guidance": ("the guidance scale", "guidance scales {}"),
    "clip": ("clip", "clip {}"),
}
"""How a :class:`SpecError` names each field for a Python caller, alone and with a value; the command line names
it by its option, ``--<field>`` (``--<field> <value>``)."""


class _Wording(string.Formatter):
    """Fills a :class:`SpecError` template: ``{field}`` and ``{field:value}`` name a field of :data:`WORDS` (in
    Python's words, or as the command-line option), any other ``{name}`` is a value given to the error."""

    def __init__(self, cli: bool):
        super().__init__()
        self.cli = cli

    def get_value(self, key, args, kwargs):
        return _Field(key) if key in WORDS else kwargs[key]

    def format_field(self, value, format_spec):
        if not isinstance(value, _Field):
            return super().format_field(value, format_spec)
        if self.cli:
            return f"--{value.name} {format_spec}" if format_spec else f"--{value.name}"
        alone, with_value = WORDS[value.name]
        return with_value.format(format_spec) if format_spec else alone


class _Field(NamedTuple):
    name: str


class SpecError(InputError):
    """A bad sampling setting, worded once: its message for Python callers, and ``cli_message`` naming the
    command-line option.

    ``template`` names fields as ``{steps}`` or ``{steps:4}`` (:data:`WORDS`) and other values as ``{name}`` (given
    as keywords); ``got``, the value refused, ends the message (", got 0"; on the command line " (got 0)").
    """

    def __init__(self, template: str, got: Any = None, **values: Any):
        messages = [_Wording(cli).format(template, **values) for cli in (False, True)]
        if got is not None:
            messages = [messages[0] + f", got {got}", messages[1] + f" (got {got})"]
        super().__init__(messages[0])
        self.cli_message = messages[1]


def _names(registry) -> str:
    return ", ".join(registry)


@dataclass(frozen=True)
class SamplingSpec:
    """How to run the reverse process: network calls, solver, time grid, fresh noise and guidance.

    Checked when made: a bad value raises :class:`SpecError` (an
    :class:`ddim.errors.InputError`) whose one sentence says which and why
    (unknown names list the valid ones).
    ``eta`` and ``guidance`` are traced, so changing them does not recompile;
    every other field (``steps``, ``sampler``, ``spacing``, ``clip``) shapes the
    compiled program (one compile per combination, :attr:`static`).
    """

    steps: int = DEFAULT_STEPS
    """Network calls per image (the cost of sampling), >= 1."""
    sampler: str = "ddim"
    """A name of :data:`SAMPLERS`."""
    spacing: str = "uniform"
    """A name of :data:`SPACINGS`."""
    eta: float = 0.0
    """DDIM's fresh noise per step (DDIM eq. 16): 0 is deterministic, 1 DDPM-like; only stochastic samplers take > 0."""
    guidance: float | None = None
    """Classifier-free guidance scale (Ho & Salimans 2022) for class-conditional models; None: no guidance."""
    clip: bool = False
    """Clip every step's image prediction to the pixels' range, [0, 1] in the normaliser's units, and go on with
    the noise the clipped image implies (DDPM's ``clip_denoised``)."""

    def __post_init__(self):
        steps = self.steps
        if isinstance(steps, bool) or not isinstance(steps, int) and not _is_numpy_integer(steps) or steps < 1:
            raise SpecError("{steps} must be an integer >= 1", got=repr(steps))
        object.__setattr__(self, "steps", int(steps))
        for field, registry in (("sampler", SAMPLERS), ("spacing", SPACINGS)):
            name = getattr(self, field)
            if not isinstance(name, str) or name not in registry:
                raise SpecError(f"unknown {{{field}}} {{name!r}} (choose from {{choices}})", name=name,
                                choices=_names(registry))
        eta = _number("eta", self.eta)
        if not eta >= 0:
            raise SpecError("{eta} must be >= 0", got=self.eta)
        if eta > 0 and not SAMPLERS[self.sampler].stochastic:
            if SAMPLERS[self.sampler].consistency:  # its only users, consistency students, sample with nothing else
                raise SpecError("{sampler:{name}} takes no {eta}: it draws fresh noise at every step itself; leave "
                                "out {eta}", name=self.sampler)
            raise SpecError("{eta} > 0 needs {sampler:ddim} ({name} is deterministic)", name=self.sampler)
        object.__setattr__(self, "eta", eta)
        if self.guidance is not None:
            guidance = _number("guidance", self.guidance)
            if not guidance >= 0:
                raise SpecError("{guidance} must be >= 0", got=self.guidance)
            object.__setattr__(self, "guidance", guidance)
        if not isinstance(self.clip, bool):
            raise SpecError("{clip} must be True or False", got=repr(self.clip))

    @property
    def static(self) -> "SamplingSpec":
        """What a compiled program is specialised on: this spec with its traced fields (``eta``, ``guidance``) at
        their defaults. Every other field, a new one too, tells programs apart; the key of a compiled program."""
        return self.replace(eta=0.0, guidance=None)

    @property
    def stochastic(self) -> bool:
        """Whether the sampler draws fresh noise (its ``eta`` is above 0)."""
        return self.eta > 0

    def replace(self, **changes: Any) -> "SamplingSpec":
        """A checked copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def of(cls, spec: "SamplingSpec | None" = None, **fields: Any) -> "SamplingSpec":
        """``spec`` (default: the defaults) with the given fields changed; ``None`` values leave a field as it is.

        The verbs take either a whole spec or loose keywords (``steps=20``) and
        make one value of them here.
        """
        changes = {name: value for name, value in fields.items() if value is not None}
        base = spec if spec is not None else cls()
        return dataclasses.replace(base, **changes) if changes else base

    def to_dict(self) -> dict[str, Any]:
        """Plain values, as written into ``eval.jsonl`` and other records (``clip`` only when set, so records of
        unclipped sampling read as they always have)."""
        values = dataclasses.asdict(self)
        if not self.clip:
            del values["clip"]
        return values

    def cli_options(self, *, skip_defaults: bool = True) -> list[str]:
        """The ``ddim sample`` options that reproduce this spec (defaults left out unless asked for)."""
        default, options = SamplingSpec(), []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "clip":  # a flag, given when set
                options += ["--clip"] if value else []
                continue
            if value is None or (skip_defaults and value == getattr(default, field.name)):
                continue
            options += [f"--{field.name}", f"{value:g}" if isinstance(value, float) else str(value)]
        return options


def guidance_scale(guidance: float | None) -> float:
    """The scale a guidance setting amounts to: None (no guidance) is 1, the conditional prediction alone.

    How records compare and write a setting (a bundle's ``defaults`` and ``scores``, ``eval.jsonl`` lines), whatever
    a line of an unconditional model or an older ``ddim eval`` has for it. Sampling itself keeps None apart: a model
    without classes takes no scale at all.
    """
    return 1.0 if guidance is None else float(guidance)


def _is_numpy_integer(value) -> bool:
    return type(value).__module__ == "numpy" and hasattr(value, "dtype") and value.dtype.kind in "iu"


def _number(name: str, value) -> float:
    """``value`` as a finite float (a Python or numpy number, or its text), else a :class:`SpecError` naming ``name``."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SpecError(f"{{{name}}} must be a number", got=repr(value))
    number = float(value)
    if not math.isfinite(number):
        raise SpecError(f"{{{name}}} must be a finite number", got=repr(value))
    return number


@dataclass(frozen=True)
class SamplingRules:
    """What one model samples with when nothing is asked (:attr:`defaults`), and what it refuses.

    A diffusion model takes any spec but the consistency sampler; its defaults are :class:`SamplingSpec`'s, or the
    measured best setting a bundled model's record names. A distilled student (``model.distilled_steps``) samples
    only with its own sampler (deterministic DDIM for a progressive student, multistep consistency sampling for a
    consistency student) on the uniform grid of one of its step counts, and a student that takes the guidance
    scale as an input only within the range it was distilled on: anything else is a :class:`SpecError` that
    names what it has.
    """

    defaults: SamplingSpec = SamplingSpec()
    distilled_steps: int = 0
    guidance_range: tuple[float, ...] = ()
    name: str = "this model"
    step_counts: tuple[int, ...] = ()
    """A student's step counts (default: ``distilled_steps`` alone)."""
    sampler: str = "ddim"
    """A student's sampler."""
    teacher: str = ""
    """A student's teacher (``model.distilled_from``), named in the refusals of what it cannot do."""

    @classmethod
    def of(cls, model, defaults: SamplingSpec | None = None, name: str | None = None) -> "SamplingRules":
        """The rules of a :class:`ddim.config.ModelConfig`, with a bundle's recorded ``defaults`` if any."""
        steps, sampler = model.distilled_steps, model.distilled_sampler if model.distilled_steps else "ddim"
        if defaults is None:
            defaults = SamplingSpec(steps=steps, sampler=sampler) if steps else SamplingSpec()
        counts = tuple(model.distilled_step_counts) or ((steps,) if steps else ())
        return cls(defaults, steps, tuple(model.guidance_range), name or "this model", counts, sampler,
                   model.distilled_from)

    @property
    def distilled(self) -> bool:
        return self.distilled_steps > 0

    def resolve(self, spec: SamplingSpec | None = None, **fields: Any) -> SamplingSpec:
        """``spec`` (default: :attr:`defaults`) with the given fields changed (``None`` keeps one), checked."""
        resolved = SamplingSpec.of(spec if spec is not None else self.defaults, **fields)
        self.check(resolved)
        return resolved

    def check(self, spec: SamplingSpec) -> SamplingSpec:
        """``spec`` if this model can sample with it, else a :class:`SpecError` saying what it takes."""
        if self.distilled:
            self._check_student(spec)
        elif SAMPLERS[spec.sampler].consistency:
            raise SpecError("{sampler:{name}} is for consistency students, and {model} is a diffusion model (choose "
                            "from {choices})", name=spec.sampler, model=self.name,
                            choices=_names(name for name, kind in SAMPLERS.items() if not kind.consistency))
        if self.guidance_range and spec.guidance is not None:
            low, high = self.guidance_range
            if not low <= spec.guidance <= high:
                raise SpecError("{model} was distilled for {guidance:{low:g} to {high:g}}", got=f"{spec.guidance:g}",
                                model=self.name, low=low, high=high)
        return spec

    def _check_student(self, spec: SamplingSpec) -> None:
        counts = self.step_counts or (self.distilled_steps,)
        if spec.steps not in counts:
            raise SpecError("{model} is distilled for {steps:{counts}} only", got=spec.steps, model=self.name,
                            counts=_names(str(count) for count in counts))
        # A progressive student's DDIM steps may take eta: its predictions at its own grid times are denoisers
        # there, so eq. 16's fresh noise applies as for a diffusion model (Meng et al. 2023 sample their distilled
        # students with fresh noise too); its sampler and grid are what it was distilled for.
        if (spec.sampler, spec.spacing) != (self.sampler, "uniform"):
            what = ("DDIM steps" if self.sampler == "ddim" else f"{self.sampler} sampling") + " on the uniform grid"
            raise SpecError("{model} is distilled for {what} only; leave out {sampler} and {spacing}",
                            model=self.name, what=what)

    def refuse_ode(self, verb: str) -> None:
        """A student has no probability-flow ODE to run backwards or from part way: ``verb`` needs the teacher."""
        if self.distilled:
            teacher = f" ({self.teacher})" if self.teacher else ""
            raise SpecError("{model} is a distilled student: it samples from pure noise on its {count}-step grid and "
                            "cannot {verb}; use the diffusion model it was distilled from{teacher}", model=self.name,
                            count=self.distilled_steps, verb=verb, teacher=teacher)
