"""The DDIM network: a BatchNorm image normaliser and a noise-predicting UNet.

The architecture is the one of the Keras example "Denoising Diffusion Implicit
Models" (A. Béres): residual blocks without normalisation scale/offset, average
pooling down, bilinear upsampling up, a sinusoidal embedding of the noise
variance broadcast over the image, and a zero-initialised output convolution so
the untrained network predicts zero noise.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ddim import diffusion, ops, samplers
from ddim.config import ModelConfig

# Keras' Conv2D default initialiser; kept so training starts where the reference starts.
_glorot_uniform = nn.initializers.glorot_uniform()


def sinusoidal_embedding(noise_variances, embedding_dims: int, min_frequency: float, max_frequency: float):
    """Sin/cos features of ``noise_variances`` (shape ``(B, 1, 1, 1)``) at log-spaced frequencies.

    Returns ``(B, 1, 1, embedding_dims)``: ``embedding_dims // 2`` frequencies
    between ``min_frequency`` and ``max_frequency``, as in the Transformer's
    positional encoding (and the Keras DDIM example).
    """
    frequencies = jnp.exp(
        jnp.linspace(math.log(min_frequency), math.log(max_frequency), embedding_dims // 2, dtype=jnp.float32)
    )
    angular_speeds = 2.0 * math.pi * frequencies
    return jnp.concatenate(
        [jnp.sin(angular_speeds * noise_variances), jnp.cos(angular_speeds * noise_variances)], axis=-1
    )


def compute_dtype(config: ModelConfig):
    """The network's compute dtype (parameters and outputs stay float32)."""
    return jnp.dtype(config.dtype)


class Conv(nn.Module):
    """A stride-1 'SAME' convolution with a bias (the parameters of ``nn.Conv``).

    The arithmetic is :func:`ddim.ops.conv2d`, which picks the fastest formulation
    on the current backend; parameters stay float32 and the computation runs in
    ``dtype``.
    """

    features: int
    kernel_size: int
    dtype: Any = jnp.float32
    kernel_init: Any = _glorot_uniform

    @nn.compact
    def __call__(self, x):
        kernel = self.param(
            "kernel", self.kernel_init, (self.kernel_size, self.kernel_size, x.shape[-1], self.features), jnp.float32
        )
        bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
        x, kernel, bias = x.astype(self.dtype), kernel.astype(self.dtype), bias.astype(self.dtype)
        return ops.conv2d(x, kernel) + bias


def _norm(train: bool, dtype) -> nn.BatchNorm:
    # Keras' BatchNormalization(center=False, scale=False): momentum 0.99, epsilon 1e-3.
    return nn.BatchNorm(
        use_running_average=not train, use_bias=False, use_scale=False, momentum=0.99, epsilon=1e-3, dtype=dtype
    )


class ResidualBlock(nn.Module):
    """BN -> 3x3 conv -> swish -> 3x3 conv, plus the input (through a 1x1 conv when widths differ)."""

    width: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        residual = x if x.shape[-1] == self.width else Conv(self.width, 1, self.dtype, name="skip")(x)
        x = _norm(train, self.dtype)(x)
        x = nn.swish(Conv(self.width, 3, self.dtype)(x))
        x = Conv(self.width, 3, self.dtype)(x)
        return x + residual


class UNet(nn.Module):
    """Predicts the noise in ``noisy_images`` given the noise variance of each image.

    Every hyperparameter comes from ``config`` (a :class:`ddim.config.ModelConfig`).
    """

    config: ModelConfig

    @nn.compact
    def __call__(self, noisy_images, noise_variances, train: bool):
        c, dtype = self.config, compute_dtype(self.config)
        batch, height, width, _ = noisy_images.shape
        embedding = sinusoidal_embedding(
            noise_variances, c.embedding_dims, c.embedding_min_frequency, c.embedding_max_frequency
        )
        # Keras upsamples the 1x1 embedding to the image size with nearest-neighbour: a broadcast.
        embedding = jnp.broadcast_to(embedding, (batch, height, width, c.embedding_dims))
        x = Conv(c.widths[0], 1, dtype, name="stem")(noisy_images)
        x = jnp.concatenate([x, embedding.astype(x.dtype)], axis=-1)

        skips = []
        for level_width in c.widths[:-1]:
            for _ in range(c.block_depth):
                x = ResidualBlock(level_width, dtype)(x, train)
                skips.append(x)
            x = ops.average_pool_2x(x)
        for _ in range(c.block_depth):
            x = ResidualBlock(c.widths[-1], dtype)(x, train)
        for level_width in reversed(c.widths[:-1]):
            x = ops.upsample_bilinear_2x(x)
            for _ in range(c.block_depth):
                x = jnp.concatenate([x, skips.pop()], axis=-1)
                x = ResidualBlock(level_width, dtype)(x, train)
        # Zero-initialised so the untrained model predicts zero noise (the identity denoiser).
        x = Conv(noisy_images.shape[-1], 1, dtype, kernel_init=nn.initializers.zeros, name="head")(x)
        return x.astype(jnp.float32)


