"""What evaluating a class-conditional checkpoint adds: which classes are asked for, and whether the images show them.

A conditional checkpoint samples classes as the training data has them (drawn
from its stored class frequencies, from each batch's seed: see
:meth:`ddim.sampling.classes.ClassSpace.resolve`), or one class for every
image; the guidance scale comes from the request's spec (1, plain conditional
sampling, when none is asked). The class-consistency score
(:mod:`ddim.evaluation.class_consistency`) needs the labelled FID features of
the checkpoint's own training and validation images, from the same cache as
FID's reference. An unconditional checkpoint refuses a class and a guidance
scale with the pipeline's one-line error. Real labels are matched to the
model's classes by name (:func:`as_model_ids`), so a model trained on a copy of
a dataset whose classes come in another order is scored by the dataset itself.
Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ddim.errors import InputError
from ddim.evaluation import class_consistency as consistency
from ddim.evaluation.features import EvaluationError, FeatureExtractor
from ddim.evaluation.reference import labelled_real_features

DATA_FREQUENCY = "data-frequency"
UNCONDITIONAL = "unconditional"


@dataclass(frozen=True)
class ClassPlan:
    """The classes an evaluation asks a conditional checkpoint for, and the guidance scale it samples with."""

    names: tuple[str, ...]
    class_id: int | None
    """The one class every image is asked to be, or None: drawn as the training data has them."""
    guidance: float
    """The classifier-free guidance scale (1: plain conditional sampling; 0: the unconditional prediction)."""

    @property
    def mode(self) -> str:
        """``"class:NAME"`` (one class), ``"unconditional"`` (guidance 0: the classes reach no image) or
        ``"data-frequency"``."""
        if self.class_id is not None:
            return f"class:{self.names[self.class_id]}"
        return UNCONDITIONAL if self.guidance == 0 else DATA_FREQUENCY

    def asked(self, pipe, count: int, seed: int) -> np.ndarray:
        """The class ids of a batch of ``count`` images sampled with ``seed`` (what ``pipe.generate`` draws)."""
        return pipe.class_ids(self.class_id, count, seed)

    def wanted(self, labels: np.ndarray) -> np.ndarray:
        """The ``labels`` of the real images that count towards the ceiling: all, or the one class's (-1 the rest)."""
        labels = np.asarray(labels)
        return labels if self.class_id is None else np.where(labels == self.class_id, labels, -1)


def plan_classes(pipe, only_class, spec) -> ClassPlan | None:
    """The plan of a conditional checkpoint; None for an unconditional one, which refuses ``only_class`` and
    ``spec.guidance`` (an :class:`ddim.errors.InputError`, as sampling does). An unknown class is one too."""
    space = pipe.class_space
    if not space.conditional:
        space.condition(1, spec, only_class, 0)  # raises the pipeline's error for a class or a guidance scale
        return None
    class_id = space.class_id(only_class) if only_class is not None else None
    return ClassPlan(space.names, class_id, 1.0 if spec.guidance is None else float(spec.guidance))


@dataclass(frozen=True)
class RealClasses:
    """The classifier fitted on the real training images, and its accuracy on the real validation images."""

    classifier: consistency.Classifier
    val_accuracy: float | None


def data_class_names(config, data_cache: str | os.PathLike) -> list[str]:
    """The class names of ``config``'s data, in label order, from its data cache (no pixels read)."""
    from ddim import data as data_lib

    config = dataclasses.replace(config, data=dataclasses.replace(config.data, cache_dir=str(data_cache)))
    return data_lib.load(config, None, ("train",), lambda message: None, False, check=False).class_names


def as_model_ids(plan: ClassPlan, labels, data_names) -> np.ndarray:
    """Real ``labels`` (ids of ``data_names``) as the model's class ids, matched by name; -1 stays -1
    (:meth:`ddim.sampling.classes.ClassSpace.ids_of_data_labels`; an unknown class is an :class:`EvaluationError`)."""
    # Imported here: ddim.sampling's package imports the pipeline and with it JAX, which evaluation avoids.
    from ddim.sampling.classes import ClassSpace

    try:
        return ClassSpace(True, tuple(plan.names)).ids_of_data_labels(labels, data_names, "the real images")
    except InputError as error:
        raise EvaluationError(str(error)) from None


def fit_on_real(plan: ClassPlan, config, extractor: FeatureExtractor, cache_dir: str | os.PathLike, log: Callable,
                show_progress: bool, data_cache: str | os.PathLike) -> RealClasses:
    """Fit the classifier on the labelled features of ``config``'s training split; score its validation split.

    Without validation images (an empty split, no ``data.val_split``) the ceiling is None.
    """
    names = data_class_names(config, data_cache)
    (train,), labels = labelled_real_features(config, "train", None, [extractor], cache_dir, log, show_progress,
                                              data_cache)
    if labels.max(initial=-1) >= max(len(plan.names), len(names)):
        raise EvaluationError(f"the checkpoint's training data now has classes the model was not trained on "
                              f"(label {labels.max()} of a model with {len(plan.names)} classes)")
    labels = as_model_ids(plan, labels, names)
    if not np.any(labels >= 0):
        raise EvaluationError("the checkpoint's training images have no class labels to fit the class classifier on")
    classifier = consistency.fit(train, labels, len(plan.names))
    try:
        (val,), val_labels = labelled_real_features(config, "val", None, [extractor], cache_dir, log, show_progress,
                                                    data_cache)
    except EvaluationError as error:  # no validation split, or too few images in it
        log(f"class accuracy: no ceiling on real validation images ({error})")
        return RealClasses(classifier, None)
    val_labels = as_model_ids(plan, val_labels, names)
    val_accuracy = consistency.accuracy(consistency.predict(classifier, val), plan.wanted(val_labels))
    return RealClasses(classifier, val_accuracy)


def of_one_class(plan: ClassPlan, features: list[np.ndarray], labels: np.ndarray, split: str) -> list[np.ndarray]:
    """The real features of the plan's one class (all of them without one); at least 2 images, as KID and FID need."""
    if plan.class_id is None:
        return features
    chosen = np.asarray(labels) == plan.class_id
    if chosen.sum() < 2:
        raise EvaluationError(f"the {split} split has {int(chosen.sum())} image(s) of class "
                              f"{plan.names[plan.class_id]!r}; need at least 2 (try --split all)")
    return [f[chosen] if f is not None else None for f in features]


def record_fields(plan: ClassPlan, real: RealClasses, predicted: np.ndarray, asked: np.ndarray) -> dict[str, Any]:
    """The ``eval.jsonl`` fields of a conditional checkpoint: guidance, class mode and the class accuracies."""
    return {
        "guidance": plan.guidance,
        "class_mode": plan.mode,
        "class_accuracy": consistency.accuracy(predicted, asked),
        "real_val_class_accuracy": real.val_accuracy,
        "chance": consistency.chance(len(plan.names)),
        "classifier": consistency.NAME,
        "classifier_train_num": real.classifier.train_num,
    }
