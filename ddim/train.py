"""Training: the train state, the jitted train/eval steps and the resumable loop.

``train(config, workdir)`` is the whole job; ``ddim train`` is a thin wrapper.
Interrupting it (Ctrl-C, SIGTERM, a crash) saves a checkpoint; running it again
continues from the latest checkpoint exactly as if it had never stopped: the
step's noise comes from ``fold_in(key, step)`` and the data order from
``(seed, epoch)`` (see :mod:`ddim.data`).
"""

from __future__ import annotations

import functools
import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

from ddim import data as data_lib
from ddim import parallel, runtime
from ddim.checkpoint import Checkpointer, checkpoint_dir, model_config_mismatch
from ddim.config import Config
from ddim.images import make_grid, save_png
from ddim.model import DiffusionModel, create_model, init_variables
from ddim.sampling import generate_images
from ddim.summary import Progress, SummaryWriter, Throughput, format_metrics


# Train steps dispatched but not yet finished: 2 keeps the device fed (the next step is
# already queued when one ends) while Ctrl-C and the progress bar lag by at most two steps.
MAX_STEPS_AHEAD = 2


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, incompatible checkpoint, ...)."""


class TrainState(train_state.TrainState):
    """Optimiser state plus BatchNorm statistics and the EMA copy used for sampling."""

    batch_stats: Any
    ema_params: Any
    ema_batch_stats: Any


def create_optimizer(config: Config) -> optax.GradientTransformation:
    t = config.train
    return optax.adamw(t.learning_rate, b1=0.9, b2=0.999, eps=t.adam_eps, weight_decay=t.weight_decay)


def create_train_state(config: Config, rng, model: DiffusionModel | None = None, mesh=None) -> TrainState:
    """A fresh state: initial parameters, AdamW, EMA weights equal to the parameters.

    The state is replicated over ``mesh`` (default: all devices).
    """
    model = model or create_model(config.model)
    init = jax.jit(functools.partial(init_variables, model))
    variables = runtime.compile_for_one_call(init, rng)(rng)
    params, batch_stats = variables["params"], variables["batch_stats"]
    state = TrainState.create(
        apply_fn=model.apply,
        params=params,
        tx=create_optimizer(config),
        batch_stats=batch_stats,
        # Copies, not aliases: the train step donates every buffer of the state.
        ema_params=jax.tree.map(jnp.copy, params),
        ema_batch_stats=jax.tree.map(jnp.copy, batch_stats),
    )
    # An array (not a Python int) so checkpoints restore it like every other leaf.
    state = state.replace(step=jnp.zeros((), jnp.int32))
    return parallel.replicate(state, mesh or parallel.data_mesh())


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


def mean_absolute_error(a, b):
    return jnp.mean(jnp.abs(a - b))


def train_step(state: TrainState, images, rng, ema_decay: float, ema_warmup: bool):
    """One AdamW step on the mean absolute error of the predicted noise.

    ``images`` are uint8 ``(B, H, W, C)``; ``rng`` is the run's base key, folded
    with the step so every step has its own noise whatever process runs it.
    Returns the new state and ``{"noise_loss", "image_loss"}``.
    """
    rng = jax.random.fold_in(rng, state.step)
    images = data_lib.to_float(images)

    def loss_fn(params):
        (noises, clean, pred_noises, pred_images), updates = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats}, images, rng, train=True, mutable=["batch_stats"]
        )
        return mean_absolute_error(noises, pred_noises), (mean_absolute_error(clean, pred_images), updates)

    (noise_loss, (image_loss, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    decay = ema_decay_at(state.step, ema_decay, ema_warmup)
    new_state = state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"])

    def ema(average, value):
        return jax.tree.map(lambda a, v: decay * a + (1.0 - decay) * v, average, value)

    new_state = new_state.replace(
        ema_params=ema(state.ema_params, new_state.params),
        ema_batch_stats=ema(state.ema_batch_stats, new_state.batch_stats),
    )
    return new_state, {"noise_loss": noise_loss, "image_loss": image_loss}


def eval_step(state: TrainState, images, rng):
    """Validation losses of the EMA model (BatchNorm in inference mode) on uint8 ``images``."""
    images = data_lib.to_float(images)
    variables = {"params": state.ema_params, "batch_stats": state.ema_batch_stats}
    noises, clean, pred_noises, pred_images = state.apply_fn(variables, images, rng, train=False)
    return {"noise_loss": mean_absolute_error(noises, pred_noises), "image_loss": mean_absolute_error(clean, pred_images)}


def compiled_steps(ema_decay: float, ema_warmup: bool, mesh=None):
    """Jitted train and eval steps over ``mesh`` (default: all devices).

    Inputs arrive replicated (state, key) and batch-sharded (images); outputs
    are pinned replicated, so XLA all-reduces gradients and BatchNorm
    statistics across devices. The train step donates the old state.
    """
    return _compiled_steps(ema_decay, ema_warmup, mesh or parallel.data_mesh())


@functools.cache
def _compiled_steps(ema_decay: float, ema_warmup: bool, mesh):
    replicated = parallel.replicated(mesh)
    step = jax.jit(
        functools.partial(train_step, ema_decay=ema_decay, ema_warmup=ema_warmup),
        donate_argnums=(0,),
        out_shardings=(replicated, replicated),
    )
    return step, jax.jit(eval_step, out_shardings=replicated)


def set_normalizer_stats(state: TrainState, mean, var) -> TrainState:
    """Set the image normaliser's statistics (live and EMA) to a dataset's mean and variance."""

    def replace(stats):
        stats = flax.core.unfreeze(stats)
        stats["normalizer"] = {"mean": jnp.asarray(mean, jnp.float32), "var": jnp.asarray(var, jnp.float32)}
        return stats

    return state.replace(batch_stats=replace(state.batch_stats), ema_batch_stats=replace(state.ema_batch_stats))


def image_statistics(batches) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and variance of uint8 image batches, as floats in [0, 1] units."""
    total, total_sq, count = 0.0, 0.0, 0
    for batch in batches:
        pixels = batch.reshape(-1, batch.shape[-1]).astype(np.float64) / 255.0
        total = total + pixels.sum(0)
        total_sq = total_sq + (pixels**2).sum(0)
        count += pixels.shape[0]
    mean = total / count
    return mean.astype(np.float32), np.maximum(total_sq / count - mean**2, 0.0).astype(np.float32)


