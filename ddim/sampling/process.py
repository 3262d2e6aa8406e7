"""The reverse process and DDIM's tools as functions of a model and its variables (not methods of the network).

Each verb binds the model's ``denoise`` (:func:`ddim.model.bind_denoiser`) and
schedule to :func:`ddim.samplers.run`, the one loop every sampler, spacing and
tool shares. They are pure functions of arrays with the :class:`SamplingSpec`'s
``steps``, ``sampler`` and ``spacing`` static under ``jit``; ``cond`` is the
conditioning pytree handed to the network unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ddim import diffusion, samplers
from ddim.model import DiffusionModel, bind_denoiser, denormalize, normalize
from ddim.objective import noise_from_image
from ddim.spec import SamplingSpec


def time_grid(model: DiffusionModel, spec: SamplingSpec, start=1.0):
    """The evaluation times of ``spec``'s spacing for ``model``'s schedule (:func:`ddim.samplers.time_grid`)."""
    c = model.config
    return samplers.time_grid(spec.spacing, spec.steps, c.min_signal_rate, c.max_signal_rate, start)


def spec_denoiser(model: DiffusionModel, variables, spec: SamplingSpec):
    """``denoise(x, noise_rates, signal_rates, cond=None)``; with ``spec.clip`` its image prediction is clipped to
    the pixels' range, [0, 1] in the normaliser's units, with the noise the clipped image implies (DDPM's
    ``clip_denoised``)."""
    denoise = bind_denoiser(model, variables)
    if not spec.clip:
        return denoise
    ends = jnp.zeros((2, 1, 1, model.config.channels), jnp.float32).at[1].set(1.0)
    low, high = normalize(model, variables, ends)

    def clipped(noisy_images, noise_rates, signal_rates, cond=None):
        _, images = denoise(noisy_images, noise_rates, signal_rates, cond)
        images = jnp.clip(images, low, high)
        return noise_from_image(noisy_images, images, noise_rates, signal_rates), images

    return clipped


def reverse_process(model, variables, x, grid, spec: SamplingSpec, eta=0.0, rng=None, cond=None, hook=None,
                    keep_trajectory: bool = False) -> samplers.Result:
    """Run ``spec``'s sampler over ``grid`` from ``x`` (normalised units) in one compiled loop."""
    denoise = spec_denoiser(model, variables, spec)

    def call(noisy_images, noise_rates, signal_rates):
        return denoise(noisy_images, noise_rates, signal_rates, cond)

    return samplers.run(call, model.objective.schedule, x, grid, spec.sampler, eta=eta, rng=rng, hook=hook,
                        keep_trajectory=keep_trajectory)


def initial_noise(rng, num_images: int, image_shape):
    """The seeded starting noise of :func:`generate` and the key of its fresh noise: ``(noise, step_rng)``."""
    init_rng, step_rng = jax.random.split(rng)
    return jax.random.normal(init_rng, (num_images, *image_shape), jnp.float32), step_rng


def generate(model: DiffusionModel, variables, rng, num_images: int, spec: SamplingSpec, eta=None, latents=None,
             cond=None, keep_trajectory: bool = False):
    """Sample ``num_images`` images in [0, 1] with ``spec.steps`` network calls.

    The whole reverse process is one compiled loop; ``spec`` must be static
    under ``jit``, ``eta`` (default ``spec.eta``) may be traced so that changing
    it does not recompile. ``latents`` (normalised units, ``(N, H, W, C)``)
    replace the seeded noise. The sample is the last step's x_0 prediction, not
    the state after it: the schedule's cleanest level has signal rate
    ``max_signal_rate``, not 1 (see :mod:`ddim.samplers`). Returns float32
    ``(N, H, W, C)``, and with ``keep_trajectory`` also every step's data
    prediction, ``(S, N, H, W, C)``.
    """
    noise, step_rng = initial_noise(rng, num_images, model.image_shape)
    x = noise if latents is None else latents
    eta = spec.eta if eta is None else eta
    result = reverse_process(model, variables, x, time_grid(model, spec), spec, eta, step_rng, cond,
                             keep_trajectory=keep_trajectory)
    images = denormalize(model, variables, result.pred_images)
    if keep_trajectory:
        return images, denormalize(model, variables, result.trajectory)
    return images


