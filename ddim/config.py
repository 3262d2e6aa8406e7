"""Typed configuration: dataclasses loaded from TOML, with ``section.key=value`` overrides.

Every value is documented where it is defined. The defaults are the reference
setup of the Keras DDIM example (``configs/flowers64.toml`` spells them out).
Unknown sections or keys and values of the wrong type are errors
(:class:`ConfigError`), never silently ignored.

Configs are frozen values (hashable, so a Flax module can hold one): derive a
changed copy with :meth:`Config.override` rather than assigning to a field.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddim.errors import UserError
if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


class ConfigError(UserError, ValueError):
    """A configuration file or override is invalid (the message says which key and why)."""


@dataclass(frozen=True)
class ModelConfig:
    """The network and the noise schedule (everything needed to rebuild the model)."""

    image_size: int = 64
    """Side of the square training and generated images, in pixels."""
    channels: int = 3
    """Image channels (3 for RGB)."""
    widths: tuple[int, ...] = (32, 64, 96, 128)
    """Channel width of each UNet level; every level but the last halves the resolution."""
    block_depth: int = 2
    """Residual blocks per UNet level (down and up)."""
    embedding_dims: int = 32
    """Size of the sinusoidal embedding of the noise variance (must be even)."""
    embedding_min_frequency: float = 1.0
    """Lowest frequency of the sinusoidal embedding."""
    embedding_max_frequency: float = 1000.0
    """Highest frequency of the sinusoidal embedding."""
    min_signal_rate: float = 0.02
    """Signal rate at diffusion time 1 (the noisiest level of the cosine schedule)."""
    max_signal_rate: float = 0.95
    """Signal rate at diffusion time 0 (the cleanest level of the cosine schedule)."""
    dtype: str = "float32"
    """Compute dtype of the network: "float32" or "bfloat16" (parameters and loss stay float32).

    bfloat16 is for GPUs/TPUs; on CPUs XLA's bfloat16 convolutions are slower than float32."""
    prediction: str = "noise"
    """What the network predicts: "noise" (eps, the Keras example), "velocity" (v = alpha eps - sigma x_0,
    Salimans & Ho 2022) or "image" (x_0; distilled students). Samplers and tools convert each to (noise, image)
    (ddim/objective.py)."""
    attention_resolutions: tuple[int, ...] = ()
    """Feature-map sides (pixels) whose residual blocks are followed by multi-head self-attention, e.g. [8, 16]
    (DDPM puts it at 16x16; ADM at 32, 16, 8). Empty: no attention (the Keras example)."""
    attention_heads: int = 1
    """Heads of each self-attention layer (ADM Table 1: more heads help); must divide the level's width."""
    dropout: float = 0.0
    """Dropout rate inside each residual block, before its second convolution (DDPM uses 0.1 on CIFAR-10)."""
    embedding_injection: str = "input"
    """How the noise embedding reaches the network: "input" (concatenated to the input, the Keras example) or
    "every-block" (also a per-block scale and shift of the normalised features, ADM's AdaGN)."""
    class_conditional: bool = False
    """Condition the network on each image's class, for class-conditional sampling with classifier-free guidance
    (Ho & Salimans 2022): the classes come from the data (TFDS labels, or an image folder's subfolders)."""
    class_embedding: str = "noise-features"
    """How the class reaches a class-conditional network: "noise-features" (a learned vector, initialised small,
    std 0.1 for 102 classes, added to the noise level's sinusoidal features before the input and the block
    embedding's MLP) or "adm" (ADM's label_emb, Dhariwal & Nichol 2021: a unit-normal vector per class added to
    the block embedding after its MLP; needs embedding_injection "every-block"). The small vectors of
    "noise-features" stay small in training, and the network hardly uses them (benchmarks/class_usage.py)."""
    num_classes: int = 0
    """Classes of the training data; set from the data when training starts (0: unconditional)."""
    class_names: tuple[str, ...] = ()
    """The classes' names, set from the data (TFDS label names, or subfolder names)."""
    class_counts: tuple[int, ...] = ()
    """Training images per class, set from the data: classes are drawn with these frequencies when none is asked."""
    guidance_input: bool = False
    """The network takes the classifier-free guidance scale as an input and gives the guided prediction in one pass
    (Meng et al. 2023, "On distillation of guided diffusion models"): set by ``ddim distill`` on the student of a
    class-conditional teacher, never trained from scratch."""
    guidance_range: tuple[float, ...] = ()
    """With guidance_input: the [lowest, highest] guidance scale the student was distilled on; others are refused."""
    distilled_steps: int = 0
    """0 for a diffusion model (any step count, any sampler). A distilled student (``ddim distill``) samples with
    exactly this many deterministic DDIM steps on the uniform grid it was distilled for, and nothing else."""


