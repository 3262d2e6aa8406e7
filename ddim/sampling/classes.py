"""The classes of a class-conditional model: names and ids, drawing them, and the ``cond`` they become."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ddim.config import ModelConfig
from ddim.errors import InputError
from ddim.spec import SamplingSpec


@dataclass(frozen=True)
class ClassSpace:
    """What a model knows of its classes: whether it takes them, their names and training frequencies."""

    conditional: bool
    names: tuple[str, ...] = ()
    counts: tuple[int, ...] = ()

    @classmethod
    def of(cls, model: ModelConfig) -> "ClassSpace":
        if not model.class_conditional:
            return cls(False)
        names = model.class_names or tuple(str(i) for i in range(model.num_classes))
        return cls(True, tuple(names), tuple(model.class_counts))

    def _refuse(self, what: str) -> InputError:
        return InputError(f"this model is not class-conditional (trained without model.class_conditional), "
                          f"so it takes no {what}")

    def class_id(self, value) -> int:
        """The id of one class given by its id (an int or a string of digits) or its name (any case)."""
        if not self.conditional:
            raise self._refuse("classes")
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) or str(value).strip().isdigit():
            index = int(value)
            if not 0 <= index < len(self.names):
                raise InputError(f"class id {index} is out of range (this model has classes 0 to {len(self.names) - 1})")
            return index
        folded = {name.casefold(): i for i, name in enumerate(self.names)}
        key = str(value).strip().casefold()
        if key in folded:
            return folded[key]
        close = difflib.get_close_matches(key, list(folded), n=3, cutoff=0.5)
        hint = f"; closest: {', '.join(repr(self.names[folded[c]]) for c in close)}" if close else ""
        raise InputError(f"unknown class {str(value)!r}{hint} (ddim sample --list-classes lists them)")

    def resolve(self, classes, num_images: int, seed: int = 0) -> np.ndarray:
        """int32 class ids of ``num_images`` images.

        ``classes``: one name or id for all, or a sequence of one per image (or of
        one); None draws them from the training data's class frequencies with
        ``seed`` (uniformly when the model does not know them).
        """
        if not self.conditional:
            raise self._refuse("classes")
        if classes is None:
            counts = np.asarray(self.counts, np.float64)
            p = counts / counts.sum() if counts.size and counts.sum() > 0 else None
            return np.random.default_rng(seed).choice(len(self.names), size=num_images, p=p).astype(np.int32)
        items: Sequence[Any] = [classes] if isinstance(classes, (str, int, np.integer)) else list(classes)
        if len(items) == 1:
            items = list(items) * num_images
        if len(items) != num_images:
            raise InputError(f"{len(items)} classes for {num_images} images (give one class, or one per image)")
        return np.array([self.class_id(item) for item in items], np.int32)

    def condition(self, count: int, spec: SamplingSpec, classes, seed: int, cond=None):
        """``cond`` with ``"label"`` (the ids of ``classes``) and ``"guidance"`` (``spec.guidance``, when not 1).

        A label already in ``cond`` is kept. An unconditional model refuses
        classes and a guidance scale, and gets ``cond`` back unchanged.
        """
        if not self.conditional:
            if classes is not None:
                raise self._refuse("classes")
            if spec.guidance is not None:
                raise self._refuse("guidance scale")
            return cond
        cond = dict(cond or {})
        if "label" not in cond:
            cond["label"] = self.resolve(classes, count, seed)
        if spec.guidance is not None and spec.guidance != 1.0:
            # Guidance 1 is the conditional prediction itself: no second (unconditional) half to compute.
            cond["guidance"] = np.full(count, spec.guidance, np.float32)
        return cond