class DiffusionModel(nn.Module):
    """Normaliser + UNet + the DDIM schedule: training forward pass and sampler.

    ``__call__`` is the training/evaluation forward pass; :meth:`generate` runs
    the reverse diffusion. Images enter and leave in [0, 1]. Everything the
    model is (network shape, schedule, compute dtype) is ``config``, a
    :class:`ddim.config.ModelConfig`, so a checkpoint's stored config rebuilds it.

    The normaliser is a ``BatchNorm`` without scale or offset, a per-channel
    standardisation, and it is meant to work like one: in training mode it
    standardises each batch with that batch's own mean and variance and moves
    its running statistics towards them (momentum 0.99); in inference mode
    (evaluation, sampling) it uses the running statistics, and
    :meth:`denormalize` maps generated images back with them. This differs on
    purpose from the Keras example, whose ``Normalization`` layer is fixed after
    ``adapt()``: batch statistics keep the training input exactly standardised
    whatever the batch. The running statistics start at the dataset's mean and
    variance (``train.normalizer_batches``, like ``adapt()``) and track them
    from there, so sampling always denormalises with the data's statistics
    (tests/test_model.py checks both).
    """

    config: ModelConfig

    def setup(self):
        # No scale/offset: a pure per-channel standardisation with invertible running stats.
        self.normalizer = nn.BatchNorm(use_bias=False, use_scale=False, momentum=0.99, epsilon=1e-3)
        self.network = UNet(self.config)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(H, W, C)`` of the images the model trains on and generates."""
        return (self.config.image_size, self.config.image_size, self.config.channels)

    def schedule(self, diffusion_times):
        return diffusion.cosine_schedule(diffusion_times, self.config.min_signal_rate, self.config.max_signal_rate)

    def denoise(self, noisy_images, noise_rates, signal_rates, train: bool):
        """Predict (noises, images) from noisy images at known rates (DDIM eq. 12's x_0 estimate)."""
        pred_noises = self.network(noisy_images, noise_rates**2, train)
        pred_images = diffusion.predict_images(noisy_images, pred_noises, noise_rates, signal_rates)
        return pred_noises, pred_images

    def normalize(self, images, train: bool):
        return self.normalizer(images, use_running_average=not train)

    def denormalize(self, images):
        """Invert the normaliser with its running statistics and clip to [0, 1]."""
        stats = self.normalizer.variables["batch_stats"]
        images = stats["mean"] + images * jnp.sqrt(stats["var"] + self.normalizer.epsilon)
        return jnp.clip(images, 0.0, 1.0)

    def __call__(self, images, rng, train: bool = True):
        """Noise ``images`` (in [0, 1]) at random times and predict the noise back.

        Returns ``(noises, normalized_images, pred_noises, pred_images)``; the
        training loss compares the first and third, the image loss the second
        and fourth.
        """
        images = self.normalize(images, train)
        noise_rng, time_rng = jax.random.split(rng)
        noises = jax.random.normal(noise_rng, images.shape, jnp.float32)
        noise_rates, signal_rates = self.schedule(diffusion.sample_diffusion_times(time_rng, images.shape[0]))
        noisy_images = diffusion.add_noise(images, noises, noise_rates, signal_rates)
        pred_noises, pred_images = self.denoise(noisy_images, noise_rates, signal_rates, train)
        return noises, images, pred_noises, pred_images

    def reverse_process(
        self,
        x,
        grid: "samplers.TimeGrid | samplers.UniformGrid",
        sampler: str = "ddim",
        eta=0.0,
        rng=None,
        hook=None,
        keep_trajectory: bool = False,
    ) -> samplers.Result:
        """Run ``sampler`` over ``grid`` from ``x`` (normalised units) in one ``nn.while_loop``.

        The loop and its arguments are :func:`ddim.samplers.run`'s; this binds the
        network (in inference mode) and the model's schedule to it.
        """

        def denoise(module, noisy_images, noise_rates, signal_rates):
            return module.denoise(noisy_images, noise_rates, signal_rates, train=False)

        def loop(cond, body, init):
            return nn.while_loop(cond, body, self, init)

        return samplers.run(
            denoise, self.schedule, x, grid, sampler, eta=eta, rng=rng, hook=hook,
            keep_trajectory=keep_trajectory, loop=loop,
        )

    def time_grid(self, steps: int, spacing: str = "uniform", start=1.0):
        """The evaluation times of ``spacing`` for this model's schedule (:func:`ddim.samplers.time_grid`)."""
        return samplers.time_grid(spacing, steps, self.config.min_signal_rate, self.config.max_signal_rate, start)

    def generate(
        self,
        rng,
        num_images: int,
        diffusion_steps: int,
        eta: float = 0.0,
        initial_noise=None,
        sampler: str = "ddim",
        spacing: str = "uniform",
        keep_trajectory: bool = False,
    ):
        """Sample ``num_images`` images in [0, 1] with ``diffusion_steps`` network calls.

        Runs the whole reverse process in one compiled loop (``nn.while_loop``);
        ``diffusion_steps``, ``sampler`` and ``spacing`` must be static under
        ``jit``. ``sampler`` is one of :data:`ddim.samplers.SAMPLERS`, ``spacing``
        one of :data:`ddim.samplers.SPACINGS`. ``eta`` scales the fresh noise of
        each DDIM step (DDIM eq. 16): 0 is deterministic DDIM, 1 is DDPM-like
        ancestral sampling; the DPM-Solver++ samplers are deterministic and ignore
        it. ``initial_noise`` (normalised units, ``(N, H, W, C)``) replaces the
        seeded noise. Returns float32 ``(N, H, W, C)``, and with
        ``keep_trajectory`` also the data prediction of every step, ``(S, N, H, W, C)``.
        """
        if diffusion_steps < 1:
            raise ValueError(f"diffusion_steps must be >= 1, got {diffusion_steps}")
        samplers.get_sampler(sampler)
        shape = (num_images, *self.image_shape)
        init_rng, step_rng = jax.random.split(rng)
        if initial_noise is None:
            initial_noise = jax.random.normal(init_rng, shape, jnp.float32)
        grid = self.time_grid(diffusion_steps, spacing)
        # The sample is the last step's x_0 prediction, not the state after it: the schedule's
        # cleanest level has signal rate max_signal_rate, not 1 (see ddim/samplers.py).
        result = self.reverse_process(initial_noise, grid, sampler, eta, step_rng, keep_trajectory=keep_trajectory)
        images = self.denormalize(result.pred_images)
        if keep_trajectory:
            return images, self.denormalize(result.trajectory)
        return images


    def invert(self, images, diffusion_steps: int, spacing: str = "uniform", lift_iterations: int = 1):
        """Encode images in [0, 1] to the latents that :meth:`generate` maps back to them (DDIM section 5.4).

        Deterministic DDIM (eta 0) run backwards, from the least noisy to the
        noisiest level of the ``spacing`` grid that :meth:`generate` walks with
        the same ``diffusion_steps``: the Euler step of the probability-flow ODE
        (DDIM eq. 13) from ``t`` to the next, noisier ``t'``,
        ``x_t' = alpha_t' x0_theta(x_t, t) + sigma_t' eps_theta(x_t, t)``.
        :meth:`generate` evaluates the network at the noisy end of each step,
        inversion at the clean end (the noisy state is what it is looking for);
        the two agree to first order in the step size, so reconstructions get
        closer as ``diffusion_steps`` grows.

        The first step lifts the clean image to the grid's last time ``t_L``.
        ``generate`` ends by returning ``x0_theta(x_{t_L}, t_L)``, so the lift
        looks for ``x = alpha x0 + sigma eps`` with ``eps = eps_theta(x, t_L)``
        (then ``x0_theta(x) = x0`` exactly), by ``lift_iterations`` fixed-point
        iterations from ``eps = 0``, each one network call (on the Flowers
        checkpoint of step 511, one iteration reconstructs 9-25% better than
        none, two are no better than one and four are worse). Returns float32
        latents ``(N, H, W, C)`` in the units of the initial noise.
        """
        if diffusion_steps < 1:
            raise ValueError(f"diffusion_steps must be >= 1, got {diffusion_steps}")
        clean = self.normalize(images, train=False)
        grid = self.time_grid(diffusion_steps, spacing)
        ones = jnp.ones((clean.shape[0], 1, 1, 1), jnp.float32)
        noise_rates, signal_rates = self.schedule(ones * grid.times[-1])
        noises = jnp.zeros_like(clean)
        for _ in range(lift_iterations):
            noisy = diffusion.add_noise(clean, noises, noise_rates, signal_rates)
            noises, _ = self.denoise(noisy, noise_rates, signal_rates, train=False)
        noisy = diffusion.add_noise(clean, noises, noise_rates, signal_rates)
        return self.reverse_process(noisy, grid.reversed(), "ddim").x

    def edit(
        self,
        rng,
        images,
        strength,
        diffusion_steps: int,
        eta=0.0,
        sampler: str = "ddim",
        spacing: str = "uniform",
    ):
        """SDEdit (Meng et al. 2021): noise ``images`` in [0, 1] to time ``strength`` and run the reverse process.

        ``x_s = alpha_s x_0 + sigma_s eps`` (DDIM eq. 4) at ``s = strength`` in
        (0, 1] (traced, so changing it does not recompile), then
        ``diffusion_steps`` network calls of ``sampler`` on the ``spacing`` grid
        from ``s`` down to the clean end. Low strengths keep the layout and
        colours, high ones keep less; ``eps`` comes from ``rng`` as in
        :meth:`generate`. Returns float32 images in [0, 1].
        """
        if diffusion_steps < 1:
            raise ValueError(f"diffusion_steps must be >= 1, got {diffusion_steps}")
        clean = self.normalize(images, train=False)
        init_rng, step_rng = jax.random.split(rng)
        noises = jax.random.normal(init_rng, clean.shape, jnp.float32)
        ones = jnp.ones((clean.shape[0], 1, 1, 1), jnp.float32)
        noise_rates, signal_rates = self.schedule(ones * strength)
        noisy = diffusion.add_noise(clean, noises, noise_rates, signal_rates)
        grid = self.time_grid(diffusion_steps, spacing, start=strength)
        return self.denormalize(self.reverse_process(noisy, grid, sampler, eta, step_rng).pred_images)

    def inpaint(
        self,
        rng,
        images,
        masks,
        diffusion_steps: int,
        eta=0.0,
        sampler: str = "ddim",
        spacing: str = "uniform",
    ):
        """Fill the region where ``masks`` is 1 consistently with the rest of ``images`` (in [0, 1]).

        RePaint (Lugmayr et al. 2022) without resampling: before every network
        call the known region (``masks == 0``) of the state is replaced by the
        original noised to the current time, ``alpha_t x_0 + sigma_t eps``
        (DDIM eq. 4), with the same ``eps`` as the initial noise, so the known
        region follows exactly the trajectory the deterministic sampler would
        take for it. The result keeps the original pixels outside the mask.
        ``masks``: ``(N, H, W, 1)`` floats, 1 = fill. Returns float32 images in [0, 1].
        """
        if diffusion_steps < 1:
            raise ValueError(f"diffusion_steps must be >= 1, got {diffusion_steps}")
        clean = self.normalize(images, train=False)
        init_rng, step_rng = jax.random.split(rng)
        noises = jax.random.normal(init_rng, clean.shape, jnp.float32)

        def keep_known_region(step, x, rates):
            known = diffusion.add_noise(clean, noises, rates.noise, rates.signal)
            return masks * x + (1.0 - masks) * known

        grid = self.time_grid(diffusion_steps, spacing)
        result = self.reverse_process(noises, grid, sampler, eta, step_rng, hook=keep_known_region)
        return masks * self.denormalize(result.pred_images) + (1.0 - masks) * images


def init_variables(model: DiffusionModel, rng):
    """Initial ``{"params", "batch_stats"}`` of ``model`` (shapes only depend on the model)."""
    images = jnp.zeros((1, *model.image_shape), jnp.float32)
    return model.init(rng, images, rng, train=True)
