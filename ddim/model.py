"""The DDIM model: a BatchNorm image normaliser, the denoising network and its objective.

:class:`DiffusionModel` is what a checkpoint stores and what every verb runs:
``__call__`` is the training forward pass, :meth:`DiffusionModel.denoise`
the ``(noise, image)`` prediction the samplers build on
(:mod:`ddim.sampling.process` runs the reverse process over it). The network
is :mod:`ddim.nn`'s UNet; what it predicts and how it is trained is
:mod:`ddim.objective`'s.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from ddim.config import ModelConfig
from ddim.nn import ResidualBlock, UNet, compute_dtype, sinusoidal_embedding
from ddim.objective import Objective

__all__ = ["DiffusionModel", "ResidualBlock", "UNet", "compute_dtype", "init_variables", "sinusoidal_embedding"]


class DiffusionModel(nn.Module):
    """Normaliser + UNet + objective (schedule and prediction target). Images enter and leave in [0, 1].

    Everything the model is (network shape, schedule, prediction target,
    compute dtype) is ``config``, a :class:`ddim.config.ModelConfig`, so a
    checkpoint's stored config rebuilds it.

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

    @property
    def objective(self) -> Objective:
        """The schedule and prediction target of this model (the training loss is the run's; see ``train_step``)."""
        return Objective.of(self.config)

    def schedule(self, diffusion_times):
        """``t -> (noise_rates, signal_rates)``."""
        return self.objective.schedule(diffusion_times)

    def denoise(self, noisy_images, noise_rates, signal_rates, train: bool = False, cond=None):
        """Predict ``(noises, images)`` from noisy images at known rates (DDIM eq. 12's x_0 estimate).

        ``cond`` is the conditioning pytree the verbs carry: ``"label"`` (class
        ids, ``(B,)``) for a class-conditional network, optionally with
        ``"label_to"`` and ``"label_mix"`` (a mix of two classes, as
        :class:`ddim.nn.ClassEmbedding` reads them), and ``"guidance"``
        (``(B,)`` scales) for classifier-free guidance, :func:`guided_outputs`,
        or, for a distilled student with ``guidance_input``, the network's own
        input (one pass; Meng et al. 2023).
        """
        if cond is not None and "guidance" in cond and not self.config.guidance_input:
            outputs = self.guided_outputs(noisy_images, noise_rates, cond)
        else:
            outputs = self.network(noisy_images, noise_rates**2, train, cond)
        return self.objective.predictions(outputs, noisy_images, noise_rates, signal_rates)

    def guided_outputs(self, noisy_images, noise_rates, cond):
        """Classifier-free guidance (Ho & Salimans 2022, eq. 6) in one network call on a doubled batch.

        The conditional and the unconditional (null-class) outputs come from one
        call on ``[x, x]`` with labels ``[y, null]`` (as DiT); then
        ``c + (s - 1) (c - u)``, which is ``u + s (c - u)`` written so that
        ``s = 1`` gives the conditional output exactly and ``s = 0`` the
        unconditional one. Both predictions are affine in the output with the
        same coefficients, so guiding the output guides the noise and the image.
        A mix of two classes (``"label_to"``, ``"label_mix"``) is the
        conditional half's; the unconditional half is the null class alone.
        """
        doubled = jnp.concatenate([noisy_images, noisy_images])
        both = self.network(doubled, jnp.concatenate([noise_rates, noise_rates]) ** 2, False, with_null_class(cond))
        conditional, unconditional = jnp.split(both, 2)
        scale = jnp.asarray(cond["guidance"], jnp.float32).reshape(-1, 1, 1, 1)
        return conditional + (scale - 1.0) * (conditional - unconditional)

    def normalize(self, images, train: bool = False):
        return self.normalizer(images, use_running_average=not train)

    def denormalize(self, images):
        """Invert the normaliser with its running statistics and clip to [0, 1]."""
        stats = self.normalizer.variables["batch_stats"]
        images = stats["mean"] + images * jnp.sqrt(stats["var"] + self.normalizer.epsilon)
        return jnp.clip(images, 0.0, 1.0)

    def __call__(self, images, rng, train: bool = True, cond=None):
        """Noise ``images`` (in [0, 1]) at random times and run the network on them.

        Returns ``(batch, outputs)``: the :class:`ddim.objective.NoisyBatch`
        (normalised clean images, noise, rates, noisy images) and the network's
        raw outputs, which :meth:`ddim.objective.Objective.loss_value` scores.
        """
        images = self.normalize(images, train)
        batch = self.objective.noisy_batch(rng, images)
        outputs = self.network(batch.noisy_images, batch.noise_rates**2, train, cond)
        return batch, outputs


def with_null_class(cond):
    """The class part of ``cond`` for the doubled batch of guidance: its classes, then the null class (-1)."""
    doubled = {"label": jnp.concatenate([cond["label"], jnp.full_like(cond["label"], -1)])}
    if "label_to" in cond:
        doubled["label_to"] = jnp.concatenate([cond["label_to"], jnp.full_like(cond["label_to"], -1)])
        # Weight 0 on the null half: exactly the null vector, (1 - 0) e_null + 0 e_null.
        doubled["label_mix"] = jnp.concatenate([cond["label_mix"], jnp.zeros_like(cond["label_mix"])])
    return doubled


def init_variables(model: DiffusionModel, rng):
    """Initial ``{"params", "batch_stats"}`` of ``model`` (shapes only depend on the model)."""
    images = jnp.zeros((1, *model.image_shape), jnp.float32)
    # The same key for parameters and dropout: the parameters are those of init(rng) either way.
    return model.init({"params": rng, "dropout": rng}, images, rng, train=True)


def bind_denoiser(model: DiffusionModel, variables):
    """``denoise(x, noise_rates, signal_rates, cond=None) -> (pred_noises, pred_images)`` in inference mode."""

    def denoise(noisy_images, noise_rates, signal_rates, cond=None):
        return model.apply(variables, noisy_images, noise_rates, signal_rates, False, cond, method=DiffusionModel.denoise)

    return denoise


def normalize(model: DiffusionModel, variables, images):
    """``images`` in [0, 1] in the model's normalised units (running statistics)."""
    return model.apply(variables, images, method=DiffusionModel.normalize)


def denormalize(model: DiffusionModel, variables, images):
    """Normalised ``images`` back to [0, 1] (clipped)."""
    return model.apply(variables, images, method=DiffusionModel.denormalize)

