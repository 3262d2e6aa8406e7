"""``[init]``: fine-tuning, a run that starts from a trained model's weights instead of random ones."""

from __future__ import annotations

from dataclasses import dataclass

from ddim.config.parsing import ConfigError, choice


@dataclass(frozen=True)
class InitConfig:
    """Where a run's first weights come from (``ddim train --init SOURCE``; docs/finetuning.md).

    With a ``source`` the run starts from its averaged (EMA) weights, the ones it samples with, with a fresh
    optimiser at step 0 and this config's warm-up and schedule; it takes its network's shape from the source.
    ``source_step`` and ``source_sha256`` are filled in when the run starts and stored in every checkpoint."""

    source: str = ""
    """The trained model to start from: ``pretrained:NAME`` (``ddim pretrained`` lists them), a run's work
    directory (its newest checkpoint) or a checkpoint step directory. Empty: random initial weights."""
    new_classes: str = "random"
    """How the class vector of a class the source does not know (matched by name) starts: "random" (the
    embedding's own initialisation: distinct vectors, so the new classes tell apart from the first step), "null"
    (a copy of the source's null-class vector, so the class starts as the source's unconditional prediction; zero
    for an unconditional source, so the class starts as the source) or "mean" (the mean of the source's class
    vectors). "random" is the default by measurement: flowers32-noise fine-tuned on Fashion-MNIST's ten classes for
    411 steps put the asked class in 60.7 % of its samples against 14.2 % with "null" and 11.1 % with "mean", at a
    lower FID (54.3 against 56.5 and 58.3; docs/finetuning.md)."""
    normalizer: str = "keep"
    """The input normaliser's statistics (per-channel mean and variance of the training images) at the start:
    "keep" the source's, or "adapt" them to the new data's first ``train.normalizer_batches`` batches. Either
    way training moves them to the new data (momentum 0.99); see docs/finetuning.md for what each measured."""
    targets: str = "data"
    """What the fine-tune's loss compares the network's output with: "data" (the training images' own targets:
    their noise, velocity or clean image, as ``model.prediction`` says) or "source" (the source model's own
    prediction at the same noisy input, class and noise level, converted to ``model.prediction``: the source
    teaches itself a new target, as a distillation with one step per step). "source" is for changing what a
    model predicts on the data it was trained on: the targets are the source's estimate of the mean velocity
    at each noisy image, where the data's are one draw scattered around it, so the new network copies the
    source's function instead of learning it again (docs/finetuning.md measures both); each step runs the
    source once more (1.2 to 1.5 times a step's time for flowers32's network at batch 64 on a 2-core CPU). On
    new data it would keep the source's images, so fine-tunes on new data use "data"."""
    source_step: int = -1
    """Filled in when the run starts: the training step of the source's weights (-1: no source)."""
    source_sha256: str = ""
    """Filled in when the run starts: the SHA-256 of the source's weights as loaded (for a bundled model, the
    one its ``model.json`` and ``ddim pretrained`` show)."""


def validate_init(i: InitConfig) -> None:
    """Check the ``[init]`` choices."""
    choice("init.new_classes", i.new_classes, ("null", "mean", "random"))
    choice("init.normalizer", i.normalizer, ("keep", "adapt"))
    choice("init.targets", i.targets, ("data", "source"))
    if i.targets == "source" and not i.source:
        raise ConfigError('init.targets = "source" needs a source model to learn from: set init.source '
                          "(ddim train --init SOURCE)")
