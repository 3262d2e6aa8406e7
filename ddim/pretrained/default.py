"""Which bundled model ``ddim sample`` uses when none is named: the fastest good one, by its record's figures.

Among the bundled models of the largest image size (FIDs of models of different sizes do not compare), those
whose record scores their defaults at both :data:`SAMPLE_COUNTS` compete; a model whose FID is within
:data:`FID_MARGIN` of the best one's at both counts is good enough, and of those the one of fewest network passes
per image at its defaults (guidance costs a second pass unless the network takes the scale as an input) wins.
Where no model of that size has both scores, :data:`PREFERRED` stands in, else the first by name. JAX-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ddim.pretrained.bundle import Manifest
from ddim.pretrained.bundle_record import BundleRecord
from ddim.pretrained.render import network_passes

SAMPLE_COUNTS = (1000, 5000)
"""The numbers of samples both of whose FIDs a model must have to compete."""
FID_MARGIN = 0.05
"""How much worse than the best FID (relative) is still good enough: 5 %."""
PREFERRED = "flowers64"
"""The default where no model of the largest size has its FID at both counts, and first among equals."""


@dataclass(frozen=True)
class DefaultChoice:
    """The model chosen, and why, in words for the line ``ddim sample`` prints."""

    manifest: Manifest
    reason: str


def _fids(manifest: Manifest) -> tuple[float, ...] | None:
    """The FIDs of ``manifest``'s defaults at :data:`SAMPLE_COUNTS`, or None if one is not measured."""
    record = BundleRecord.from_dict(manifest.record)
    scores = [record.find_score(num, record.default_setting) for num in SAMPLE_COUNTS]
    if any(score is None or score.fid is None for score in scores):
        return None
    return tuple(float(score.fid) for score in scores)


def _passes(manifest: Manifest) -> int:
    return network_passes(manifest.config.model, BundleRecord.from_dict(manifest.record).default_setting)


def choose_default(models: Sequence[Manifest]) -> DefaultChoice | None:
    """The model to sample when none is named (module docstring), or None when ``models`` is empty."""
    if not models:
        return None
    size = max(model.config.model.image_size for model in models)
    largest = [model for model in models if model.config.model.image_size == size]
    scored = {model.name: fids for model in largest if (fids := _fids(model)) is not None}
    if not scored:
        chosen = min(largest, key=lambda model: (model.name != PREFERRED, model.name))
        which = "the preferred one of the" if chosen.name == PREFERRED else "the first by name of the"
        return DefaultChoice(chosen, f"{which} {size}x{size} models: none has FIDs at 1,000 and 5,000 samples to "
                                     "choose by")
    best = [min(fids[i] for fids in scored.values()) for i in range(len(SAMPLE_COUNTS))]
    good = [model for model in largest if model.name in scored
            and all(fid <= (1 + FID_MARGIN) * low for fid, low in zip(scored[model.name], best))]
    chosen = min(good, key=lambda model: (_passes(model), model.name != PREFERRED, model.name))
    passes = _passes(chosen)
    return DefaultChoice(chosen, f"the fastest {size}x{size} model within {FID_MARGIN:.0%} of the best FID at 1,000 "
                                 f"and 5,000 samples: {passes} network pass{'es' if passes > 1 else ''} per image")