@dataclass(frozen=True)
class DataConfig:
    """The training images: a folder of your own (``image_dir``) or a TFDS dataset, and how they are read."""

    image_dir: str = ""
    """Folder of training images (searched recursively; PNG, JPEG, WebP, BMP, TIFF, GIF). When set, the
    TFDS keys below are not used; ``ddim train --data PATH`` sets it."""
    val_fraction: float = 0.2
    """Image folders: fraction of images held out for validation, chosen by a hash of each file's path
    relative to the folder (so adding files never moves others between the splits). 0.2 as Flowers' 80/20."""
    min_image_size: int = 0
    """Image folders: skip images whose shorter side is below this many pixels; 0 means model.image_size
    (no image is upscaled)."""
    max_image_pixels: int = 89_478_485
    """Image folders: skip images with more pixels (width x height) than this as decompression bombs
    (Pillow's own limit by default)."""
    max_bad_fraction: float = 0.1
    """Image folders: refuse to train when more than this fraction of the image files is unusable
    (corrupt, truncated, too small, ...): a sign of the wrong folder or a broken copy."""
    cache_dir: str = ""
    """Directory of the preprocessed-image cache; empty means <workdir>/data_cache. Point several runs
    at one directory to share it."""
    workers: int = 0
    """Processes decoding images when the cache is built; 0 means one per CPU core."""
    prefetch: int = 4
    """Batches read ahead of the training step by background threads (0: read in the training thread)."""
    dataset: str = "oxford_flowers102"
    """TFDS dataset name; any TFDS dataset with an "image" feature works."""
    train_split: str = "train[:80%]+validation[:80%]+test[:80%]"
    """TFDS split expression of the training images (the Keras example's 80/20 re-split)."""
    val_split: str = "train[80%:]+validation[80%:]+test[80%:]"
    """TFDS split expression of the validation images (the complement of train_split)."""
    data_dir: str = ""
    """TFDS data directory; empty means TFDS's default (or $TFDS_DATA_DIR)."""
    dataset_repetitions: int = 5
    """Passes over the training images per epoch (as in the Keras example)."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, logging and checkpointing."""

    num_epochs: int = 50
    """Training epochs (one epoch is dataset_repetitions passes over the training images)."""
    max_steps: int = 0
    """Stop after this many optimiser steps in total; 0 means train all num_epochs."""
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