def state_to_dict(state: TrainState) -> dict[str, Any]:
    return flax.serialization.to_state_dict(state)


def state_from_dict(template: TrainState, state_dict: dict[str, Any]) -> TrainState:
    return flax.serialization.from_state_dict(template, state_dict)


def restore_train_state(checkpointer: Checkpointer, step: int, template: TrainState) -> TrainState:
    """Restore ``step`` into the structure (and shapes) of ``template``."""
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        state_to_dict(template),
    )
    return state_from_dict(template, checkpointer.restore_state(step, target))


@dataclass
class TrainResult:
    """What a call of :func:`train` did."""

    state: TrainState
    start_step: int
    final_step: int
    interrupted: bool
    last_metrics: dict[str, float]


class _StopRequest:
    """Turns the first SIGINT/SIGTERM into a request to save and stop; a second SIGINT aborts."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self):
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: signals stay as they are
            self._previous = {}
        return self

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


def _fetch(pending: list[dict[str, Any]], step: int) -> dict[str, float]:
    """Bring the metrics of the pending steps to the host, averaged; fail on a non-finite loss."""
    if not pending:
        return {}
    values = parallel.to_host(pending)
    pending.clear()
    for offset, metrics in enumerate(values):
        if not all(np.isfinite(v) for v in metrics.values()):
            bad = step - len(values) + offset + 1
            raise TrainingError(f"non-finite loss at step {bad}: {format_metrics(metrics)}")
    return {name: float(np.mean([m[name] for m in values])) for name in values[0]}


def evaluate(state: TrainState, val_images, config: Config, rng) -> dict[str, float]:
    """Mean validation losses over the validation batches, with a fixed key per batch."""
    mesh = parallel.data_mesh()
    _, eval_fn = compiled_steps(config.train.ema_decay, config.train.ema_warmup, mesh)
    rows = parallel.process_slice(config.train.batch_size)
    results = [
        eval_fn(state, parallel.global_batch(batch[rows], mesh), jax.random.fold_in(rng, i))
        for i, batch in enumerate(data_lib.eval_batches(val_images, config))
    ]
    if not results:
        return {}
    results = parallel.to_host(results)
    return {name: float(np.mean([r[name] for r in results])) for name in results[0]}


def sample_grid(model: DiffusionModel, state: TrainState, config: Config, rng) -> np.ndarray:
    """A grid of EMA-model samples from a fixed key (so grids are comparable over training)."""
    t = config.train
    variables = {"params": state.ema_params, "batch_stats": state.ema_batch_stats}
    seed = int(jax.random.randint(rng, (), 0, 2**31 - 1))
    images = generate_images(model, variables, t.grid_rows * t.grid_cols, t.sample_steps, seed=seed)
    return make_grid(images, rows=t.grid_rows, cols=t.grid_cols)


def train(config: Config, workdir: str | Path, log=None, kid_extractor_factory=None) -> TrainResult:
    """Train (or resume training) ``config`` in ``workdir``; see the module docstring.

    ``log`` receives progress lines (default: the progress display);
    ``kid_extractor_factory(image_size)`` replaces InceptionV3 for the KID
    monitor (tests inject a small random network; the CLI never does).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t = config.train
    is_writer = jax.process_index() == 0

    train_images = data_lib.load_split(config, config.data.train_split)
    num_train = len(train_images)
    steps_per_epoch = data_lib.steps_per_epoch(config, num_train)
    total_steps = t.num_epochs * steps_per_epoch
    if t.max_steps:
        total_steps = min(total_steps, t.max_steps)
    val_images = data_lib.load_split(config, config.data.val_split) if t.eval_every else None

    mesh = parallel.data_mesh()
    parallel.check_batch_size(t.batch_size, mesh)
    rows = parallel.process_slice(t.batch_size)  # this process's part of every global batch
    model = create_model(config.model)
    base_rng = jax.random.key(t.seed)
    init_rng, train_rng, eval_rng, grid_rng = jax.random.split(base_rng, 4)
    state = create_train_state(config, init_rng, model, mesh)

    checkpointer = Checkpointer(checkpoint_dir(workdir), keep=t.keep_checkpoints)
    latest = checkpointer.latest_step()
    if latest is not None:
        mismatch = model_config_mismatch(checkpointer.restore_config(latest), config)
        if mismatch:
            checkpointer.close()
            raise TrainingError(f"cannot resume from {checkpointer.directory}: {mismatch}; use another --workdir")
        state = restore_train_state(checkpointer, latest, state)
    elif t.normalizer_batches:
        # Like Keras' Normalization.adapt(): start from the dataset's statistics, so even a short
        # run denormalises its samples correctly.
        first = data_lib.epoch_batches(train_images, config, epoch=0).take(t.normalizer_batches)
        state = parallel.replicate(set_normalizer_stats(state, *image_statistics(first.as_numpy_iterator())), mesh)
    start_step = int(state.step)

    progress = Progress(total_steps, start_step, description=config.name)
    say = log or progress.log
    say(
        f"{config.name}: {num_train} training images, {steps_per_epoch} steps/epoch, {total_steps} steps, "
        f"batch {t.batch_size}, workdir {workdir}"
        + (f"; resuming from step {start_step}" if latest is not None else "")
    )
    if start_step >= total_steps:
        progress.close()
        checkpointer.close()
        say(f"already trained for {start_step} steps (of {total_steps}); nothing to do")
        return TrainResult(state, start_step, start_step, False, {})

    writer = SummaryWriter(workdir / "tensorboard") if is_writer else None
    kid_monitor = KidMonitor.create(config, workdir, say, kid_extractor_factory, val_images)
    step_fn, _ = compiled_steps(t.ema_decay, t.ema_warmup, mesh)
    batches = data_lib.train_batches(train_images, config, start_step, steps_per_epoch)
    pending: list[dict[str, Any]] = []
    metrics: dict[str, float] = {}
    throughput = Throughput()
    step = start_step
    interrupted = False

    def save(at_step: int, at_state: TrainState) -> None:
        if checkpointer.latest_step() != at_step:
            checkpointer.save(at_step, state_to_dict(at_state), config)

    try:
        with _StopRequest() as stop:
            while step < total_steps:
                images = parallel.global_batch(next(batches)[rows], mesh)
                state, step_metrics = step_fn(state, images, train_rng)
                pending.append(step_metrics)
                # JAX dispatches asynchronously: unchecked, Python runs up to `log_every` steps ahead
                # of the device, so Ctrl-C would take minutes to be seen and the progress bar would
                # lie. Waiting (without a transfer to the host) for the step before last keeps the
                # device busy with one queued step and Python at most MAX_STEPS_AHEAD ahead; the
                # steps before the pending ones were finished by the last fetch.
                if len(pending) > MAX_STEPS_AHEAD:
                    jax.block_until_ready(pending[-MAX_STEPS_AHEAD - 1])
                step += 1
                throughput.add(t.batch_size)
                epoch_end = step % steps_per_epoch == 0
                checkpoint_due = step % t.checkpoint_every == 0 or epoch_end or step == total_steps
                if step % t.log_every == 0 or checkpoint_due or stop.requested:
                    # The only host sync of the loop; it also guards every save against NaNs.
                    metrics = _fetch(pending, step)
                    _log_metrics(progress, writer, say, config, step, total_steps, metrics, throughput.measure())
                if checkpoint_due or stop.requested:
                    save(step, state)
                epoch = step // steps_per_epoch
                eval_due = t.eval_every and ((epoch_end and epoch % t.eval_every == 0) or step == total_steps)
                if eval_due:  # every process computes (collectives); only process 0 writes
                    _end_of_epoch(model, state, config, val_images, eval_rng, grid_rng, workdir, writer, epoch, step,
                                  say, kid_monitor)
                    throughput.measure()  # evaluation time is not training throughput
                if stop.requested:
                    interrupted = True
                    say(f"stopped at step {step}; checkpoint saved, run the same command to resume")
                    break
    except TrainingError as error:
        checkpointer.close()
        last = checkpointer.latest_step()
        where = f"the last good checkpoint is step {last}" if last is not None else "no checkpoint was saved"
        raise TrainingError(f"{error}; {where} in {checkpointer.directory}") from None
    except BaseException:
        # A crash or a second Ctrl-C: save the newest state if it is intact and its losses are finite.
        try:
            if not _deleted(state):
                _fetch(pending, step)
                save(step, state)
        except Exception:  # nothing better to keep than the last periodic checkpoint
            pass
        finally:
            checkpointer.close()
        raise
    finally:
        if writer:
            writer.close()
        progress.close()
    checkpointer.close()
    return TrainResult(state, start_step, step, interrupted, metrics)


