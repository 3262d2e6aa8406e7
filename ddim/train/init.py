"""Fine-tuning: a run that starts from a trained model's weights (``ddim train --init SOURCE``).

The source is a bundled model (``pretrained:NAME``), a run's work directory or a checkpoint step directory,
read as sampling reads it (:func:`ddim.pretrained.registry.load_source`). The run:

- takes its network's shape from the source (:func:`with_source_model`): the config may change what keeps the
  weights meaningful (the data and classes, ``model.prediction``, dropout, the compute dtype, and every
  ``[train]`` value: optimiser, schedule, batch size, averaging); any other model difference is a
  :class:`~ddim.config.ConfigError` naming the field and both values, raised before anything is written;
- starts from the source's averaged (EMA) weights, the ones it samples with, with a fresh optimiser at step 0
  (:func:`initial_variables`), its classes matched by name (:func:`class_table`);
- records the source, its step and its weights' SHA-256 in ``[init]``, so every checkpoint and a bundle
  exported from it say where it came from;
- with ``init.targets = "source"``, learns the source's own predictions instead of the data's targets
  (:func:`source_targets`): the source runs inside every train step, reloaded (and its digest checked) on resume.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ddim import parallel
from ddim.config import Config, ConfigError, ModelConfig, config_values, from_dict
from ddim.config.parsing import plain
from ddim.errors import UserError

TUNABLE = frozenset({"prediction", "dropout", "dtype", "class_conditional", "num_classes", "class_names",
                     "class_counts"})
"""The ``[model]`` fields a fine-tune may change: none changes a parameter's shape or what the noise levels mean
(the classes change the class table's rows, which :func:`class_table` maps by name)."""
CLASSES = ("num_classes", "class_names", "class_counts")
"""Set from the new data when training starts, never taken from the source."""
CLASS_TABLE = ("network", "classes", "table", "embedding")
"""Where a class-conditional network keeps its class vectors, one row per class and the null class last."""


FINE_TUNE_CONFIGS = {32: "finetune32", 64: "finetune64"}
"""The packaged config a fine-tune with no ``--config`` takes, by the source's image size, and the run's name
(any other size: ``finetune32``'s settings, which name no size, in a run named ``<source name>-finetune``): the
length, learning rate, warm-up and reporting suited to a fine-tune, everything else from the source."""
OBJECTIVE = ("loss", "loss_weighting", "snr_gamma", "p2_k", "p2_gamma")
"""The ``[train]`` keys that say what the source's network was trained to minimise: a fine-tune keeps the
source's unless its config sets them."""


def load_run_config(path=None, overrides: list[str] | None = None, init: str | None = None) -> Config:
    """A run's config from a TOML file (or a packaged config's name) and overrides, as
    :func:`ddim.config.load_config`; with a source (``init``, or ``init.source`` in the file or overrides) the
    network's shape and loss come from the source (:func:`with_source_model`), and with no file the packaged
    fine-tune settings for the source's size (:data:`FINE_TUNE_CONFIGS`). What ``ddim train``, ``ddim data`` and
    ``ddim.train.finetune`` read."""
    overrides = list(overrides or []) + ([f"init.source={_toml_string(init)}"] if init else [])
    values = config_values(path, overrides)
    source = (values.get("init") or {}).get("source") if isinstance(values.get("init"), dict) else None
    if not source:
        return from_dict(values)
    source_config = load_source_config(source)
    if path is None:  # ``values`` are the overrides alone
        size = source_config.model.image_size
        preset = config_values(FINE_TUNE_CONFIGS.get(size, FINE_TUNE_CONFIGS[32]), overrides)
        if size not in FINE_TUNE_CONFIGS and "name" not in values:
            del preset["name"]  # not finetune32's: the run is <source name>-finetune (with_source_model)
        values = preset
    return from_dict(with_source_model(values, source_config))


def _toml_string(text: str) -> str:
    import json

    return json.dumps(str(text))


def load_source_config(source: str) -> Config:
    """The config of the model ``source`` names, its weights read and checked (a bundled model's SHA-256, a
    checkpoint's integrity): a missing or damaged source is one ``error:`` line before anything is written."""
    return load_source(source).config


def load_source(source: str):
    """The source's :class:`~ddim.checkpoint.LoadedCheckpoint` (config, EMA variables, step, path)."""
    from ddim.pretrained.registry import load_source as load

    loaded = load(source)
    model = loaded.config.model
    if model.distilled_steps or model.guidance_input:
        teacher = f" ({model.distilled_from})" if model.distilled_from else ""
        raise UserError(f"{source} is a distilled student ({model.distilled_steps} steps): fine-tune the diffusion "
                        f"model it was distilled from{teacher} instead")
    return loaded


def with_source_model(values: dict[str, Any], source: Config) -> dict[str, Any]:
    """``values`` (a config's nested values) with the source's ``[model]`` under the keys the user set, and its
    loss (:data:`OBJECTIVE`) where the user set none.

    A key the user set that the source fixes (its shape, schedule, embedding layout) must equal the source's,
    else :class:`ConfigError` naming it and both values. Without a name the run is ``<source name>-finetune``.
    """
    values = dict(values)
    user = dict(values.get("model") or {})
    theirs = plain(dataclasses.asdict(source.model))
    fixed = set(theirs) - TUNABLE
    if not source.model.class_conditional:
        fixed.discard("class_embedding")  # an unconditional source has none: the fine-tune may choose its own
    for key in sorted(fixed & set(user)):
        if plain(user[key]) != theirs[key]:
            raise ConfigError(f"model.{key} is {plain(user[key])!r} in this config but {theirs[key]!r} in the source "
                              f"model {source.name}: a fine-tune keeps its source's network (it may change "
                              f"{', '.join(sorted(f'model.{k}' for k in TUNABLE - set(CLASSES)))}, the classes, "
                              "the data and [train])")
    model = {key: value for key, value in theirs.items() if key not in CLASSES}
    model.update(user)
    values["model"] = model
    train = dict(values.get("train") or {})
    for key in OBJECTIVE:
        train.setdefault(key, getattr(source.train, key))
    values["train"] = train
    values.setdefault("name", f"{source.name}-finetune")
    return values


def check_fits_source(config: Config, source: Config) -> None:
    """``config``'s network must be the source's (:data:`TUNABLE` aside): one :class:`ConfigError` naming the
    first field that differs, for a config built in Python rather than by :func:`load_run_config`."""
    with_source_model({"model": plain(dataclasses.asdict(config.model))}, source)


def with_source_record(config: Config, loaded) -> Config:
    """``config`` with the source's step and weights' SHA-256 filled in ``[init]``."""
    init = dataclasses.replace(config.init, source_step=int(loaded.step or 0), source_sha256=weights_sha256(loaded))
    return dataclasses.replace(config, init=init)


def weights_sha256(loaded) -> str:
    """The SHA-256 of a source's weights: a bundled model's file digest (``ddim pretrained`` shows it); for a
    checkpoint, of its EMA variables written as a bundle's safetensors would hold them (no metadata)."""
    from ddim.pretrained.bundle import MANIFEST, flatten, read_manifest

    if (loaded.path / MANIFEST).is_file():
        return read_manifest(loaded.path).sha256
    from safetensors.numpy import save

    tensors = {key: np.ascontiguousarray(np.asarray(value)) for key, value in flatten(loaded.variables).items()}
    return hashlib.sha256(save(tensors)).hexdigest()


def class_table(source: ModelConfig, target: ModelConfig, table: np.ndarray | None, fresh: np.ndarray,
                new_classes: str) -> np.ndarray:
    """The fine-tune's class vectors: a row per ``target`` class, matched to the source's by name, then the null.

    ``table`` is the source's (None for an unconditional source, whose null vector is zero: adding it changes
    nothing, so every class starts as the source's unconditional prediction); ``fresh`` is the fine-tune's
    random initialisation, of the target's shape. A class the source does not know starts as ``new_classes``
    says (:class:`ddim.config.InitConfig`)."""
    features = fresh.shape[1]
    if table is None:
        null, known = np.zeros((features,), fresh.dtype), {}
        mean = null
    else:
        null = table[-1]
        known = {name: table[row] for row, name in enumerate(_names(source))}
        mean = table[:-1].mean(axis=0) if len(table) > 1 else null
    rows = []
    for row, name in enumerate(_names(target)):
        if name in known:
            rows.append(known[name])
        else:
            rows.append({"null": null, "mean": mean, "random": fresh[row]}[new_classes])
    return np.stack([*rows, null]).astype(fresh.dtype)


def initial_variables(config: Config, loaded, fresh: dict[str, Any]) -> dict[str, Any]:
    """The fine-tune's first ``{"params", "batch_stats"}``: the source's EMA variables in the structure of
    ``fresh`` (the run's own random initialisation), the class table mapped by name."""
    from flax import traverse_util

    source_flat = traverse_util.flatten_dict(_numpy(loaded.variables))
    fresh_flat = traverse_util.flatten_dict(_numpy(fresh))
    table_key = ("params", *CLASS_TABLE)
    result = {}
    for key, value in fresh_flat.items():
        if key == table_key:
            result[key] = class_table(loaded.config.model, config.model, source_flat.get(key), value,
                                      config.init.new_classes)
        elif key in source_flat and source_flat[key].shape == value.shape:
            result[key] = source_flat[key].astype(value.dtype)
        else:  # with_source_model makes this unreachable for configs it built
            raise ConfigError(f"the source's weights have no {'/'.join(key)} of shape {value.shape}: its network "
                              "is not this config's")
    return traverse_util.unflatten_dict(result)


def _numpy(tree):
    return jax.tree.map(np.asarray, tree)


def describe(config: Config) -> str:
    """The log line of a fine-tune's start."""
    i = config.init
    targets = "; targets: the source's own predictions" if i.targets == "source" else ""
    return (f"init: fine-tuning from {i.source} (its step {i.source_step}, weights sha256 {i.source_sha256[:16]}...; "
            f"normaliser: {i.normalizer}, new classes: {i.new_classes}{targets})")


@dataclass(frozen=True)
class SourceTeacher:
    """What a train step needs to know, at trace time, to run the source (``init.targets = "source"``)."""

    model: ModelConfig
    """The source's network and what it predicts."""
    label_rows: tuple[int, ...] | None
    """The source's class row of each of the run's classes, matched by name (-1: a class the source does not
    know, taught by its null class); None for an unconditional source."""


class SourceTargets(NamedTuple):
    """The source of a run that learns from it: its :class:`SourceTeacher` and its (replicated) EMA variables."""

    teacher: SourceTeacher
    variables: Any


def label_rows(source: ModelConfig, run: ModelConfig) -> tuple[int, ...] | None:
    """:attr:`SourceTeacher.label_rows`: the source's row of each run class by name (() when the run has none)."""
    if not source.class_conditional:
        return None
    if not run.class_conditional:
        return ()
    rows = {name: row for row, name in enumerate(_names(source))}
    return tuple(rows.get(name, -1) for name in _names(run))


def _names(model: ModelConfig) -> tuple[str, ...]:
    return model.class_names or tuple(str(i) for i in range(model.num_classes))


def source_condition(teacher: SourceTeacher, cond, batch_size: int):
    """The source's ``cond`` for a batch the run conditions on ``cond``: the same classes as the source numbers
    them, the null class (-1) where the run's label is the null class or a class the source does not know."""
    if teacher.label_rows is None:
        return None
    if cond is None or not teacher.label_rows:
        return {"label": jnp.full((batch_size,), -1, jnp.int32)}
    labels = cond["label"]
    rows = jnp.asarray(teacher.label_rows, jnp.int32)[jnp.maximum(labels, 0)]
    return {"label": jnp.where(labels < 0, -1, rows)}


def source_targets(teacher: SourceTeacher, variables, batch, cond):
    """``batch`` (a :class:`ddim.objective.NoisyBatch`) with the source's predicted clean images and noise in place
    of the true ones, so that the run's :meth:`~ddim.objective.Objective.loss_value` scores its output against the
    source's prediction at the same noisy input, converted to the run's ``model.prediction``.

    The source runs as it samples (inference mode: its BatchNorm running statistics, no dropout) on the run's
    normalised noisy images; its predicted pair satisfies ``x_t = alpha x_0 + sigma eps`` exactly, so the velocity
    it implies, ``alpha eps - sigma x_0`` (Salimans & Ho 2022, section 4), is the velocity that makes a velocity
    network sample as the source does (the self-distillation of a change of parameterisation).
    """
    from ddim.model import DiffusionModel

    cond = source_condition(teacher, cond, batch.noisy_images.shape[0])
    noises, images = DiffusionModel(teacher.model).apply(
        variables, batch.noisy_images, batch.noise_rates, batch.signal_rates, False, cond,
        method=DiffusionModel.denoise)
    return batch._replace(images=jax.lax.stop_gradient(images), noises=jax.lax.stop_gradient(noises))


def teacher_source(config: Config, loaded, mesh, check_digest: bool = False) -> SourceTargets:
    """The :class:`SourceTargets` of a run with ``init.targets = "source"``, from its loaded source, its variables
    replicated over ``mesh``. On resume (``check_digest``) the source must still be the one the run started from:
    its SHA-256 is the record's."""
    if check_digest:
        digest = weights_sha256(loaded)
        if digest != config.init.source_sha256:
            raise UserError(f"the source model {config.init.source} is not the one this run started from (weights "
                            f"sha256 {digest[:16]}..., the run's record says {config.init.source_sha256[:16]}...): "
                            'with init.targets = "source" it teaches every step; restore it or start a new run')
    teacher = SourceTeacher(loaded.config.model, label_rows(loaded.config.model, config.model))
    return SourceTargets(teacher, parallel.replicate(loaded.variables, mesh))
