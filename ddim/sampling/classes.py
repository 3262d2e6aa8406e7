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
        if not model.takes_classes:
            return cls(False)
        names = model.class_names or tuple(str(i) for i in range(model.num_classes))
        return cls(True, tuple(names), tuple(model.class_counts))

    def ids_of_data_labels(self, labels, data_names, what: str = "the images") -> np.ndarray:
        """Labels of a dataset (ids of ``data_names``) as this model's class ids, matched by name; -1 stays -1.

        The identity for the data the model was trained on. A model trained on another copy of the dataset lists
        the same classes in another order (a folder export of a TFDS dataset: a folder's classes are its sorted
        subfolder names); matching by name reads the dataset itself. A class the model does not know raises
        :class:`InputError` (``what`` names the images in its message).
        """
        labels = np.asarray(labels)
        data_names = list(data_names)
        if not data_names or data_names == list(self.names):
            return labels
        index = {name: model_id for model_id, name in enumerate(self.names)}
        present = np.unique(labels[labels >= 0])
        unknown = [data_names[label] if label < len(data_names) else str(label) for label in present
                   if label >= len(data_names) or data_names[label] not in index]
        if unknown:
            raise InputError(f"{what} have classes the model was not trained on: "
                             f"{', '.join(map(repr, unknown[:3]))}{' ...' if len(unknown) > 3 else ''}")
        table = np.array([index.get(name, -1) for name in data_names], np.int64)
        return np.where(labels >= 0, table[np.maximum(labels, 0)], -1).astype(labels.dtype)

    def _refuse(self, what: str) -> InputError:
        return InputError(f"this model is not class-conditional (trained without model.class_conditional), "
                          f"so it takes no {what}")

    def _refuse_conditioning(self, classes, spec: SamplingSpec) -> None:
        """An unconditional model's answer to classes or a guidance scale."""
        if classes is not None:
            raise self._refuse("classes")
        if spec.guidance is not None:
            raise self._refuse("guidance scale")

    def class_id(self, value) -> int:
        """The id of one class given by its name (any case) or its id (an int, or a string of digits).

        A string that is a class's name is that class, digits or not: an image folder's classes ``0``, ``1``,
        ``10``, ``2`` sort so that the folder ``2`` has id 3, and ``--class 2`` means the folder.
        """
        if not self.conditional:
            raise self._refuse("classes")
        folded = {name.casefold(): i for i, name in enumerate(self.names)}
        key = str(value).strip().casefold()
        is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        if not is_int and key in folded:
            return folded[key]
        if is_int or key.isdigit():
            index = int(key)
            if not 0 <= index < len(self.names):
                raise InputError(f"class id {index} is out of range (this model has classes 0 to {len(self.names) - 1})")
            return index
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
            self._refuse_conditioning(classes, spec)
            return cond
        cond = dict(cond or {})
        if "label" not in cond:
            cond["label"] = self.resolve(classes, count, seed)
        return _with_guidance(cond, count, spec)

    def given(self, count: int, classes, cond=None):
        """``cond`` with the ids of ``classes`` (one for all ``count`` images, or one each) when given.

        For the verbs that take a class only if asked (invert, reconstruct):
        without ``classes``, ``cond`` comes back unchanged, which is the null
        class (no class) for a class-conditional network.
        """
        if classes is None:
            return cond
        cond = dict(cond or {})
        if "label" not in cond:
            cond["label"] = self.resolve(classes, count)
        return cond

    def ends(self, classes, spec: SamplingSpec) -> tuple[int, int] | None:
        """The start and end class ids of an interpolation, or None for the null class along the whole path.

        ``classes``: None, one name or id for the whole path, or a sequence of
        one or two (start, end). A guidance scale needs a class to guide
        towards; an unconditional model refuses classes and guidance.
        """
        if not self.conditional:
            self._refuse_conditioning(classes, spec)
            return None
        if classes is None:
            if spec.guidance is not None and spec.guidance != 1.0:
                raise InputError("a guidance scale needs a class to guide towards; give one class for the whole "
                                 "path, or two (a start and an end class)")
            return None
        items = [classes] if isinstance(classes, (str, int, np.integer)) else list(classes)
        if len(items) not in (1, 2):
            raise InputError(f"interpolation takes one class for the whole path or two (a start and an end class), "
                             f"got {len(items)}")
        ids = [self.class_id(item) for item in items]
        return ids[0], ids[-1]

    def path_condition(self, weights, spec: SamplingSpec, classes, cond=None):
        """``cond`` of the frames of an interpolation at ``weights`` (0 at the start, 1 at the end).

        Two classes: each frame's class vector is ``(1 - w) e_start + w
        e_end`` (``"label"``, ``"label_to"``, ``"label_mix"``; see
        :class:`ddim.nn.ClassEmbedding`), so the frames move from one class to
        the other; one class: every frame is that class; none: the null class
        (``cond`` unchanged). A label already in ``cond`` is kept.
        """
        ends = self.ends(classes, spec)
        if ends is None:
            return cond
        count, (start, end) = len(weights), ends
        cond = dict(cond or {})
        if "label" not in cond:
            cond["label"] = np.full(count, start, np.int32)
            if end != start:
                cond["label_to"] = np.full(count, end, np.int32)
                cond["label_mix"] = np.asarray(weights, np.float32)
        return _with_guidance(cond, count, spec)


def _with_guidance(cond: dict, count: int, spec: SamplingSpec) -> dict:
    """``cond`` with ``"guidance"`` (``count`` copies of ``spec.guidance``) unless it is None or 1."""
    if spec.guidance is not None and spec.guidance != 1.0:
        # Guidance 1 is the conditional prediction itself: no second (unconditional) half to compute.
        cond["guidance"] = np.full(count, spec.guidance, np.float32)
    return cond
