"""What an evaluation is asked to do: one frozen, checked value, from the command line or a Python call.

:class:`EvalRequest` names the checkpoint, how many images to generate and
how (one :class:`ddim.spec.SamplingSpec`), which real images or reference
statistics to compare with, and which feature network gives each metric. It
is checked once, when it is made; :func:`ddim.evaluation.job.evaluate` runs it.
Nothing here imports JAX.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import Any, Union

from ddim.errors import InputError
from ddim.evaluation.features import EvaluationError
from ddim.evaluation.reference import SPLITS
from ddim.spec import SamplingSpec

NETWORKS = ("standard", "keras")
"""Feature networks: the standard FID Inception (2015-12-05, pool3, 299px) and Keras' ImageNet InceptionV3."""

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class EvalRequest:
    """KID and FID of ``num`` images of a checkpoint, against real images or reference statistics.

    ``source`` is a work directory or a checkpoint step directory (as for
    :func:`ddim.sampling.load`); images come from ``spec``. ``fid_net`` and
    ``kid_net`` pick the feature network of each metric (:data:`NETWORKS`):
    ``"standard"`` is the FID Inception at 299px (weights ``fid_weights``, else
    found as :func:`~ddim.evaluation.fid_weights.resolve_fid_weights` says),
    ``"keras"`` Keras' InceptionV3 (weights ``inception_weights``, see
    :func:`~ddim.evaluation.keras_inception.resolve_weights`) at 299px for FID
    and 75px for KID. ``real_stats`` (an ``.npz`` with ``mu`` and ``sigma``)
    replaces the real images for FID; ``image_dir`` scores against that image
    folder's ``split`` instead of the checkpoint's own data. ``workdir``
    (default: the checkpoint's) receives ``eval.jsonl`` and ``eval_cache/``.

    A class-conditional checkpoint draws each image's class as its training
    data has them, or makes every image ``only_class`` (a name or an id), then
    compared with the real images of that class only; ``spec.guidance`` is
    its guidance scale. Its record adds the class mode and the class accuracy
    (:mod:`ddim.evaluation.conditional`). An unconditional checkpoint refuses
    both.
    """

    source: PathLike
    num: int = 5000
    spec: SamplingSpec | None = None
    """How to sample; None: the model's own defaults (a bundled model's best setting, a student's step count)."""
    spec_changes: tuple[tuple[str, Any], ...] = ()
    """Fields changed from :attr:`spec` (or the model's defaults), as ``(name, value)`` pairs: the command line's
    options. The job resolves both against the loaded model (:meth:`ddim.spec.SamplingRules.resolve`)."""
    seed: int = 0
    batch_size: int = 64
    real_num: int | None = None
    split: str = "val"
    image_dir: PathLike | None = None
    real_stats: PathLike | None = None
    fid_net: str = "standard"
    kid_net: str = "standard"
    fid_weights: PathLike | None = None
    inception_weights: PathLike | None = None
    workdir: PathLike | None = None
    kid_subsets: int = 100
    kid_subset_size: int = 1000
    feature_batch_size: int = 32
    only_class: str | int | None = None

    def __post_init__(self):
        for option, value in (("fid_net", self.fid_net), ("kid_net", self.kid_net)):
            if value not in NETWORKS:
                raise EvaluationError(f"unknown {option} {value!r} (choose from {', '.join(NETWORKS)})")
        if self.num < 2:
            raise EvaluationError(f"the number of generated images must be >= 2 for KID and FID, got {self.num}")
        if self.spec is not None and not isinstance(self.spec, SamplingSpec):
            raise TypeError(f"spec must be a SamplingSpec or None, got {type(self.spec).__name__}")
        if self.batch_size < 1:
            raise EvaluationError(f"the batch size must be >= 1, got {self.batch_size}")
        if self.real_num is not None and self.real_num < 2:
            raise EvaluationError(f"the number of real images must be >= 2, got {self.real_num}")
        if self.split not in SPLITS:
            raise EvaluationError(f"unknown split {self.split!r} (choose from {', '.join(SPLITS)})")
        if self.kid_subsets < 1 or self.kid_subset_size < 2:
            raise EvaluationError("KID needs >= 1 subset of >= 2 images")
        if self.only_class is not None:
            if isinstance(self.only_class, bool) or not isinstance(self.only_class, (str, numbers.Integral)):
                raise TypeError(f"only_class must be a class name or id, got {self.only_class!r}")
            # One class is compared with that class's real images of the checkpoint's own data.
            for option, value in (("--real-stats", self.real_stats), ("--data", self.image_dir)):
                if value is not None:
                    raise EvaluationError(f"one class (--class) is scored against the real images of that class in "
                                          f"the checkpoint's data, so it takes no {option}")

    @classmethod
    def of(cls, source: PathLike, *, spec: SamplingSpec | None = None, steps: int | None = None,
           sampler: str | None = None, spacing: str | None = None, eta: float | None = None,
           weights: PathLike | None = None, **fields: Any) -> "EvalRequest":
        """A request from loose keywords, as :func:`evaluate_checkpoint` always took them.

        ``steps``, ``sampler``, ``spacing`` and ``eta`` change ``spec``, or
        the model's defaults without one (a bad value is an
        :class:`EvaluationError`, as before); ``weights`` is ``inception_weights``.
        """
        changes = {name: value for name, value in (("steps", steps), ("sampler", sampler), ("spacing", spacing),
                                                   ("eta", eta)) if value is not None}
        try:
            SamplingSpec.of(spec, **changes)
        except InputError as error:
            raise EvaluationError(str(error)) from None
        if weights is not None:
            fields["inception_weights"] = weights
        return cls(source, spec=spec, spec_changes=tuple(changes.items()), **fields)

    @property
    def networks(self) -> tuple[str, ...]:
        """The feature networks to build, in order (a missing weights file is reported for ``fid_net`` first)."""
        return tuple(dict.fromkeys((self.fid_net, self.kid_net)))
