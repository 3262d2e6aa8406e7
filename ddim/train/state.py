"""The train state and the jitted steps: what one optimiser step does, with nothing around it.

``TrainState`` carries the parameters and AdamW state (flax's ``TrainState``),
the BatchNorm running statistics, and the exponential moving average (EMA) of
both that sampling uses. ``train_step``/``eval_step`` are pure functions of the
state, a batch and a key; :func:`compiled_steps` jits them over the device mesh.
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

from ddim import compilation, parallel
from ddim.checkpoint.ema import ema_variables as checkpoint_ema_variables
from ddim.config import Config, ConfigError
from ddim.model import DiffusionModel, init_variables
from ddim.objective import Objective
from ddim.train import init as init_lib


class TrainState(train_state.TrainState):
    """Optimiser state plus BatchNorm statistics and the EMA copy used for sampling."""

    batch_stats: Any
    ema_params: Any
    ema_batch_stats: Any


def ema_variables(state) -> dict[str, Any]:
    """The variables sampling uses: the EMA weights and their BatchNorm statistics.

    ``state`` is a :class:`TrainState` or its state dict (as restored from a checkpoint).
    """
    if isinstance(state, TrainState):
        return {"params": state.ema_params, "batch_stats": state.ema_batch_stats}
    return checkpoint_ema_variables(state)


def learning_rate(config: Config, total_steps: int | None = None):
    """The learning rate: a float (constant, the Keras example) or an optax schedule of the step.

    ``warmup_steps`` ramps linearly from 0 to ``learning_rate``; ``cosine`` then
    decays it to 0 at ``train.lr_decay_steps``, else at ``total_steps`` (the
    run's length), else at ``train.max_steps``, as ``optax.warmup_cosine_decay_schedule``. The constant rate without warm-up
    stays a float so that the optimiser state (and old checkpoints) keep their
    structure.
    """
    t = config.train
    if t.lr_schedule == "constant":
        if not t.warmup_steps:
            return t.learning_rate
        return optax.linear_schedule(0.0, t.learning_rate, t.warmup_steps)
    total_steps = t.lr_decay_steps or total_steps or t.max_steps
    if not total_steps:
        raise ConfigError("train.lr_schedule = 'cosine' needs the run's length: set train.max_steps")
    return optax.warmup_cosine_decay_schedule(
        0.0, t.learning_rate, t.warmup_steps, decay_steps=max(total_steps, t.warmup_steps + 1), end_value=0.0
    )


def create_optimizer(config: Config, total_steps: int | None = None) -> optax.GradientTransformation:
    """AdamW (Keras' epsilon) on :func:`learning_rate`, after clipping the gradient's global norm if asked to."""
    t = config.train
    adamw = optax.adamw(learning_rate(config, total_steps), b1=0.9, b2=0.999, eps=t.adam_eps,
                        weight_decay=t.weight_decay)
    if t.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(t.grad_clip), adamw)
    return adamw


def create_train_state(config: Config, rng, mesh=None, total_steps: int | None = None) -> TrainState:
    """A fresh state: initial parameters, AdamW, EMA weights equal to the parameters.

    The state is replicated over ``mesh`` (default: all devices); ``total_steps``
    is the run's length, which a decaying learning rate needs.
    """
    model = DiffusionModel(config.model)
    init = jax.jit(functools.partial(init_variables, model))
    variables = compilation.compile_for_one_call(init, rng)(rng)
    params, batch_stats = variables["params"], variables["batch_stats"]
    state = TrainState.create(
        apply_fn=model.apply,
        params=params,
        tx=create_optimizer(config, total_steps),
        batch_stats=batch_stats,
        # Copies, not aliases: the train step donates every buffer of the state.
        ema_params=jax.tree.map(jnp.copy, params),
        ema_batch_stats=jax.tree.map(jnp.copy, batch_stats),
    )
    # An array (not a Python int) so checkpoints restore it like every other leaf.
    state = state.replace(step=jnp.zeros((), jnp.int32))
    return parallel.replicate(state, mesh or parallel.data_mesh())


def with_variables(state: TrainState, variables: dict[str, Any]) -> TrainState:
    """``state`` with ``variables`` (``{"params", "batch_stats"}``) as its weights and their averages; the optimiser
    state is unchanged (a fresh one holds no trace of the weights: zero moments, step 0)."""
    params = jax.tree.map(jnp.asarray, variables["params"])
    batch_stats = jax.tree.map(jnp.asarray, variables["batch_stats"])
    return state.replace(params=params, batch_stats=batch_stats,
                         # Copies, not aliases: the train step donates every buffer of the state.
                         ema_params=jax.tree.map(jnp.copy, params), ema_batch_stats=jax.tree.map(jnp.copy, batch_stats))


def ema_decay_at(step, decay: float, warmup: bool):
    """EMA decay for the update after ``step`` optimiser steps.

    With warm-up the decay is ``min(decay, (1 + step) / (10 + step))``: the EMA
    follows the fast-moving early weights closely instead of staying near the
    (zero-output) initial network for thousands of steps.
    """
    if not warmup:
        return jnp.asarray(decay, jnp.float32)
    step = jnp.asarray(step, jnp.float32)
    return jnp.minimum(decay, (1.0 + step) / (10.0 + step))


def update_ema(state: TrainState, step, decay: float, warmup: bool) -> TrainState:
    """Move the EMA weights and statistics towards the state's current ones.

    ``ema <- decay * ema + (1 - decay) * value`` (``optax.incremental_update``),
    with the decay of :func:`ema_decay_at` for ``step``, the step the state
    was at before its latest update.
    """
    rate = 1.0 - ema_decay_at(step, decay, warmup)
    return state.replace(
        ema_params=optax.incremental_update(state.params, state.ema_params, rate),
        ema_batch_stats=optax.incremental_update(state.batch_stats, state.ema_batch_stats, rate),
    )


def to_float(images):
    """uint8 images -> float32 in [0, 1] (on the device, inside the jitted steps)."""
    return images.astype(jnp.float32) / 255.0


def class_condition(batch, rng, label_dropout: float | None):
    """The ``cond`` of a training batch: its labels, a ``label_dropout`` share of them replaced by the null
    class (-1; Ho & Salimans 2022, Algorithm 1); None for an unconditional model (``label_dropout`` None)."""
    if label_dropout is None:
        return None
    labels = batch["label"]
    dropped = jax.random.uniform(rng, labels.shape) < label_dropout
    return {"label": jnp.where(dropped, -1, labels)}


def train_step(state: TrainState, batch, rng, ema_decay: float, ema_warmup: bool,
               objective: Objective = Objective(), label_dropout: float | None = None,
               teacher: init_lib.SourceTeacher | None = None, source_variables=None):
    """One optimiser step on ``objective``'s loss, then the EMA update.

    ``batch`` is ``{"image": uint8 (B, H, W, C), "label": int32 (B,)}``; ``rng``
    is the run's base key, folded with the step so every step has its own
    noise (and dropout) whatever process runs it. Returns the new state and
    the metrics: ``noise_loss`` and ``image_loss`` (the MAE of the predicted
    noise and clean image, alike for every objective) and, when the objective
    is not the Keras example's noise MAE, the optimised ``loss``. A
    class-conditional model (``label_dropout`` not None) sees the batch's labels,
    some dropped to the null class. With a ``teacher`` (``init.targets = "source"``)
    the loss compares the output with the source's prediction at the same noisy
    input (:func:`ddim.train.init.source_targets`; ``source_variables`` are the
    source's); the noise and image losses still score against the data.
    """
    rng = jax.random.fold_in(rng, state.step)
    images = to_float(batch["image"])
    cond = class_condition(batch, jax.random.fold_in(rng, 2), label_dropout)

    def loss_fn(params):
        (noisy, outputs), updates = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats}, images, rng, train=True, cond=cond,
            mutable=["batch_stats"], rngs={"dropout": jax.random.fold_in(rng, 1)},
        )
        goal = noisy if teacher is None else init_lib.source_targets(teacher, source_variables, noisy, cond)
        return objective.loss_value(goal, outputs), (objective.metrics(noisy, outputs), updates)

    (loss, (metrics, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    new_state = state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"])
    new_state = update_ema(new_state, state.step, ema_decay, ema_warmup)
    if not objective.is_reference or teacher is not None:
        metrics = {**metrics, "loss": loss}
    return new_state, metrics


def eval_step(state: TrainState, batch, rng, objective: Objective = Objective(), conditional: bool = False):
    """Validation losses of the EMA model (BatchNorm in inference mode) on a batch (with its labels when
    ``conditional``)."""
    cond = {"label": batch["label"]} if conditional else None
    noisy, outputs = state.apply_fn(ema_variables(state), to_float(batch["image"]), rng, train=False, cond=cond)
    metrics = objective.metrics(noisy, outputs)
    if not objective.is_reference:
        metrics["loss"] = objective.loss_value(noisy, outputs)
    return metrics


def compiled_steps(config: Config, mesh=None, source: init_lib.SourceTargets | None = None):
    """Jitted train and eval steps of ``config``'s run over ``mesh`` (default: all devices).

    The EMA settings and the :class:`~ddim.objective.Objective` come from the
    config. Inputs arrive replicated (state, key) and batch-sharded (the batch);
    outputs are pinned replicated, so XLA all-reduces gradients and BatchNorm
    statistics across devices. The train step donates the old state. A run that
    learns from its source (``init.targets = "source"``) passes it as ``source``;
    its train step still takes ``(state, batch, rng)``.
    """
    t = config.train
    label_dropout = t.label_dropout if config.model.class_conditional else None
    step, evaluate = _compiled_steps(t.ema_decay, t.ema_warmup, Objective.of(config.model, config), label_dropout,
                                     mesh or parallel.data_mesh(), source.teacher if source is not None else None)
    if source is not None:
        # The source's weights are an argument, not a constant folded into the compiled step.
        step = functools.partial(step, source_variables=source.variables)
    return step, evaluate


@functools.cache
def _compiled_steps(ema_decay: float, ema_warmup: bool, objective: Objective, label_dropout, mesh, teacher=None):
    replicated = parallel.replicated(mesh)
    step = jax.jit(
        functools.partial(train_step, ema_decay=ema_decay, ema_warmup=ema_warmup, objective=objective,
                          label_dropout=label_dropout, teacher=teacher),
        donate_argnums=(0,),
        out_shardings=(replicated, replicated),
    )
    evaluate = functools.partial(eval_step, objective=objective, conditional=label_dropout is not None)
    return step, jax.jit(evaluate, out_shardings=replicated)


def set_normalizer_stats(state: TrainState, mean, var) -> TrainState:
    """Set the image normaliser's statistics (live and EMA) to a dataset's mean and variance."""

    def replace(stats):
        stats = flax.core.unfreeze(stats)
        stats["normalizer"] = {"mean": jnp.asarray(mean, jnp.float32), "var": jnp.asarray(var, jnp.float32)}
        return stats

    return state.replace(batch_stats=replace(state.batch_stats), ema_batch_stats=replace(state.ema_batch_stats))


def image_statistics(batches) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and variance of the uint8 images of batches, as floats in [0, 1] units."""
    total, total_sq, count = 0.0, 0.0, 0
    for batch in batches:
        images = batch["image"]
        pixels = images.reshape(-1, images.shape[-1]).astype(np.float64) / 255.0
        total = total + pixels.sum(0)
        total_sq = total_sq + (pixels**2).sum(0)
        count += pixels.shape[0]
    mean = total / count
    return mean.astype(np.float32), np.maximum(total_sq / count - mean**2, 0.0).astype(np.float32)


def state_to_dict(state: TrainState) -> dict[str, Any]:
    return flax.serialization.to_state_dict(state)


def state_from_dict(template: TrainState, state_dict: dict[str, Any]) -> TrainState:
    return flax.serialization.from_state_dict(template, state_dict)


def abstract_state_dict(template: TrainState) -> dict[str, Any]:
    """Shapes, dtypes and shardings of ``template`` as a state dict: the target of a restore."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        state_to_dict(template),
    )


def restore_train_state(checkpointer, step: int, template: TrainState) -> TrainState:
    """Restore ``step`` of a :class:`ddim.checkpoint.Checkpointer` into the structure, shapes and
    shardings of ``template``."""
    return state_from_dict(template, checkpointer.restore_state(step, abstract_state_dict(template)))