def invert(model: DiffusionModel, variables, images, spec: SamplingSpec, cond=None, lift_iterations: int = 1):
    """Encode images in [0, 1] to the latents that :func:`generate` maps back to them (DDIM section 5.4).

    Deterministic DDIM (eta 0) run backwards, from the least noisy to the
    noisiest level of the grid that :func:`generate` walks with the same
    ``spec`` (steps and spacing): the Euler step of the probability-flow ODE
    (DDIM eq. 13) from ``t`` to the next, noisier ``t'``,
    ``x_t' = alpha_t' x0_theta(x_t, t) + sigma_t' eps_theta(x_t, t)``.
    :func:`generate` evaluates the network at the noisy end of each step,
    inversion at the clean end (the noisy state is what it is looking for);
    the two agree to first order in the step size, so reconstructions get
    closer as the steps grow.

    The first step lifts the clean image to the grid's last time ``t_L``.
    ``generate`` ends by returning ``x0_theta(x_{t_L}, t_L)``, so the lift
    looks for ``x = alpha x0 + sigma eps`` with ``eps = eps_theta(x, t_L)``
    (then ``x0_theta(x) = x0`` exactly), by ``lift_iterations`` fixed-point
    iterations from ``eps = 0``, each one network call (on the Flowers
    checkpoint of step 511, one iteration reconstructs 9-25% better than
    none, two are no better than one and four are worse). Returns float32
    latents ``(N, H, W, C)`` in the units of the initial noise.
    """
    denoise = spec_denoiser(model, variables, spec)
    clean = normalize(model, variables, images)
    grid = time_grid(model, spec)
    ones = jnp.ones((clean.shape[0], 1, 1, 1), jnp.float32)
    noise_rates, signal_rates = model.objective.schedule(ones * grid.times[-1])
    noises = jnp.zeros_like(clean)
    for _ in range(lift_iterations):
        noisy = diffusion.add_noise(clean, noises, noise_rates, signal_rates)
        noises, _ = denoise(noisy, noise_rates, signal_rates, cond)
    noisy = diffusion.add_noise(clean, noises, noise_rates, signal_rates)
    inversion = spec.replace(sampler="ddim", eta=0.0)
    return reverse_process(model, variables, noisy, grid.reversed(), inversion, cond=cond).x


def edit(model: DiffusionModel, variables, rng, images, strength, spec: SamplingSpec, eta=None, cond=None):
    """SDEdit (Meng et al. 2021): noise ``images`` in [0, 1] to time ``strength`` and run the reverse process.

    ``x_s = alpha_s x_0 + sigma_s eps`` (DDIM eq. 4) at ``s = strength`` in
    (0, 1] (traced, so changing it does not recompile), then ``spec.steps``
    network calls of ``spec``'s sampler on its grid from ``s`` down to the clean
    end. Low strengths keep the layout and colours, high ones keep less;
    ``eps`` comes from ``rng`` as in :func:`generate`. Returns float32 images in [0, 1].
    """
    clean = normalize(model, variables, images)
    noises, step_rng = initial_noise(rng, clean.shape[0], clean.shape[1:])
    ones = jnp.ones((clean.shape[0], 1, 1, 1), jnp.float32)
    noise_rates, signal_rates = model.objective.schedule(ones * strength)
    noisy = diffusion.add_noise(clean, noises, noise_rates, signal_rates)
    grid = time_grid(model, spec, start=strength)
    eta = spec.eta if eta is None else eta
    result = reverse_process(model, variables, noisy, grid, spec, eta, step_rng, cond)
    return denormalize(model, variables, result.pred_images)


def inpaint(model: DiffusionModel, variables, rng, images, masks, spec: SamplingSpec, eta=None, cond=None):
    """Fill the region where ``masks`` is 1 consistently with the rest of ``images`` (in [0, 1]).

    RePaint (Lugmayr et al. 2022) without resampling: before every network
    call the known region (``masks == 0``) of the state is replaced by the
    original noised to the current time, ``alpha_t x_0 + sigma_t eps``
    (DDIM eq. 4), with the same ``eps`` as the initial noise, so the known
    region follows exactly the trajectory the deterministic sampler would
    take for it. The result keeps the original pixels outside the mask.
    ``masks``: ``(N, H, W, 1)`` floats, 1 = fill. Returns float32 images in [0, 1].
    """
    clean = normalize(model, variables, images)
    noises, step_rng = initial_noise(rng, clean.shape[0], clean.shape[1:])

    def keep_known_region(step, x, rates):
        known = diffusion.add_noise(clean, noises, rates.noise, rates.signal)
        return masks * x + (1.0 - masks) * known

    eta = spec.eta if eta is None else eta
    result = reverse_process(model, variables, noises, time_grid(model, spec), spec, eta, step_rng, cond,
                             hook=keep_known_region)
    return masks * denormalize(model, variables, result.pred_images) + (1.0 - masks) * images
