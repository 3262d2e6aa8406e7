"""The training objective, apart from the network: what it predicts, and the loss it is trained with.

An :class:`Objective` holds the noise schedule, the *prediction target* of the
network, the conversion of the network's output to the ``(noise, image)``
pair every sampler and tool works with, and the per-example loss with its
weighting. :mod:`ddim.model` calls :meth:`Objective.predictions` in its
``denoise``; the train step calls :meth:`Objective.loss`. The maths are pure
functions below, each citing where it comes from.

Notation: ``alpha`` is the signal rate, ``sigma`` the noise rate
(``alpha^2 + sigma^2 = 1``), ``x_t = alpha x_0 + sigma eps`` (DDIM eq. 4) and
``SNR = alpha^2 / sigma^2``. With this project's cosine schedule (signal rate
0.02 to 0.95) the SNR only spans about 0.0004 (t = 1) to 9.3 (t = 0).

Prediction targets (guided-diffusion's ``ModelMeanType``, diffusers' ``prediction_type``):

- ``noise``: the network predicts ``eps`` (DDPM, DDIM; the Keras example).
- ``velocity``: the network predicts ``v = alpha eps - sigma x_0`` (Salimans &
  Ho 2022, "Progressive distillation", section 4 and appendix D). Then
  ``x_0 = alpha x_t - sigma v`` and ``eps = sigma x_t + alpha v``: both stay
  well-conditioned at every noise level, where ``x_0`` from ``eps`` divides by
  ``alpha``.
- ``image``: the network predicts ``x_0`` itself (Salimans & Ho 2022, section 4;
  their distillation code's ``mean_type = "x"``); ``eps = (x_t - alpha x_0) / sigma``.
  Distilled students use it or ``velocity``.

Losses and weightings. Every weighting is written as a weight ``w(SNR)`` of the
squared error of the *clean image*; a target's own squared error is a fixed
multiple of it, ``|eps - eps_hat|^2 = SNR |x_0 - x_0_hat|^2`` and
``|v - v_hat|^2 = (SNR + 1) |x_0 - x_0_hat|^2``, so the weight applied to the
target's error is ``w(SNR) / SNR`` or ``w(SNR) / (SNR + 1)``:

- ``none``: the target's plain error (``w = SNR`` for noise, ``SNR + 1`` for velocity).
- ``min-snr``: ``w = min(SNR, gamma)`` (Hang et al. 2023, "Efficient diffusion
  training via Min-SNR weighting", eq. 7-9; diffusers' ``snr_gamma``). Over this
  schedule with ``gamma = 5`` it leaves noise prediction untouched below SNR 5
  (t above about 0.08) and halves the weight of the cleanest levels; for
  velocity it scales the noisiest levels down by ``SNR / (SNR + 1)``, to 0.0004.
- ``p2``: the noise loss weighted by ``1 / (k + SNR)^gamma`` (Choi et al. 2022,
  "Perception prioritized training", eq. 8), i.e. ``w = SNR / (k + SNR)^gamma``:
  with ``k = 1, gamma = 1`` the noise loss of the cleanest levels gets 0.097 of
  the weight of the noisiest, which sit at 1.

With ``loss = "mae"`` the weights apply to absolute errors, which scale with the
square root of the factors above, so the MAE weight is the square root of the
MSE weight: the weighted MAE is ``sqrt(w)`` times the clean image's MAE just as
the weighted MSE is ``w`` times its MSE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ddim import diffusion
from ddim.config import Config, ModelConfig


def snr(noise_rates, signal_rates):
    """Signal-to-noise ratio ``alpha^2 / sigma^2`` (Kingma et al. 2021, eq. 2)."""
    return signal_rates**2 / noise_rates**2


def velocity(images, noises, noise_rates, signal_rates):
    """The velocity target ``v = alpha eps - sigma x_0`` (Salimans & Ho 2022, eq. in section 4)."""
    return signal_rates * noises - noise_rates * images


def noise_and_image_from_velocity(noisy_images, pred_velocities, noise_rates, signal_rates):
    """``(eps, x_0)`` from a velocity: ``eps = sigma x_t + alpha v``, ``x_0 = alpha x_t - sigma v``."""
    pred_noises = noise_rates * noisy_images + signal_rates * pred_velocities
    pred_images = signal_rates * noisy_images - noise_rates * pred_velocities
    return pred_noises, pred_images


def noise_from_image(noisy_images, pred_images, noise_rates, signal_rates):
    """``eps = (x_t - alpha x_0) / sigma``: the noise that an image prediction implies (DDIM eq. 4 solved for eps)."""
    return (noisy_images - signal_rates * pred_images) / noise_rates


def clean_image_weight(weighting: str, snrs, snr_gamma: float = 5.0, p2_k: float = 1.0, p2_gamma: float = 1.0):
    """``w(SNR)``: the weight of the clean image's squared error under ``weighting`` (module docstring)."""
    if weighting == "min-snr":
        return jnp.minimum(snrs, snr_gamma)
    if weighting == "p2":
        return snrs / (p2_k + snrs) ** p2_gamma
    raise ValueError(f"no clean-image weight for weighting {weighting!r}")


def target_factor(prediction: str, snrs):
    """How many times the clean image's squared error the target's squared error is (module docstring)."""
    if prediction == "image":
        return jnp.ones_like(snrs)
    return snrs if prediction == "noise" else snrs + 1.0


