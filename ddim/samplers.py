"""Samplers of the reverse process and the time grids they walk, as pure functions.

Every sampler here but ``consistency`` solves the same *probability-flow ODE* of the diffusion
(DDIM eq. 13, the ODE form of deterministic DDIM; Song et al. 2021, eq. 13),
written for this project's continuous cosine schedule
(:func:`ddim.diffusion.cosine_schedule`): at diffusion time ``t`` the signal
rate ``alpha_t`` and noise rate ``sigma_t`` satisfy ``alpha^2 + sigma^2 = 1``
and the log signal-to-noise ratio is ``lambda_t = log(alpha_t / sigma_t)``.
In the variable ``lambda`` the exact solution from ``s`` to ``t`` is
(Lu et al. 2022, "DPM-Solver++", eq. 8)::

    x_t = (sigma_t / sigma_s) x_s + sigma_t * integral_{lambda_s}^{lambda_t} e^lambda x0_theta(x_lambda) dlambda

A sampler approximates the integral from the network's data (x0) predictions:

- ``ddim``: the data prediction held constant over the step, which is exactly
  DDIM's update (DDIM eq. 12 with ``sigma = 0``; with ``eta > 0`` it adds the
  fresh noise of eq. 16 and is no longer an ODE solver). First order.
- ``dpmpp-2m``: DPM-Solver++(2M) (Lu et al. 2022, Algorithm 2): the data
  prediction extrapolated linearly in ``lambda`` from the current and the
  previous step's prediction. Second order, no extra network calls; its first
  step (no history yet) is the first-order update.
- ``dpmpp-3m``: the third-order multistep update of the same family (Lu et al.
  2022, appendix; the ``multistep_dpm_solver_third_update`` of their code),
  from the last three predictions; the first two steps fall back to orders 1
  and 2.
- ``consistency``: for a consistency student only (``ddim distill --method
  consistency``), whose data prediction is already the end of its teacher's
  ODE: the next state is that prediction noised afresh to the next time
  (multistep consistency sampling, Song et al. 2023, Algorithm 1). Not an
  ODE solver; it draws fresh noise at every step.

**Time grids and the clean end.** ``steps`` is the number of network calls. A
spacing gives the ``steps`` diffusion times where the network is evaluated, from
``t = 1`` (almost pure noise) downwards; the solver integrates the ODE across
them and the sample is the *data prediction at the last one*. The schedule
never reaches a clean image: at ``t = 0`` the signal rate is
``max_signal_rate`` (0.95, a noise rate of 0.31), the least noisy level the
network was trained on, so returning the ODE state there would leave visible
noise. The step from the last evaluated time to the data itself
(``sigma = 0``, ``lambda = +inf``) is, for every sampler, the first-order
update with an infinite log-SNR step, which reduces exactly to that data
prediction (a higher-order correction has no meaning across an infinite
step). So ``steps`` calls give ``steps - 1`` ODE steps plus that final
denoising step.

- ``uniform`` (the default, DDIM's original grid): ``t_i = 1 - i / steps``,
  ``i = 0 .. steps - 1``; the last call is at ``t = 1/steps``, so the final
  denoising step also covers ``[0, 1/steps]``.
- ``logsnr``: uniform in ``lambda`` from ``t = 1`` to ``t = 0`` inclusive (the
  spacing DPM-Solver++ recommends).
- ``karras``: Karras et al. 2022 (EDM) eq. 5 with ``rho = 7`` on the
  variance-exploding noise level ``sigma_t / alpha_t = e^{-lambda}``, from
  ``t = 1`` to ``t = 0`` inclusive: between uniform in that noise level
  (``rho = 1``) and uniform in log-SNR (``rho -> inf``), with shorter steps
  than ``logsnr`` at the noisy end and longer ones at the clean end.

:func:`run` is the one loop every sampler, spacing and tool shares: any grid
(towards the data for sampling and editing, towards the noise for inversion),
an optional per-step hook (inpainting), and optionally every step's data
prediction (the trajectory).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from ddim import diffusion, spec

SPACINGS = tuple(spec.SPACINGS)
KARRAS_RHO = 7.0


class Rates(NamedTuple):
    """The schedule at one time, shaped to broadcast over the images: noise and signal rates."""

    noise: jax.Array
    signal: jax.Array

    @property
    def log_snr(self):
        """``lambda = log(alpha / sigma)``."""
        return jnp.log(self.signal) - jnp.log(self.noise)


class TimeGrid(NamedTuple):
    """Where the network is evaluated (``times``) and where each step lands (``next_times``), both ``(S,)``."""

    times: jax.Array
    next_times: jax.Array

    @property
    def num_steps(self) -> int:
        return self.times.shape[0]

    def at(self, step):
        """``(time, next_time)`` of step ``step`` (traced)."""
        return self.times[step], self.next_times[step]

    def reversed(self) -> "TimeGrid":
        """The same times walked towards the noise (inversion): from the last time back to the first.

        Step ``i`` of the result evaluates the network at ``times[-1 - i]`` and lands
        on ``times[-2 - i]``; there are ``S - 1`` steps.
        """
        backwards = self.times[::-1]
        return TimeGrid(backwards[:-1], backwards[1:])


class UniformGrid(NamedTuple):
    """DDIM's uniform grid, ``t_i = start (1 - i/S)`` landing on ``t_i - start/S``, computed inside the loop.

    From ``start = 1`` it is computed exactly as DDIM's sampler always computed
    it (:func:`ddim.diffusion.reverse_diffusion_times` of the step index), so the
    default sampler gives bit-identical pixels: XLA fuses the in-loop arithmetic
    into the schedule, and a precomputed array of the same times would round
    differently by an ulp.
    """

    steps: int
    start: Any = 1.0

    @property
    def num_steps(self) -> int:
        return self.steps

    def _from_one(self) -> bool:
        return isinstance(self.start, (int, float)) and self.start == 1.0

    def at(self, step):
        if self._from_one():
            return diffusion.reverse_diffusion_times(step, self.steps)
        step_size = 1.0 / self.steps
        times = self.start * (1.0 - step * step_size)
        return times, times - self.start * step_size

    @property
    def times(self):
        return self.at(jnp.arange(self.steps, dtype=jnp.int32))[0]

    @property
    def next_times(self):
        return self.at(jnp.arange(self.steps, dtype=jnp.int32))[1]

    def reversed(self) -> TimeGrid:
        return TimeGrid(self.times, self.next_times).reversed()


def _check_name(kind: str, name: str, valid) -> None:
    if not isinstance(name, str) or name not in valid:
        raise ValueError(f"unknown {kind} {name!r} (choose from {', '.join(valid)})")


def check_spacing(name: str) -> str:
    """``name`` if it is a known spacing, else a ``ValueError`` listing them."""
    _check_name("spacing", name, SPACINGS)
    return name


def time_grid(
    spacing: str, steps: int, min_signal_rate: float, max_signal_rate: float, start=1.0
) -> TimeGrid | UniformGrid:
    """The ``steps`` evaluation times of ``spacing`` from ``start`` (1 = pure noise) down to the clean end.

    ``start`` in (0, 1] may be traced (image-to-image editing starts part way);
    ``steps`` must be a Python int. ``uniform`` lands each step ``start/steps``
    lower, its last time is ``start/steps``; ``logsnr`` and ``karras`` end
    exactly at ``t = 0``, and their last step lands where it starts (the
    sample is the data prediction there, see the module docstring).
    """
    check_spacing(spacing)
    if steps < 1:
        raise ValueError(f"the number of diffusion steps must be >= 1, got {steps}")
    if spacing == "uniform":
        return UniformGrid(steps, start)
    index = jnp.arange(steps, dtype=jnp.int32)
    # The other spacings include both ends: a fraction 0 .. 1 of the way from start to t = 0.
    fraction = index / max(steps - 1, 1)
    start_lambda = Rates(*diffusion.cosine_schedule(start, min_signal_rate, max_signal_rate)).log_snr
    end_lambda = Rates(*diffusion.cosine_schedule(0.0, min_signal_rate, max_signal_rate)).log_snr
    if spacing == "logsnr":
        lambdas = start_lambda + fraction * (end_lambda - start_lambda)
    else:  # karras: uniform in sigma_ve^(1/rho), sigma_ve = sigma/alpha = exp(-lambda)
        high, low = jnp.exp(-start_lambda / KARRAS_RHO), jnp.exp(-end_lambda / KARRAS_RHO)
        lambdas = -KARRAS_RHO * jnp.log(high + fraction * (low - high))
    times = diffusion.time_from_log_snr(lambdas, min_signal_rate, max_signal_rate)
    # Pin the end points (the inverse schedule is exact only to rounding).
    times = times.at[0].set(start)
    if steps > 1:
        times = times.at[-1].set(0.0)
    return TimeGrid(times, jnp.concatenate([times[1:], times[-1:]]))


# --- the samplers -------------------------------------------------------------------------------


def _first_order(x, pred_images, rates: Rates, next_rates: Rates, h):
    """DPM-Solver++(1), Lu et al. 2022 eq. 10 (= DDIM with eta 0): ``x_t = sigma_t/sigma_s x_s - alpha_t (e^{-h} - 1) x0``."""
    return (next_rates.noise / rates.noise) * x - next_rates.signal * jnp.expm1(-h) * pred_images


class Sampler:
    """One solver of the reverse process; ``init`` and ``step`` are pure functions of arrays.

    ``init(x)`` gives the solver's history (carried in the loop state);
    ``step(history, x, pred_noises, pred_images, rates, next_rates, eta, fresh_noise)``
    returns ``(next_x, history)``. ``stochastic`` samplers use ``eta`` and fresh
    noise; the others ignore both.
    """

    name: str = ""
    stochastic: bool = False
    fresh_noise: bool = False
    """Draws fresh noise at every step whatever ``eta`` is (consistency sampling)."""

    def init(self, x) -> Any:
        return ()

    def step(self, history, x, pred_noises, pred_images, rates: Rates, next_rates: Rates, eta, fresh_noise):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class DDIM(Sampler):
    """DDIM, eq. 12 (``eta = 0``: the deterministic sampler, eq. 13's Euler step) with eq. 16's noise for ``eta > 0``."""

    name = "ddim"
    stochastic = True

    def step(self, history, x, pred_noises, pred_images, rates, next_rates, eta, fresh_noise):
        sigma = diffusion.ddim_sigma(rates.noise, rates.signal, next_rates.noise, next_rates.signal, eta)
        return diffusion.ddim_step(pred_images, pred_noises, next_rates.noise, next_rates.signal, sigma, fresh_noise), history


class DPMSolverPP(Sampler):
    """DPM-Solver++ multistep in data-prediction form, order 2 (2M) or 3 (3M); ``lambda = log(alpha/sigma)``.

    The history holds the last ``order - 1`` data predictions, their ``lambda``
    and how many are valid; step ``i`` uses order ``min(order, i + 1)``.
    """

    stochastic = False

    def __init__(self, order: int):
        if order not in (2, 3):
            raise ValueError(f"DPM-Solver++ multistep order must be 2 or 3, got {order}")
        self.order = order
        self.name = f"dpmpp-{order}m"

    def init(self, x):
        previous = jnp.zeros((self.order - 1, *x.shape), x.dtype)
        lambdas = jnp.zeros((self.order - 1,), jnp.float32)
        return previous, lambdas, jnp.zeros((), jnp.int32)

    def step(self, history, x, pred_noises, pred_images, rates, next_rates, eta, fresh_noise):
        previous, previous_lambdas, count = history
        # The grid is the same for every image: one lambda per step (rates are (N, 1, 1, 1)).
        lam, next_lam = rates.log_snr.reshape(-1)[0], next_rates.log_snr.reshape(-1)[0]
        h = next_lam - lam
        # A step that lands where it starts (the end of a grid that includes t = 0) leaves x as it is.
        safe_h = jnp.where(h == 0, 1.0, h)
        first = _first_order(x, pred_images, rates, next_rates, h)
        # Second order (Lu et al. 2022, Algorithm 2): D = (1 + 1/2r) M_0 - 1/2r M_1, r = h_{i-1}/h_i.
        h0 = lam - previous_lambdas[0]
        r0 = h0 / safe_h
        d1_0 = (pred_images - previous[0]) / jnp.where(r0 == 0, 1.0, r0)
        second = first - 0.5 * next_rates.signal * jnp.expm1(-h) * d1_0
        next_x = jnp.where(count >= 1, second, first)
        if self.order == 3:
            # Third order (Lu et al. 2022, appendix; their code's multistep third update):
            # x_t = sigma_t/sigma_s x - alpha_t phi_1 M_0 + alpha_t phi_2 D1 - alpha_t phi_3 D2,
            # phi_1 = e^{-h} - 1, phi_2 = phi_1/h + 1, phi_3 = phi_2/h - 1/2.
            h1 = previous_lambdas[0] - previous_lambdas[1]
            r1 = h1 / safe_h
            d1_1 = (previous[0] - previous[1]) / jnp.where(r1 == 0, 1.0, r1)
            d1 = d1_0 + r0 / (r0 + r1) * (d1_0 - d1_1)
            d2 = (d1_0 - d1_1) / (r0 + r1)
            phi_1 = jnp.expm1(-safe_h)
            phi_2 = phi_1 / safe_h + 1.0
            phi_3 = phi_2 / safe_h - 0.5
            third = first + next_rates.signal * (phi_2 * d1 - phi_3 * d2)
            next_x = jnp.where(count >= 2, third, next_x)
        next_x = jnp.where(h == 0, x, next_x)
        # Newest first: shift the history by one.
        previous = jnp.concatenate([pred_images[None], previous[:-1]])
        previous_lambdas = jnp.concatenate([lam[None], previous_lambdas[:-1]])
        return next_x, (previous, previous_lambdas, count + 1)


class Consistency(Sampler):
    """Multistep consistency sampling (Song et al. 2023, Algorithm 1) for a consistency student, whose image
    prediction is the end of the teacher's ODE trajectory through the state: the next state is that image
    re-noised with fresh noise to the next time, ``x_s = alpha_s x0 + sigma_s z`` (their
    ``x + sqrt(tau^2 - eps^2) z`` in this schedule, the boundary eps being noise rate 0)."""

    name = "consistency"
    fresh_noise = True

    def step(self, history, x, pred_noises, pred_images, rates, next_rates, eta, fresh_noise):
        return diffusion.add_noise(pred_images, fresh_noise, next_rates.noise, next_rates.signal), history


def _solver(name: str, kind: spec.SamplerKind) -> Sampler:
    """The solver of a registry entry: DDIM is the first-order (and only stochastic) one, the others DPM-Solver++,
    and the consistency student's sampler its own."""
    solver = Consistency() if kind.consistency else DDIM() if kind.order == 1 else DPMSolverPP(kind.order)
    if (solver.name, solver.stochastic) != (name, kind.stochastic):
        raise AssertionError(f"the registry entry {name!r} does not describe {solver!r}")
    return solver


SAMPLERS: dict[str, Sampler] = {name: _solver(name, kind) for name, kind in spec.SAMPLERS.items()}
"""Every sampler of :data:`ddim.spec.SAMPLERS`, built from its registry entry."""


def get_sampler(name: str) -> Sampler:
    """The sampler called ``name``, else a ``ValueError`` listing the valid names."""
    _check_name("sampler", name, tuple(SAMPLERS))
    return SAMPLERS[name]


# --- the loop -----------------------------------------------------------------------------------


class Result(NamedTuple):
    """What :func:`run` returns: the final state, the last data prediction and (optionally) all of them."""

    x: jax.Array
    pred_images: jax.Array
    trajectory: jax.Array | None


def run(
    denoise: Callable,
    schedule: Callable,
    x,
    grid: TimeGrid | UniformGrid,
    sampler: str | Sampler = "ddim",
    *,
    eta=0.0,
    rng=None,
    hook: Callable | None = None,
    keep_trajectory: bool = False,
) -> Result:
    """Run ``sampler`` over ``grid`` from the state ``x``: one compiled loop, no Python loop over steps.

    - ``denoise(x, noise_rates, signal_rates) -> (pred_noises, pred_images)`` is the network.
    - ``schedule(times) -> (noise_rates, signal_rates)``.
    - ``grid``: step ``i`` evaluates the network at ``grid.times[i]`` and lands
      on ``grid.next_times[i]``; the direction is the grid's (towards the data
      for sampling, towards the noise for inversion: DDIM eq. 13 both ways).
    - ``eta``/``rng``: the fresh noise of a stochastic sampler (DDIM eq. 16),
      drawn with ``fold_in(rng, i)`` at step ``i``; unused when the sampler is
      deterministic or ``eta`` is the Python number 0 (the consistency sampler
      draws it at every step).
    - ``hook(step, x, rates) -> x``: applied to the state before each network
      call (inpainting replaces the known region there).
    - ``keep_trajectory``: also return every step's data prediction, ``(S, *x.shape)``.

    Returns :class:`Result`: the state after the last step (the latent, for
    inversion), the last data prediction (the sample) and the trajectory.
    """
    sampler = get_sampler(sampler) if isinstance(sampler, str) else sampler
    num_steps = grid.num_steps
    ones = jnp.ones((x.shape[0],) + (1,) * (x.ndim - 1), jnp.float32)
    fresh_noise_needed = sampler.fresh_noise or sampler.stochastic and not (isinstance(eta, (int, float)) and eta == 0)
    if fresh_noise_needed and rng is None:
        raise ValueError(f"the {sampler.name} sampler{' with eta > 0' if not sampler.fresh_noise else ''} needs an rng")
    trajectory = jnp.zeros((num_steps if keep_trajectory else 0, *x.shape), x.dtype)

    def body(carry):
        step, x, _, history, trajectory = carry
        time, next_time = grid.at(step)
        rates = Rates(*schedule(ones * time))
        if hook is not None:
            x = hook(step, x, rates)
        pred_noises, pred_images = denoise(x, rates.noise, rates.signal)
        next_rates = Rates(*schedule(ones * next_time))
        fresh_noise = jax.random.normal(jax.random.fold_in(rng, step), x.shape, x.dtype) if fresh_noise_needed else None
        x, history = sampler.step(history, x, pred_noises, pred_images, rates, next_rates, eta, fresh_noise)
        if keep_trajectory:
            trajectory = jax.lax.dynamic_update_index_in_dim(trajectory, pred_images, step, 0)
        return step + 1, x, pred_images, history, trajectory

    def not_done(carry):
        return carry[0] < num_steps

    # Before any step the "prediction" is the state itself (a zero-step grid returns x unchanged).
    carry = (jnp.zeros((), jnp.int32), x, x, sampler.init(x), trajectory)
    _, x, pred_images, _, trajectory = jax.lax.while_loop(not_done, body, carry)
    return Result(x, pred_images, trajectory if keep_trajectory else None)