@dataclass(frozen=True)
class DistillConfig:
    """``ddim distill``: progressive distillation (Salimans & Ho 2022, Algorithm 2) of a teacher into few-step
    students, with the guidance scale folded into the student first for class-conditional teachers (Meng et al.
    2023, stage one). Defaults follow the papers' reference code (google-research ``diffusion_distillation``,
    ``cifar_distill.py``) where it fits a CPU-sized run; see docs/distillation.md."""

    start_steps: int = 32
    """The teacher's DDIM step count the first round starts from: its deterministic DDIM sample on the uniform
    grid of this many steps is what the students learn to reproduce in fewer."""
    end_steps: int = 1
    """The last round's student step count; start_steps / end_steps must be a power of 2 (rounds halve)."""
    round_steps: int = 2000
    """Optimiser steps per halving round (the reference: 50,000 at batch 128 on TPUs)."""
    first_stage_steps: int = 2000
    """Optimiser steps of stage one: the student learns the teacher's guided prediction at start_steps' times,
    with the guidance scale as an input (Meng et al. 2023) and in its own prediction target. Only run when the
    teacher is class-conditional or predicts another target than the student; else round one starts from the
    teacher."""
    prediction: str = "velocity"
    """The student's prediction target: "velocity" (v = alpha eps - sigma x_0) or "image" (x_0; the reference's
    choice). Not "noise": a noise prediction divides by the signal rate to give the image, which at one step
    (signal rate 0.02) magnifies its error fifty-fold (Salimans & Ho 2022, section 4)."""
    learning_rate: float = 1e-4
    """Adam's learning rate at the start of every round, decayed linearly to 0 at its end (the reference: 5e-5
    over 50,000 steps; shorter rounds take a larger one)."""
    batch_size: int = 64
    """Images per optimiser step."""
    grad_clip: float = 1.0
    """Clip the gradient's global norm to this (the reference: 1); 0: no clipping."""
    ema_decay: float = 0.0
    """Decay of the student's weight average used as the next teacher and for sampling; 0 uses the weights
    themselves (the reference: 0, as the learning rate decays to 0 in every round)."""
    guidance_min: float = 0.0
    """Class-conditional teachers: the lowest guidance scale the student learns (0: the unconditional model)."""
    guidance_max: float = 4.0
    """Class-conditional teachers: the highest guidance scale the student learns (Meng et al.: w in [0, 4] on
    ImageNet 64, their w being this project's scale minus 1)."""
    label_dropout: float = 0.1
    """Class-conditional teachers: the share of images distilled with the null class, so the student keeps the
    unconditional prediction that the verbs without a class use (the teacher's own train.label_dropout)."""
    seed: int = 0
    """Seed of the data order, noise, times and guidance scales."""


