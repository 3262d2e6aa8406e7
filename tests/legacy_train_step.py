"""The training step exactly as it was before ddim/objective.py (frozen, for a bit-identity test).

Do not edit: tests/test_recipe.py checks that the default objective (noise
prediction, MAE, no weighting) still trains to the same bits as this code.
"""

import jax
import jax.numpy as jnp

from ddim import diffusion
from ddim.model import DiffusionModel


class LegacyDiffusionModel(DiffusionModel):
    def __call__(self, images, rng, train: bool = True, cond=None):
        images = self.normalize(images, train)
        noise_rng, time_rng = jax.random.split(rng)
        noises = jax.random.normal(noise_rng, images.shape, jnp.float32)
        noise_rates, signal_rates = self.schedule(diffusion.sample_diffusion_times(time_rng, images.shape[0]))
        noisy_images = diffusion.add_noise(images, noises, noise_rates, signal_rates)
        pred_noises, pred_images = self.denoise(noisy_images, noise_rates, signal_rates, train)
        return noises, images, pred_noises, pred_images


def mean_absolute_error(a, b):
    return jnp.mean(jnp.abs(a - b))


def legacy_train_step(state, images, rng, ema_decay: float, ema_warmup: bool, update_ema):
    rng = jax.random.fold_in(rng, state.step)
    images = images.astype(jnp.float32) / 255.0

    def loss_fn(params):
        (noises, clean, pred_noises, pred_images), updates = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats}, images, rng, train=True, mutable=["batch_stats"]
        )
        return mean_absolute_error(noises, pred_noises), (mean_absolute_error(clean, pred_images), updates)

    (noise_loss, (image_loss, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    new_state = state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"])
    new_state = update_ema(new_state, state.step, ema_decay, ema_warmup)
    return new_state, {"noise_loss": noise_loss, "image_loss": image_loss}
