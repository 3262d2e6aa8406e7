"""The user's object: a trained model and its verbs (generate, invert, reconstruct, interpolate, edit, inpaint).

>>> import ddim
>>> pipe = ddim.load("runs/flowers64")            # a work directory or a checkpoint step dir
>>> images = pipe.generate(16, steps=20, seed=0)  # uint8, (16, 64, 64, 3)
>>> ddim.save_images(images, "samples/")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
import numpy as np

from ddim.config import Config
from ddim.diffusion import slerp
from ddim.errors import InputError
from ddim.images import to_uint8
from ddim.model import DiffusionModel
from ddim.sampling import programs
from ddim.sampling.classes import ClassSpace
from ddim.sampling.inputs import check_latents, prepare_images, prepare_masks
from ddim.spec import SamplingRules, SamplingSpec

OnBatch = Callable[[int], None]


class Reconstruction(NamedTuple):
    """What :meth:`Pipeline.reconstruct` returns."""

    images: np.ndarray
    """The reconstructions, uint8 ``(N, H, W, C)``."""
    errors: np.ndarray
    """Per-image mean squared error over pixels and channels, on [0, 1] values, ``(N,)``."""
    latents: np.ndarray
    """The inverted latents, float32 ``(N, H, W, C)``."""
    inputs: np.ndarray
    """The inputs as the model saw them (after any crop and resize), uint8."""


def inversion_spec(spec: SamplingSpec | None, steps: int | None = None, spacing: str | None = None,
                   guidance: float | None = None, rules: SamplingRules = SamplingRules()) -> SamplingSpec:
    """The spec of a deterministic DDIM pass (inversion and decoding): ``spec``'s steps, spacing and guidance.

    Without ``spec`` it starts from the plain defaults (DDIM's uniform grid), or a student's own step count; a
    bundled model's sampler advice is for sampling, not for these passes. A student decodes with its own sampler
    (a consistency student's draws fresh noise after its first step)."""
    sampler = rules.sampler if rules.distilled else "ddim"
    base = SamplingSpec(steps=rules.distilled_steps, sampler=sampler) if rules.distilled else None
    spec = SamplingSpec.of(spec if spec is not None else base, steps=steps, spacing=spacing, guidance=guidance)
    return rules.check(SamplingSpec(steps=spec.steps, sampler=sampler, spacing=spec.spacing, guidance=spec.guidance))


class Pipeline:
    """A trained model and its verbs: generate, invert, reconstruct, interpolate, edit, inpaint.

    Without a spec, the verbs sample with :attr:`defaults`: the plain :class:`SamplingSpec` defaults, a bundled
    model's best measured setting, or a distilled student's own step count (:class:`ddim.spec.SamplingRules`).
    Every verb is jitted with static step counts (one compile per setting),
    batched (``batch_size`` bounds memory), deterministic for a seed, and runs
    on every device of the mesh. Images come back as uint8 ``(N, H, W, C)``.
    The sampler settings are one :class:`ddim.spec.SamplingSpec` (``spec=``);
    the loose keywords ``steps``, ``sampler``, ``spacing`` and ``eta`` change
    single fields of it. Bad arguments raise :class:`ddim.errors.InputError`,
    a ``ValueError`` whose one sentence says what is wrong.
    """

    def __init__(self, config: Config, variables: dict[str, Any], step: int | None = None, path: Path | None = None,
                 pretrained: str | None = None, defaults: SamplingSpec | None = None):
        self.config = config
        self.model = DiffusionModel(config.model)
        self.class_space = ClassSpace.of(config.model)
        self.rules = SamplingRules.of(config.model, defaults, pretrained or config.name)
        """What the verbs sample with when not told (``rules.defaults``) and what this model refuses."""
        self.variables = variables
        self.step = step
        self.path = path
        self.pretrained = pretrained  # the bundled model's name (ddim.load("pretrained:NAME")), else None

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.model.image_shape

    @property
    def defaults(self) -> SamplingSpec:
        """The spec the verbs sample with when given none."""
        return self.rules.defaults

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names of a class-conditional model, in id order; empty for an unconditional one."""
        return self.class_space.names

    def class_ids(self, classes, num_images: int, seed: int = 0) -> np.ndarray:
        """The class id of each of ``num_images`` images (names or ids; see :meth:`ClassSpace.resolve`)."""
        return self.class_space.resolve(classes, num_images, seed)

    def _condition(self, count: int, spec: SamplingSpec, classes, seed: int, cond):
        """``cond`` with the class labels and guidance scales of ``count`` images (see :class:`ClassSpace`)."""
        return self.class_space.condition(count, spec, classes, seed, cond)

    def _prepare(self, images) -> tuple[np.ndarray, list[tuple[int, int]]]:
        return prepare_images(images, self.config.model.image_size, self.config.model.channels)

    def _weights_fit(self):
        """Around every program: :func:`load` left the weights' shape check to its trace."""
        from ddim.checkpoint.ema import weights_fit

        return weights_fit(self.config, self.path)

    def _run(self, program, spec: SamplingSpec, count: int, **options) -> np.ndarray:
        with self._weights_fit():
            return programs.map_batches(program, self.model, self.variables, spec, count=count, **options)

    def generate(self, num_images: int | None = None, *, steps: int | None = None, seed: int = 0,
                 eta: float | None = None, batch_size: int | None = None, on_batch: OnBatch | None = None,
                 sampler: str | None = None, spacing: str | None = None, latents: np.ndarray | None = None,
                 spec: SamplingSpec | None = None, classes=None, guidance: float | None = None,
                 cond=None) -> np.ndarray:
        """Sample images with the EMA weights: uint8 ``(num_images, H, W, C)``.

        - ``num_images`` >= 1 (default 16, or the number of ``latents``).
        - ``spec``: a :class:`ddim.spec.SamplingSpec` (default: :attr:`defaults`, the
          model's own: 20 steps of deterministic DDIM on the uniform grid, a bundled
          model's best measured setting, or a distilled student's step count, the
          only one it takes); ``steps`` >= 1 is the cost of
          sampling; ``sampler`` is ``"ddim"`` (DDIM eq. 12), ``"dpmpp-2m"`` or
          ``"dpmpp-3m"`` (see :mod:`ddim.samplers`); ``spacing`` is ``"uniform"``,
          ``"logsnr"`` or ``"karras"``; ``eta`` >= 0 is DDIM's fresh noise per step
          (eq. 16; only the ``ddim`` sampler takes ``eta > 0``).
        - ``seed``: same seed, arguments and checkpoint give the same pixels.
        - ``latents``: float ``(N, H, W, C)`` initial noise instead of the
          seeded one (from :meth:`latents`, :meth:`invert` or :meth:`interpolate`'s
          inputs); ``generate(latents=pipe.latents(n, seed=seed))`` gives the pixels of
          ``generate(n, seed=seed)``.
        - ``batch_size``: images generated at once (bounds memory); ``on_batch(n)``
          is called after each batch of ``n``.
        - ``classes`` (class-conditional models): a name or id for all images, or
          one per image; default: drawn from the training data's class
          frequencies, from ``seed``. ``guidance``: the classifier-free guidance
          scale (``spec.guidance``): 1 is plain conditional sampling (the default),
          0 unconditional, above 1 more like the class.
        - ``cond``: a pytree of per-image arrays ``(N, ...)`` handed to the network.

        Raises ``ValueError`` (one sentence) for a non-positive count or step
        count, an unknown sampler or spacing (listing the valid ones), a bad
        eta, or latents of the wrong shape or count.
        """
        spec = self.rules.resolve(spec, steps=steps, sampler=sampler, spacing=spacing, eta=eta, guidance=guidance)
        if latents is not None:
            latents = check_latents(latents, self.image_shape)
            if num_images is not None and num_images != len(latents):
                raise InputError(f"num_images is {num_images} but {len(latents)} latents were given")
            num_images = len(latents)
        num_images = 16 if num_images is None else num_images
        if num_images < 1:
            raise InputError(f"the number of images must be >= 1, got {num_images}")
        cond = self._condition(num_images, spec, classes, seed, cond)
        with self._weights_fit():
            return programs.generate_images(self.model, self.variables, num_images, spec, seed, batch_size, on_batch,
                                            latents, cond)

    def latents(self, num_images: int = 1, *, seed: int = 0, batch_size: int | None = None) -> np.ndarray:
        """The initial noise ``generate(num_images, seed=seed, batch_size=batch_size)`` starts from, float32."""
        return programs.seeded_latents(self.image_shape, num_images, seed, batch_size)

    def trajectory(self, num_images: int = 16, *, steps: int | None = None, seed: int = 0, eta: float | None = None,
                   sampler: str | None = None, spacing: str | None = None, batch_size: int | None = None,
                   latents: np.ndarray | None = None, on_batch: OnBatch | None = None,
                   spec: SamplingSpec | None = None, classes=None, guidance: float | None = None,
                   cond=None) -> np.ndarray:
        """The predicted clean images after every step of :meth:`generate`: uint8 ``(steps, N, H, W, C)``.

        Same arguments as :meth:`generate`; the last frame is its sample. Shows
        how the reverse process settles the image, coarse to fine.
        """
        spec = self.rules.resolve(spec, steps=steps, sampler=sampler, spacing=spacing, eta=eta, guidance=guidance)
        if latents is None:
            if num_images < 1:
                raise InputError(f"the number of images must be >= 1, got {num_images}")
            latents = self.latents(num_images, seed=seed, batch_size=batch_size)
        latents = check_latents(latents, self.image_shape)
        cond = self._condition(len(latents), spec, classes, seed, cond)
        frames = self._run(programs.trajectory, spec, len(latents), batch_size=batch_size, arrays=[latents],
                           traced=(jnp.float32(spec.eta),), cond=cond, seed=seed, on_batch=on_batch, batch_axis=1)
        return to_uint8(frames)

    def invert(self, images, *, steps: int | None = None, spacing: str | None = None, batch_size: int | None = None,
               on_batch: OnBatch | None = None, spec: SamplingSpec | None = None, classes=None,
               cond=None) -> np.ndarray:
        """Encode images to latents: deterministic DDIM run from the data to the noise (DDIM eq. 13).

        ``images``: uint8 (or float in [0, 1]) ``(N, H, W, C)``, one image, or a
        list of images or files (see :func:`prepare_images`). The time grid is
        :meth:`generate`'s for the same steps and spacing (of ``spec``; inversion
        is always deterministic DDIM), so ``generate(latents=invert(x, steps=steps),
        steps=steps)`` reconstructs ``x``, the closer the more steps
        (:meth:`reconstruct`). ``classes`` (class-conditional models): the class
        to invert with, one for all images or one each; decode with the same
        one. Default: the null class (no class; to decode with it, pass
        ``cond={"label": np.full(n, -1)}`` to :meth:`generate`, whose default
        draws classes). No guidance: inverting with a guidance scale drifts
        (Mokady et al. 2022, null-text inversion).
        Returns float32 latents ``(N, H, W, C)``. See :func:`ddim.sampling.process.invert`.
        """
        self.rules.refuse_ode("invert images")
        spec = inversion_spec(spec, steps, spacing)
        prepared, _ = self._prepare(images)
        cond = self.class_space.given(len(prepared), classes, cond)
        return self._invert(prepared, spec, batch_size, on_batch, cond)

    def _invert(self, prepared, spec: SamplingSpec, batch_size, on_batch=None, cond=None):
        return self._run(programs.invert, spec, len(prepared), batch_size=batch_size, arrays=[prepared], cond=cond,
                         on_batch=on_batch)

    def reconstruct(self, images, *, steps: int | None = None, spacing: str | None = None,
                    batch_size: int | None = None, spec: SamplingSpec | None = None, classes=None,
                    cond=None) -> Reconstruction:
        """Invert then generate with the same steps, spacing and class: how well the model encodes ``images``.

        ``classes`` as :meth:`invert` (default the null class; no guidance).
        Returns a :class:`Reconstruction`: the uint8 reconstructions, the
        per-image mean squared error on [0, 1] pixels (the measure of the DDIM
        paper's Table 2), the latents and the inputs as the model saw them.
        """
        self.rules.refuse_ode("reconstruct images")
        spec = inversion_spec(spec, steps, spacing)
        prepared, _ = self._prepare(images)
        cond = self.class_space.given(len(prepared), classes, cond)
        latents = self._invert(prepared, spec, batch_size, cond=cond)
        floats = self._run(programs.sample_from, spec, len(latents), batch_size=batch_size, arrays=[latents],
                           traced=(jnp.float32(0.0),), cond=cond)
        errors = np.mean((floats.astype(np.float64) - prepared) ** 2, axis=(1, 2, 3))
        return Reconstruction(to_uint8(floats), errors, latents, to_uint8(prepared))

    def interpolate(self, a, b, *, frames: int = 16, steps: int | None = None, spacing: str | None = None,
                    batch_size: int | None = None, spec: SamplingSpec | None = None, classes=None,
                    guidance: float | None = None, cond=None) -> np.ndarray:
        """Images along the spherical interpolation (slerp) from latent ``a`` to latent ``b``: uint8 ``(frames, H, W, C)``.

        ``a`` and ``b``: latents ``(H, W, C)`` (or a batch of one), e.g. from
        :meth:`latents` (a seed) or :meth:`invert` (a real image); they may be
        equal, so that only the class moves. ``frames`` >= 2 includes both ends.
        Decoded with deterministic DDIM (the steps and spacing of ``spec``; use
        the ones the latents were inverted with). See :func:`ddim.diffusion.slerp`.

        Class-conditional models: ``classes`` is one class for the whole path,
        or two, ``(start, end)``: the class vector then moves with the latent,
        ``(1 - w) e_start + w e_end`` at the frame's weight ``w``, so the first
        frame is ``generate`` of ``a`` with the start class and the last of ``b``
        with the end class. Default: the null class (no class) all along, as
        :meth:`invert` uses by default. ``guidance`` (``spec.guidance``) guides
        every frame towards its class mix; it needs ``classes``.
        """
        spec = inversion_spec(spec, steps, spacing, guidance, self.rules)
        a, b = check_latents(a, self.image_shape), check_latents(b, self.image_shape)
        if len(a) != 1 or len(b) != 1:
            raise InputError(f"interpolate takes one latent at each end, got {len(a)} and {len(b)}")
        if not isinstance(frames, (int, np.integer)) or frames < 2:
            raise InputError(f"frames must be an integer >= 2 (both ends included), got {frames!r}")
        if not (np.any(a) and np.any(b)):
            raise InputError("a latent to interpolate is all zeros (it has no direction)")
        weights = np.linspace(0.0, 1.0, frames)  # exactly 0 and 1 at the ends
        cond = self.class_space.path_condition(weights, spec, classes, cond)
        path = np.array(slerp(a[0], b[0], weights))
        path[0], path[-1] = a[0], b[0]  # the ends exactly, not to rounding
        with self._weights_fit():
            return programs.generate_images(self.model, self.variables, frames, spec, batch_size=batch_size,
                                            latents=path, cond=cond)

    def edit(self, images, *, strength: float = 0.6, steps: int | None = None, seed: int = 0,
             sampler: str | None = None, spacing: str | None = None, eta: float | None = None,
             batch_size: int | None = None, spec: SamplingSpec | None = None, classes=None,
             guidance: float | None = None, cond=None) -> np.ndarray:
        """Image-to-image editing (SDEdit, Meng et al. 2021): noise ``images`` to ``strength`` and denoise.

        ``strength`` in (0, 1]: the diffusion time the inputs are noised to;
        about 0.3 keeps the composition and changes details, 0.6-0.8 keeps
        colours and rough layout, 1 is plain sampling from the seed's noise
        (equal to ``generate(len(images), seed=seed)``). The spec's steps (>= 1
        network calls) run from ``strength`` to the clean end with its sampler,
        spacing and eta (as :meth:`generate`). Returns uint8 ``(N, H, W, C)``.
        """
        if isinstance(strength, bool) or not isinstance(strength, (int, float, np.floating, np.integer)) \
                or not 0.0 < strength <= 1.0:
            raise InputError(f"strength must be in (0, 1], got {strength!r}")
        if strength != 1.0:
            self.rules.refuse_ode("edit images from part way (SDEdit)")
        spec = self.rules.resolve(spec, steps=steps, sampler=sampler, spacing=spacing, eta=eta, guidance=guidance)
        prepared, _ = self._prepare(images)
        batch_size = programs.check_batch_size(batch_size, len(prepared))
        cond = self._condition(len(prepared), spec, classes, seed, cond)
        if strength == 1.0:  # plain sampling: the input is not used at all
            return self.generate(len(prepared), seed=seed, batch_size=batch_size, spec=spec, cond=cond)
        floats = self._run(programs.edit, spec, len(prepared), batch_size=batch_size, arrays=[prepared],
                           traced=(jnp.float32(strength), jnp.float32(spec.eta)), cond=cond, seed=seed)
        return to_uint8(floats)

    def inpaint(self, images, mask, *, steps: int | None = None, seed: int = 0, sampler: str | None = None,
                spacing: str | None = None, eta: float | None = None, batch_size: int | None = None,
                spec: SamplingSpec | None = None, classes=None, guidance: float | None = None,
                cond=None) -> np.ndarray:
        """Fill the masked region of ``images`` consistently with the rest (RePaint-style, without resampling).

        ``mask``: white/True/1 = the region to fill; one mask for all images or
        one per image, as a bool/uint8/float array of the image's height and
        width or a mask image file (see :func:`prepare_masks`). Outside the mask
        the result keeps the input's pixels. ``spec`` (or ``steps``, ``sampler``,
        ``spacing``, ``eta``) and ``seed`` as :meth:`generate`. Returns uint8 ``(N, H, W, C)``.
        """
        spec = self.rules.resolve(spec, steps=steps, sampler=sampler, spacing=spacing, eta=eta, guidance=guidance)
        prepared, sizes = self._prepare(images)
        masks = prepare_masks(mask, sizes, self.config.model.image_size)
        cond = self._condition(len(prepared), spec, classes, seed, cond)
        floats = self._run(programs.inpaint, spec, len(prepared), batch_size=batch_size, arrays=[prepared, masks],
                           traced=(jnp.float32(spec.eta),), cond=cond, seed=seed)
        return to_uint8(floats)

    def __repr__(self) -> str:
        bundled = f", pretrained={self.pretrained!r}" if self.pretrained else ""
        return f"Pipeline(name={self.config.name!r}, step={self.step}, path={str(self.path)!r}{bundled})"


def load(path: str | Path, step: int | None = None, warn: Callable[[str], None] | None = None) -> Pipeline:
    """Load a pipeline from a work directory, its ``checkpoints`` folder, a checkpoint step dir, or
    ``"pretrained:NAME"``, a model bundled with the package (``ddim pretrained`` lists them).

    Needs nothing but the checkpoint: the config stored beside the weights
    rebuilds the model. Without a step (none given, no step directory named),
    the newest intact checkpoint is used: a damaged newer one is skipped with
    a one-line warning through ``warn`` (default: stderr) and set aside when
    no training run owns the directory. A bundled model's weights are checked
    against their SHA-256. Raises :class:`ddim.checkpoint.CheckpointError`,
    also for a damaged named step, an unknown bundled model or one whose
    weights were changed. Weights that do not fit their config raise it when
    the verbs first trace the network (which checks every weight's shape), not
    here: loading traces nothing.
    """
    from ddim.pretrained.registry import load_source, pretrained_name

    loaded = load_source(path, step, warn, check=False)
    return Pipeline(loaded.config, loaded.variables, step=loaded.step, path=loaded.path,
                    pretrained=pretrained_name(path), defaults=loaded.defaults)
