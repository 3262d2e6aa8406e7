"""A bundled model's record as types: :class:`BundleRecord`, how the weights were made and what they sample with
by default, and its :class:`Score` entries, each a ``ddim eval --split all`` measurement.

``ddim pretrained export`` writes the training fields (:func:`ddim.pretrained.export.training_record`); what is
not known stays null. A shipped model's record adds what was measured on it after export (nothing is filled in
by guesswork, and a score still to measure has ``"fid": null``)::

    "recipe":   the command that trained it           "data":      the images, in words
    "distilled_from": a distilled student's teacher, in words
    "hardware": what it trained on                    "wall_time": how long, in words
    "defaults": {"steps", "sampler", "spacing", "eta", "guidance"}: its best measured setting,
                what ``ddim sample --pretrained NAME`` uses when no option is given
    "scores":   [{"num", "steps", "sampler", "spacing", "eta", "guidance", "seed", "split", "real_num",
                  "fid", "kid", "class_accuracy", "real_class_accuracy", "source", "measured"}, ...]:
                ``ddim eval --split all`` figures (standard FID Inception, against all the real images at the
                model's size); ``source`` is the raw line's file under docs/results/
    "guidance": why the default scale is the best measured one, in words
    "advice":   which sampler for fewer steps, in words
    "sample_time": a line of ``benchmarks.speed.cli_timing`` (``ddim sample --pretrained NAME --num 16``: the CPU and
                the wall seconds of runs in a row, the first compiling), with ``source``, its file under docs/results/

Both types hold the JSON object of ``model.json`` as it is: :meth:`~RecordEntry.from_dict` keeps every key in its
order (one no field names too, in ``extra``) and :meth:`~RecordEntry.to_dict` gives the same object back, so a
record read and written again is unchanged; :meth:`~RecordEntry.replace` writes a new key after the others.

A setting in a record is written as :func:`setting_values` has it: a :class:`ddim.spec.SamplingSpec` whose
guidance scale is a number (:func:`ddim.spec.guidance_scale`: no guidance is 1); :func:`setting_of` reads it back,
from a record's entry or an ``eval.jsonl`` line alike. What a bundle samples with is
:meth:`BundleRecord.sampling_spec`, its ``defaults`` as they are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

from ddim.pretrained.errors import PretrainedError
from ddim.spec import SamplingSpec, SpecError, guidance_scale

SETTING_KEYS = ("steps", "sampler", "spacing", "eta", "guidance")
"""The fields of a setting as a record writes it (``defaults``, and a score's first after ``num``)."""
PLAIN = SamplingSpec(guidance=1.0)
"""The setting of a model with no recorded defaults (a run of your own): :class:`ddim.spec.SamplingSpec`'s defaults
(20 deterministic DDIM steps on the uniform grid), guidance 1 (no guidance is the conditional prediction). Scores
at it compare a bundled model with such runs."""


def setting_of(values: Mapping[str, Any]) -> SamplingSpec:
    """The setting of a record's ``defaults`` or score, or of an ``eval.jsonl`` line: a value missing or null is
    :data:`PLAIN`'s, the guidance scale a number."""
    given = {key: values[key] for key in SETTING_KEYS if key != "guidance" and values.get(key) is not None}
    return SamplingSpec(**given, guidance=guidance_scale(values.get("guidance")))


def setting_values(spec: SamplingSpec) -> dict[str, Any]:
    """``spec`` as a record writes a setting: ``{"steps", "sampler", "spacing", "eta", "guidance"}``, the guidance
    scale a number (and ``clip`` where set)."""
    return {**spec.to_dict(), "guidance": guidance_scale(spec.guidance)}


Entry = TypeVar("Entry", bound="RecordEntry")


@dataclass(frozen=True, kw_only=True)
class RecordEntry:
    """A JSON object of a record as a dataclass: the subclass's fields, and what keeps the object as it was read."""

    extra: Mapping[str, Any] = field(default_factory=dict)
    """The keys no field names, with their values as they are (a newer ddim's, a recipe's words)."""
    keys: tuple[str, ...] = ()
    """The object's keys in their order: what :meth:`to_dict` writes, then any other field that is not None."""

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("extra", "keys"))

    @classmethod
    def from_dict(cls: type[Entry], values: Mapping[str, Any]) -> Entry:
        """The entry of a JSON object, every key kept (in :attr:`keys`, in its order)."""
        names = cls.field_names()
        return cls(**{key: value for key, value in values.items() if key in names},
                   extra={key: value for key, value in values.items() if key not in names}, keys=tuple(values))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: :meth:`from_dict`'s very object for an entry read and not changed."""
        values = {name: getattr(self, name) for name in self.field_names()} | dict(self.extra)
        later = [name for name, value in values.items() if name not in self.keys and value is not None]
        return {name: values[name] for name in (*self.keys, *later)}

    def replace(self: Entry, **changes: Any) -> Entry:
        """A copy with ``changes`` (any key: one no field names goes in :attr:`extra`), a new key written last."""
        names = self.field_names()
        extra = {**self.extra, **{key: value for key, value in changes.items() if key not in names}}
        keys = (*self.keys, *(key for key in changes if key not in self.keys))
        return dataclasses.replace(self, **{key: value for key, value in changes.items() if key in names},
                                   extra=extra, keys=keys)


