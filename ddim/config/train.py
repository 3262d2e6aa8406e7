"""``[train]``: optimisation, logging and checkpointing."""

from __future__ import annotations

from dataclasses import dataclass

from ddim.config.parsing import ConfigError, at_least, choice

LOSSES = ("mae", "mse")
"""The errors of the prediction target a run can train with (:class:`ddim.objective.Objective`)."""
WEIGHTINGS = ("none", "min-snr", "p2")
"""The per-example weightings of the loss by noise level (:mod:`ddim.objective`)."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, logging and checkpointing."""

    num_epochs: int = 50
    """Training epochs (one epoch is dataset_repetitions passes over the training images)."""
    max_steps: int = 0
    """Stop after this many optimiser steps in total; 0 means train all num_epochs."""
    max_images: int = 0
    """Stop after this many training images in total (``max_images / batch_size`` steps, rounded up): a length
    that means the same on a folder of 20 images and of 20,000, where epochs do not; 0: no such limit. Of
    num_epochs, max_steps and max_images, the one that ends the run first ends it."""
    batch_size: int = 64
    """Global batch size (images per optimiser step)."""
    learning_rate: float = 1e-3
    """AdamW peak learning rate."""
    lr_schedule: str = "constant"
    """Learning rate after the warm-up: "constant" (the Keras example) or "cosine" (decays to 0 at the run's
    last step, train.max_steps or num_epochs' steps; optax.warmup_cosine_decay_schedule)."""
    warmup_steps: int = 0
    """Steps of linear learning-rate warm-up from 0 (0: none)."""
    lr_decay_steps: int = 0
    """Steps over which "cosine" decays to 0; 0: the run's length. Set it to train in several runs of growing
    train.max_steps on one schedule (the ablation's checkpoints at 1,000 steps are those of its 4,000-step runs)."""
    grad_clip: float = 0.0
    """Clip the gradient's global norm to this (optax.clip_by_global_norm); 0: no clipping."""
    label_dropout: float = 0.1
    """Class-conditional models: the fraction of training images whose class is replaced by the null class, so
    the one network also learns the unconditional prediction that guidance needs (Ho & Salimans use 0.1-0.2)."""
    loss: str = "mae"
    """Error of the prediction target: "mae" (the Keras example) or "mse" (DDPM's L_simple)."""
    loss_weighting: str = "none"
    """Per-example weight of the loss by noise level: "none", "min-snr" (Hang et al. 2023) or "p2" (Choi et al.
    2022); see ddim/objective.py for what each does over this schedule's SNR range (0.0004 to 9.3)."""
    snr_gamma: float = 5.0
    """min-snr: the SNR above which the clean-image weight stops growing (Hang et al.: 5)."""
    p2_k: float = 1.0
    """p2: the k of the weight 1 / (k + SNR)^gamma of the noise loss (Choi et al.: 1)."""
    p2_gamma: float = 1.0
    """p2: the gamma of that weight (Choi et al.: 0.5 or 1)."""
    weight_decay: float = 1e-4
    """AdamW decoupled weight decay."""
    adam_eps: float = 1e-7
    """AdamW epsilon (Keras' default, 1e-7)."""
    ema_decay: float = 0.999
    """Decay of the exponential moving average of the weights used for sampling."""
    ema_warmup: bool = True
    """Warm the EMA decay up as min(ema_decay, (1 + step) / (10 + step)) so short runs already sample well."""
    seed: int = 0
    """Seed of parameter init, data order, noise and the sample grid."""
    log_every: int = 50
    """Fetch metrics from the device and log them every this many steps."""
    checkpoint_every: int = 500
    """Save a checkpoint every this many steps (also at the end of every epoch and of training)."""
    keep_checkpoints: int = 3
    """How many of the most recent checkpoints to keep."""
    keep_checkpoints_every: int = 0
    """Also keep, for good, every checkpoint whose step is a multiple of this (orbax's ``keep_period``), so a run
    can be scored at several lengths afterwards; 0: only the most recent ``keep_checkpoints``."""
    eval_every: int = 1
    """Validation loss and a sample grid every this many epochs (0 disables both)."""
    eval_batches: int = 0
    """Validation batches per evaluation; 0 means the whole validation split."""
    normalizer_batches: int = 10
    """Batches used to initialise the normaliser's statistics before training (0: start from mean 0, var 1)."""
    grid_rows: int = 3
    """Rows of the sample grid written at the end of every evaluation."""
    grid_cols: int = 6
    """Columns of the sample grid."""
    sample_steps: int = 20
    """DDIM steps used for the sample grid during training."""
    kid_images: int = 1000
    """Images generated for a cheap KID estimate at every evaluation (0 disables; needs InceptionV3 weights)."""
    kid_steps: int = 5
    """DDIM steps of the KID estimate's images (the Keras example uses 5)."""
    keep_best: bool = True
    """With KID on: also keep the checkpoint with the lowest KID in <workdir>/best."""
    inception_weights: str = ""
    """InceptionV3 weights file for KID; empty: $DDIM_INCEPTION_WEIGHTS or Keras' cache (see ddim eval)."""



def validate_train(t: TrainConfig) -> None:
    """Check the relations between ``[train]`` values that types alone cannot express."""
    at_least(1, {
        "train.batch_size": t.batch_size,
        "train.num_epochs": t.num_epochs,
        "train.log_every": t.log_every,
        "train.checkpoint_every": t.checkpoint_every,
        "train.keep_checkpoints": t.keep_checkpoints,
        "train.grid_rows": t.grid_rows,
        "train.grid_cols": t.grid_cols,
        "train.sample_steps": t.sample_steps,
        "train.kid_steps": t.kid_steps,
    })
    at_least(0, {
        "train.max_steps": t.max_steps,
        "train.max_images": t.max_images,
        "train.eval_every": t.eval_every,
        "train.keep_checkpoints_every": t.keep_checkpoints_every,
        "train.eval_batches": t.eval_batches,
        "train.normalizer_batches": t.normalizer_batches,
        "train.kid_images": t.kid_images,
        "train.warmup_steps": t.warmup_steps,
        "train.lr_decay_steps": t.lr_decay_steps,
        "train.grad_clip": t.grad_clip,
    })
    if not 0.0 <= t.ema_decay < 1.0:
        raise ConfigError(f"train.ema_decay must be in [0, 1), got {t.ema_decay}")
    if t.kid_images == 1:
        raise ConfigError("train.kid_images must be 0 (off) or >= 2")
    if t.learning_rate <= 0:
        raise ConfigError(f"train.learning_rate must be > 0, got {t.learning_rate}")
    choice("train.loss", t.loss, LOSSES)
    choice("train.loss_weighting", t.loss_weighting, WEIGHTINGS)
    choice("train.lr_schedule", t.lr_schedule, ("constant", "cosine"))
    if not 0.0 <= t.label_dropout <= 1.0:
        raise ConfigError(f"train.label_dropout must be in [0, 1], got {t.label_dropout}")
    for key, value in {"train.snr_gamma": t.snr_gamma, "train.p2_k": t.p2_k, "train.p2_gamma": t.p2_gamma}.items():
        if not value > 0:
            raise ConfigError(f"{key} must be > 0, got {value}")
