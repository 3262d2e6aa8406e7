"""DDIM's sampler loop exactly as it was before the samplers of ddim/samplers.py (frozen, for a bit-identity test).

Do not edit: tests/test_samplers.py checks that the default path (``ddim``,
``uniform``) still gives the same bits as this code.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from ddim import diffusion
from ddim.model import DiffusionModel


class LegacyDiffusionModel(DiffusionModel):
    def legacy_generate(self, rng, num_images: int, diffusion_steps: int, eta: float = 0.0, initial_noise=None):
        shape = (num_images, *self.image_shape)
        init_rng, step_rng = jax.random.split(rng)
        if initial_noise is None:
            initial_noise = jax.random.normal(init_rng, shape, jnp.float32)
        ones = jnp.ones((num_images, 1, 1, 1), jnp.float32)

        def body(mdl, carry):
            step, noisy_images, _ = carry
            times, next_times = diffusion.reverse_diffusion_times(step, diffusion_steps)
            noise_rates, signal_rates = mdl.schedule(ones * times)
            pred_noises, pred_images = mdl.denoise(noisy_images, noise_rates, signal_rates, train=False)
            next_noise_rates, next_signal_rates = mdl.schedule(ones * next_times)
            sigma = diffusion.ddim_sigma(noise_rates, signal_rates, next_noise_rates, next_signal_rates, eta)
            fresh_noise = jax.random.normal(jax.random.fold_in(step_rng, step), shape, jnp.float32)
            next_images = diffusion.ddim_step(
                pred_images, pred_noises, next_noise_rates, next_signal_rates, sigma, fresh_noise
            )
            return step + 1, next_images, pred_images

        def not_done(mdl, carry):
            return carry[0] < diffusion_steps

        carry = (jnp.zeros((), jnp.int32), initial_noise, initial_noise)
        _, _, images = nn.while_loop(not_done, body, self, carry)
        return self.denormalize(images)