@dataclass(frozen=True)
class Config:
    """A complete run configuration."""

    name: str = "flowers64"
    """Name of the run; the default work directory is runs/<name>."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    """Used by ``ddim distill`` only."""

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts (tuples as lists), as stored in checkpoints and accepted by :func:`from_dict`."""
        return _plain(dataclasses.asdict(self))

    def override(self, *overrides: str) -> "Config":
        """A validated copy with ``section.key=value`` overrides applied (see :func:`apply_overrides`)."""
        return from_dict(apply_overrides(self.to_dict(), list(overrides)))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _check_type(value: Any, annotation: Any, key: str) -> Any:
    """Return ``value`` converted to ``annotation`` or raise ConfigError naming ``key``."""
    origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_type,) = typing.get_args(annotation)[:1]
        items = [_check_type(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            try:
                return _check_type(value, option, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: {value!r} is not of type {annotation}")
    if annotation is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected nothing, got {value!r}")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {annotation}")  # pragma: no cover


def _build(cls, values: dict[str, Any], prefix: str):
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a table, got {values!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown config key {prefix + unknown[0]!r} (known keys: {', '.join(sorted(known))})"
        )
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, f"{prefix}{name}.")
        else:
            kwargs[name] = _check_type(value, hint, prefix + name)
    return cls(**kwargs)


# Keys ("section.key") that configs once had and that mean nothing now: dropped on load (with no warning), so older
# config files and the configs stored in older checkpoints still load. Never reuse such a name.
RETIRED_KEYS = frozenset({
    "data.shuffle_buffer",  # each epoch is one global shuffle (ddim.data.loader), no buffer
})


def drop_retired_keys(values: dict[str, Any]) -> dict[str, Any]:
    """A copy of nested config dicts without the :data:`RETIRED_KEYS`."""
    if not isinstance(values, dict):
        return values  # _build reports it
    values = dict(values)
    for key in RETIRED_KEYS:
        section, _, leaf = key.rpartition(".")
        table = values.get(section)
        if isinstance(table, dict) and leaf in table:
            values[section] = {name: value for name, value in table.items() if name != leaf}
    return values


def from_dict(values: dict[str, Any]) -> Config:
    """Build and validate a Config from nested dicts (e.g. a parsed TOML file; retired keys are dropped)."""
    config = _build(Config, drop_retired_keys(values), "")
    validate(config)
    return config


def _parse_value(text: str) -> Any:
    """Parse an override value as TOML (``3``, ``1e-3``, ``true``, ``[32, 64]``, ``"x"``), else a bare string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to nested dicts (validated later by :func:`from_dict`)."""
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {override!r} is not of the form section.key=value")
        *sections, leaf = key.strip().split(".")
        table = values
        for section in sections:
            table = table.setdefault(section, {})
            if not isinstance(table, dict):
                raise ConfigError(f"override {override!r}: {section!r} is not a section")
        table[leaf] = _parse_value(text.strip())
    return values


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a TOML config (or the defaults when ``path`` is None) and apply overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        values = read_toml(path)
        values.setdefault("name", Path(path).stem)
    return from_dict(apply_overrides(values, list(overrides or [])))


def read_toml(path: str | Path) -> dict[str, Any]:
    """The values of a TOML config file, not yet validated; :class:`ConfigError` when missing or not TOML."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None


def validate(config: Config) -> None:
    """Check the relations between values that types alone cannot express."""
    m, t, d = config.model, config.train, config.data
    levels = len(m.widths) - 1
    if not m.widths or any(w < 1 for w in m.widths):
        raise ConfigError("model.widths must be a non-empty list of positive integers")
    if m.image_size < 1 or m.image_size % (2**levels):
        raise ConfigError(f"model.image_size ({m.image_size}) must be a positive multiple of 2**{levels}")
    if m.embedding_dims < 2 or m.embedding_dims % 2:
        raise ConfigError(f"model.embedding_dims must be even and >= 2, got {m.embedding_dims}")
    if not 0.0 < m.min_signal_rate < m.max_signal_rate < 1.0:
        raise ConfigError("need 0 < model.min_signal_rate < model.max_signal_rate < 1")
    if m.dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"model.dtype must be 'float32' or 'bfloat16', got {m.dtype!r}")
    positive = {
        "model.block_depth": m.block_depth,
        "model.channels": m.channels,
        "train.batch_size": t.batch_size,
        "train.num_epochs": t.num_epochs,
        "train.log_every": t.log_every,
        "train.checkpoint_every": t.checkpoint_every,
        "train.keep_checkpoints": t.keep_checkpoints,
        "train.grid_rows": t.grid_rows,
        "train.grid_cols": t.grid_cols,
        "train.sample_steps": t.sample_steps,
        "train.kid_steps": t.kid_steps,
        "data.dataset_repetitions": d.dataset_repetitions,
        "data.max_image_pixels": d.max_image_pixels,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key} must be >= 1, got {value}")
    for key, value in {
        "train.max_steps": t.max_steps,
        "train.eval_every": t.eval_every,
        "train.eval_batches": t.eval_batches,
        "train.normalizer_batches": t.normalizer_batches,
        "train.kid_images": t.kid_images,
        "data.min_image_size": d.min_image_size,
        "data.workers": d.workers,
        "data.prefetch": d.prefetch,
    }.items():
        if value < 0:
            raise ConfigError(f"{key} must be >= 0, got {value}")
    if not 0.0 <= t.ema_decay < 1.0:
        raise ConfigError(f"train.ema_decay must be in [0, 1), got {t.ema_decay}")
    if t.kid_images == 1:
        raise ConfigError("train.kid_images must be 0 (off) or >= 2")
    if not 0.0 <= d.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction must be in [0, 1), got {d.val_fraction}")
    if not 0.0 <= d.max_bad_fraction <= 1.0:
        raise ConfigError(f"data.max_bad_fraction must be in [0, 1], got {d.max_bad_fraction}")
    if t.learning_rate <= 0:
        raise ConfigError(f"train.learning_rate must be > 0, got {t.learning_rate}")
    _validate_recipe(config)
    _validate_distillation(config)


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


def _validate_recipe(config: Config) -> None:
    """The prediction target, loss, schedule, classes and network options (see the fields' docs)."""
    m, t = config.model, config.train
    _choice("model.prediction", m.prediction, ("noise", "velocity", "image"))
    _choice("model.embedding_injection", m.embedding_injection, ("input", "every-block"))
    _choice("model.class_embedding", m.class_embedding, ("noise-features", "adm"))
    if m.class_conditional and m.class_embedding == "adm" and m.embedding_injection != "every-block":
        # An unconditional model has no class embedding: a config may name "adm" for when it trains by class.
        raise ConfigError('model.class_embedding "adm" adds the class to the block embedding, which only '
                          'model.embedding_injection "every-block" has: add --set model.embedding_injection=every-block '
                          'to train by class')
    _choice("train.loss", t.loss, ("mae", "mse"))
    _choice("train.loss_weighting", t.loss_weighting, ("none", "min-snr", "p2"))
    _choice("train.lr_schedule", t.lr_schedule, ("constant", "cosine"))
    sides = {m.image_size // 2**level: m.widths[level] for level in range(len(m.widths))}
    for side in m.attention_resolutions:
        if side not in sides:
            raise ConfigError(f"model.attention_resolutions: no UNet level is {side}x{side} "
                              f"(the levels are {', '.join(str(s) for s in sides)})")
        if m.attention_heads < 1 or sides[side] % m.attention_heads:
            raise ConfigError(f"model.attention_heads ({m.attention_heads}) must divide the width {sides[side]} "
                              f"of the {side}x{side} level")
    if m.num_classes < 0 or len(m.class_names) not in (0, m.num_classes) or len(m.class_counts) not in (0, m.num_classes):
        raise ConfigError("model.class_names and model.class_counts must have model.num_classes entries")
    if not 0.0 <= t.label_dropout <= 1.0:
        raise ConfigError(f"train.label_dropout must be in [0, 1], got {t.label_dropout}")
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError(f"model.dropout must be in [0, 1), got {m.dropout}")
    for key, value in {"train.warmup_steps": t.warmup_steps, "train.lr_decay_steps": t.lr_decay_steps,
                       "train.grad_clip": t.grad_clip}.items():
        if value < 0:
            raise ConfigError(f"{key} must be >= 0, got {value}")
    for key, value in {"train.snr_gamma": t.snr_gamma, "train.p2_k": t.p2_k, "train.p2_gamma": t.p2_gamma}.items():
        if not value > 0:
            raise ConfigError(f"{key} must be > 0, got {value}")


def _validate_distillation(config: Config) -> None:
    """The ``[distill]`` section and a distilled model's own fields (see their docs)."""
    m, d = config.model, config.distill
    if m.distilled_steps < 0:
        raise ConfigError(f"model.distilled_steps must be >= 0, got {m.distilled_steps}")
    if m.guidance_input and not m.class_conditional:
        raise ConfigError("model.guidance_input needs a class-conditional model (guidance needs classes)")
    if m.guidance_range and (len(m.guidance_range) != 2 or not 0.0 <= m.guidance_range[0] <= m.guidance_range[1]):
        raise ConfigError(f"model.guidance_range must be [lowest, highest] with 0 <= lowest <= highest, "
                          f"got {list(m.guidance_range)}")
    for key, value in {"distill.start_steps": d.start_steps, "distill.end_steps": d.end_steps,
                       "distill.round_steps": d.round_steps, "distill.batch_size": d.batch_size}.items():
        if value < 1:
            raise ConfigError(f"{key} must be >= 1, got {value}")
    if d.first_stage_steps < 0:
        raise ConfigError(f"distill.first_stage_steps must be >= 0, got {d.first_stage_steps}")
    ratio = d.start_steps // d.end_steps
    if d.start_steps % d.end_steps or ratio < 2 or ratio & (ratio - 1):
        reachable = ", ".join(str(d.start_steps >> k) for k in range(1, d.start_steps.bit_length())
                              if d.start_steps % (1 << k) == 0)
        raise ConfigError(f"distill.end_steps ({d.end_steps}) is not reachable by halving distill.start_steps "
                          f"({d.start_steps}); reachable: {reachable or 'none (start_steps is odd)'}")
    _choice("distill.prediction", d.prediction, ("velocity", "image"))
    if not d.learning_rate > 0:
        raise ConfigError(f"distill.learning_rate must be > 0, got {d.learning_rate}")
    if d.grad_clip < 0:
        raise ConfigError(f"distill.grad_clip must be >= 0, got {d.grad_clip}")
    if not 0.0 <= d.ema_decay < 1.0:
        raise ConfigError(f"distill.ema_decay must be in [0, 1), got {d.ema_decay}")
    if not 0.0 <= d.guidance_min <= d.guidance_max:
        raise ConfigError(f"need 0 <= distill.guidance_min <= distill.guidance_max, got {d.guidance_min} and "
                          f"{d.guidance_max}")
    if not 0.0 <= d.label_dropout < 1.0:
        raise ConfigError(f"distill.label_dropout must be in [0, 1), got {d.label_dropout}")