@dataclass(frozen=True, kw_only=True)
class Score(RecordEntry):
    """One measurement of a bundled model: ``num`` samples at a setting (:attr:`setting`), its figures, and where
    its raw line is kept. The setting's fields are as written (null in an unconditional model's older lines)."""

    num: int
    steps: int | None = None
    sampler: str | None = None
    spacing: str | None = None
    eta: float | None = None
    guidance: float | None = None
    seed: int | None = None
    split: str | None = None
    real_num: int | None = None
    """How many real images the samples were scored against."""
    fid: float | None = None
    """None: still to measure."""
    kid: float | None = None
    class_accuracy: float | None = None
    """How often a classifier on the FID features finds the asked class in the samples."""
    real_class_accuracy: float | None = None
    """That classifier's accuracy on real validation images."""
    source: str | None = None
    """The raw line's file under docs/results/."""
    measured: str | None = None
    """The date it was measured."""

    @property
    def setting(self) -> SamplingSpec:
        """The setting it was measured at, as :func:`setting_of` reads one."""
        return setting_of({key: getattr(self, key) for key in SETTING_KEYS})


@dataclass(frozen=True, kw_only=True)
class BundleRecord(RecordEntry):
    """How a bundled model was made and what it scores (``model.json``'s ``record``, the module's docstring)."""

    config: str | None = None
    """The name of the config it was trained with."""
    recipe: str | None = None
    steps: int | None = None
    """The training step of the checkpoint exported."""
    images_seen: int | None = None
    batch_size: int | None = None
    hardware: str | None = None
    fid: Mapping[str, Any] | None = None
    """The FID recorded at export: ``{"value", "protocol", "eval"}``."""
    checkpoint: str | None = None
    checkpoint_date: str | None = None
    exported: str | None = None
    trained_on_data: Mapping[str, Any] | None = None
    data: str | None = None
    distilled_from: str | None = None
    wall_time: str | None = None
    defaults: Mapping[str, Any] | None = None
    """Its best measured setting (:meth:`sampling_spec`), written by :meth:`with_defaults`."""
    scores: tuple[Score, ...] | None = None
    guidance: str | None = None
    """Why the default guidance scale is the best measured one, in words."""
    advice: str | None = None
    sample_time: Mapping[str, Any] | None = None
    weights_note: str | None = None
    """What storing the weights (in float16, say) did to the figures."""

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "BundleRecord":
        record = super().from_dict(values)
        if record.scores is None:
            return record
        return dataclasses.replace(record, scores=tuple(Score.from_dict(score) for score in record.scores))

    def to_dict(self) -> dict[str, Any]:
        values = super().to_dict()
        if self.scores is not None and "scores" in values:
            values["scores"] = [score.to_dict() for score in self.scores]
        return values

    def sampling_spec(self, name: str) -> SamplingSpec | None:
        """What the bundle ``name`` samples with when no option is given: its ``defaults`` as written (its best
        measured setting: steps, sampler, spacing, guidance), else None (the plain defaults)."""
        if self.defaults is None:
            return None
        try:
            return SamplingSpec(**self.defaults)
        except (TypeError, SpecError) as error:
            raise PretrainedError(f"the record of {name} has invalid sampling defaults {self.defaults!r}: "
                                  f"{error}") from None

    def with_defaults(self, spec: SamplingSpec) -> "BundleRecord":
        """This record with ``spec`` as its defaults (:func:`setting_values`)."""
        return self.replace(defaults=setting_values(spec))

    @property
    def default_setting(self) -> SamplingSpec:
        """The setting it samples with when no option is given, as scores are measured at: its ``defaults``, else
        :data:`PLAIN`."""
        return setting_of(self.defaults or {})

    def best_guidance(self, class_conditional: bool) -> float | None:
        """The guidance scale the record names as the model's best (its defaults' scale), else None (never
        measured)."""
        scale = (self.defaults or {}).get("guidance")
        return float(scale) if class_conditional and scale is not None else None

    def find_score(self, num: int, setting: SamplingSpec) -> Score | None:
        """The score of ``num`` samples at ``setting`` (as :func:`setting_of` reads one), else None."""
        return next((score for score in self.scores or () if score.num == num and score.setting == setting), None)