class NoisyBatch(NamedTuple):
    """One training batch noised at random times: the clean (normalised) images, the noise, the rates and ``x_t``."""

    images: jax.Array
    noises: jax.Array
    noise_rates: jax.Array
    signal_rates: jax.Array
    noisy_images: jax.Array


@dataclass(frozen=True)
class Objective:
    """The schedule, the prediction target and the training loss of a diffusion model (module docstring)."""

    min_signal_rate: float = 0.02
    """Signal rate at diffusion time 1 (the cosine schedule's noisiest level)."""
    max_signal_rate: float = 0.95
    """Signal rate at diffusion time 0 (the cosine schedule's cleanest level)."""
    prediction: str = "noise"
    """What the network predicts: "noise", "velocity" or "image"."""
    loss: str = "mae"
    """"mae" or "mse" of the prediction target."""
    weighting: str = "none"
    """"none", "min-snr" or "p2": the per-example weight of the loss."""
    snr_gamma: float = 5.0
    """min-snr's clip of the SNR (Hang et al. use 5)."""
    p2_k: float = 1.0
    """p2's k (Choi et al. use 1)."""
    p2_gamma: float = 1.0
    """p2's exponent gamma (Choi et al. use 0.5 or 1)."""

    @classmethod
    def of(cls, model: ModelConfig, config: Config | None = None) -> "Objective":
        """The objective of a model config and, for training, of a run's ``train`` section."""
        fields = dict(min_signal_rate=model.min_signal_rate, max_signal_rate=model.max_signal_rate,
                      prediction=model.prediction)
        if config is not None:
            t = config.train
            fields.update(loss=t.loss, weighting=t.loss_weighting, snr_gamma=t.snr_gamma, p2_k=t.p2_k,
                          p2_gamma=t.p2_gamma)
        return cls(**fields)

    @property
    def is_reference(self) -> bool:
        """Whether this is the Keras example's objective: the plain MAE of the predicted noise."""
        return (self.prediction, self.loss, self.weighting) == ("noise", "mae", "none")

    def schedule(self, diffusion_times):
        """``t -> (noise_rates, signal_rates)``: the continuous cosine schedule."""
        return diffusion.cosine_schedule(diffusion_times, self.min_signal_rate, self.max_signal_rate)

    def noisy_batch(self, rng, images) -> NoisyBatch:
        """Noise ``images`` at uniform random times (DDIM eq. 4); the key split is the Keras example's order."""
        noise_rng, time_rng = jax.random.split(rng)
        noises = jax.random.normal(noise_rng, images.shape, jnp.float32)
        noise_rates, signal_rates = self.schedule(diffusion.sample_diffusion_times(time_rng, images.shape[0]))
        noisy = diffusion.add_noise(images, noises, noise_rates, signal_rates)
        return NoisyBatch(images, noises, noise_rates, signal_rates, noisy)

    def predictions(self, outputs, noisy_images, noise_rates, signal_rates):
        """The network's ``outputs`` as ``(pred_noises, pred_images)``, the pair every sampler uses."""
        if self.prediction == "velocity":
            return noise_and_image_from_velocity(noisy_images, outputs, noise_rates, signal_rates)
        if self.prediction == "image":
            return noise_from_image(noisy_images, outputs, noise_rates, signal_rates), outputs
        return outputs, diffusion.predict_images(noisy_images, outputs, noise_rates, signal_rates)

    def target(self, batch: NoisyBatch):
        """What the network should output for ``batch``."""
        if self.prediction == "velocity":
            return velocity(batch.images, batch.noises, batch.noise_rates, batch.signal_rates)
        if self.prediction == "image":
            return batch.images
        return batch.noises

    def example_weights(self, noise_rates, signal_rates):
        """Per-example weights of the target's loss, ``(B, 1, 1, 1)``, or None for ``weighting = "none"``."""
        if self.weighting == "none":
            return None
        snrs = snr(noise_rates, signal_rates)
        weights = clean_image_weight(self.weighting, snrs, self.snr_gamma, self.p2_k, self.p2_gamma)
        weights = weights / target_factor(self.prediction, snrs)
        return jnp.sqrt(weights) if self.loss == "mae" else weights

    def loss_value(self, batch: NoisyBatch, outputs):
        """The training loss of the network's ``outputs`` on ``batch``: the weighted mean error of the target.

        A mean over every pixel of the weighted errors, which equals the batch
        mean of the weighted per-example means; without a weighting it is the
        plain mean, the same computation as the Keras example's loss, bit for bit.
        """
        errors = outputs - self.target(batch)
        errors = jnp.abs(errors) if self.loss == "mae" else jnp.square(errors)
        weights = self.example_weights(batch.noise_rates, batch.signal_rates)
        return jnp.mean(errors if weights is None else weights * errors)

    def metrics(self, batch: NoisyBatch, outputs) -> dict[str, jax.Array]:
        """The losses every recipe reports alike: MAE of the predicted noise and of the predicted clean image."""
        pred_noises, pred_images = self.predictions(outputs, batch.noisy_images, batch.noise_rates, batch.signal_rates)
        return {
            "noise_loss": jnp.mean(jnp.abs(batch.noises - pred_noises)),
            "image_loss": jnp.mean(jnp.abs(batch.images - pred_images)),
        }