def _log_metrics(progress, writer, say, config, step, total_steps, metrics, rate):
    t = config.train
    status = f"{format_metrics(metrics)} {rate:.1f} img/s"
    progress.update(step, status)
    if writer:
        writer.scalars(step, {f"train/{k}": v for k, v in metrics.items()})
        decay = float(ema_decay_at(step - 1, t.ema_decay, t.ema_warmup))
        writer.scalars(step, {"train/images_per_second": rate, "train/ema_decay": decay})
    # On a terminal the bar shows every update; keep the scrollback to one line per 10 updates.
    if not progress.interactive or step % (t.log_every * 10) == 0:
        say(f"step {step}/{total_steps} {status}")


def _deleted(state: TrainState) -> bool:
    return any(getattr(x, "is_deleted", lambda: False)() for x in jax.tree.leaves(state))


class KidMonitor:
    """A cheap KID estimate at every evaluation, and the best-KID checkpoint in ``<workdir>/best``.

    KID is computed like the Keras example monitors it (InceptionV3 at 75x75,
    ``train.kid_images`` images of ``train.kid_steps`` DDIM steps, against the
    validation images). The best value so far is kept in ``best/best.json`` so
    a resumed run keeps comparing against it.
    """

    BEST_DIR = "best"

    def __init__(self, config: Config, workdir: Path, extractor, real_features: np.ndarray):
        self.config = config
        self.extractor = extractor
        self.real = real_features
        self.best_dir = workdir / self.BEST_DIR
        self.best_file = self.best_dir / "best.json"
        self.best = json.loads(self.best_file.read_text())["kid"] if self.best_file.is_file() else float("inf")

    @classmethod
    def create(cls, config: Config, workdir: Path, say, extractor_factory=None, val_images=None) -> "KidMonitor | None":
        """The monitor, or None (with a warning) when KID is off or InceptionV3 weights are missing."""
        t = config.train
        if not (t.kid_images and t.eval_every):
            return None
        from ddim import evaluation

        try:
            if extractor_factory is not None:
                extractor = extractor_factory(evaluation.KID_IMAGE_SIZE)
            else:
                extractor = evaluation.kid_feature_extractor(t.inception_weights or None, batch_size=t.batch_size)
            cache_dir = workdir / evaluation.CACHE_DIR
            cache_dir.mkdir(parents=True, exist_ok=True)
            (real,) = evaluation.real_features(config, "val", None, [extractor], cache_dir, images=val_images)
        except (evaluation.EvaluationError, data_lib.DataError) as error:
            say(f"warning: KID monitoring is off: {error}")
            return None
        return cls(config, workdir, extractor, real)

    def __call__(self, model, state: TrainState) -> dict[str, float]:
        from ddim import evaluation

        t = self.config.train
        variables = {"params": state.ema_params, "batch_stats": state.ema_batch_stats}
        mean, std = evaluation.cheap_kid(
            model, variables, self.real, self.extractor, num_images=t.kid_images, steps=t.kid_steps,
            seed=t.seed, batch_size=t.batch_size,
        )
        return {"kid": mean, "kid_std": std}

    def keep_if_best(self, kid: float, step: int, state: TrainState) -> bool:
        """Save ``state`` to ``best/`` when ``kid`` beats every earlier value."""
        if not self.config.train.keep_best or not kid < self.best:
            return False
        checkpointer = Checkpointer(self.best_dir, keep=1)
        if checkpointer.latest_step() != step:
            checkpointer.save(step, state_to_dict(state), self.config)
        checkpointer.close()
        self.best = kid
        if jax.process_index() == 0:
            self.best_file.write_text(json.dumps({"kid": kid, "step": step}) + "\n")
        return True


def _end_of_epoch(model, state, config, val_images, eval_rng, grid_rng, workdir, writer, epoch, step, say, kid=None):
    started = time.perf_counter()
    val = evaluate(state, val_images, config, eval_rng) if val_images is not None else {}
    grid = sample_grid(model, state, config, grid_rng)
    best = False
    if kid is not None:
        val.update(kid(model, state))
        best = kid.keep_if_best(val["kid"], step, state)
    if writer is None:  # not process 0: it took part in the computations, it writes nothing
        return
    grid_dir = workdir / "samples"
    grid_dir.mkdir(exist_ok=True)
    path = save_png(grid, grid_dir / f"step_{step:07d}.png")
    writer.scalars(step, {f"val/{k}": v for k, v in val.items()})
    writer.image(step, "samples", grid)
    writer.flush()
    say(
        f"epoch {epoch} (step {step}): val {format_metrics(val)}{' (best so far)' if best else ''}; "
        f"grid {path} ({time.perf_counter() - started:.1f}s)"
    )
