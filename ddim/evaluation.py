"""Sample quality of a checkpoint: KID and FID of generated images against real ones.

The protocol (``ddim eval``; see the README's metrics section):

* Feature network: Keras' InceptionV3 without its top, global average pooled
  (2048-d features), with the standard ImageNet weights file
  ``inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5``. Images are
  resized in TensorFlow (bilinear) and scaled with
  ``inception_v3.preprocess_input``, as in the Keras DDIM example.
* KID at 75x75 inputs (as the Keras example, so its numbers are comparable),
  FID at 299x299 (InceptionV3's native resolution, as usual for FID).
* Generated images: the EMA weights of the checkpoint, ``num`` images in
  batches of ``batch_size``; batch ``i`` is ``Pipeline.generate(count,
  seed=batch_seed(seed, i))``. Only features are kept (KID) or summed into
  running statistics (FID), never the images, so memory does not grow with
  the number of images beyond 2048 floats per image.
* Real images: a TFDS split of the checkpoint's dataset, preprocessed exactly
  as for training (:func:`ddim.data.load_split`): ``val`` (``data.val_split``,
  the default, like the Keras example's KID) or ``train``; ``real_num`` draws a
  fixed random subset. Their features are cached in
  ``<workdir>/eval_cache/real_<key>.npz``.

The network never runs with random weights unless a caller injects its own
``feature_extractor_factory`` (the tests do; the CLI never does). TensorFlow is
imported lazily through :func:`ddim.data.tensorflow` (CPU only).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ddim import metrics
from ddim.config import Config

KID_IMAGE_SIZE = 75
"""InceptionV3 input side for KID (the Keras DDIM example's ``kid_image_size``)."""
FID_IMAGE_SIZE = 299
"""InceptionV3 input side for FID (its native resolution)."""

WEIGHTS_FILE = "inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5"
WEIGHTS_URL = "https://storage.googleapis.com/tensorflow/keras-applications/inception_v3/" + WEIGHTS_FILE
WEIGHTS_MD5 = "bcbd6486424b2319ff4ef7d526e38f63"
"""The md5 Keras checks the downloaded file against (``keras.applications.InceptionV3``)."""
WEIGHTS_ENV = "DDIM_INCEPTION_WEIGHTS"

SPLITS = ("val", "train")
EVAL_FILE = "eval.jsonl"
CACHE_DIR = "eval_cache"
_CACHE_VERSION = 1  # bump when the preprocessing or the cache layout changes

FeatureFactory = Callable[[int], "FeatureExtractor"]
"""``factory(image_size) -> FeatureExtractor`` taking square images of that side."""


class EvaluationError(RuntimeError):
    """An evaluation cannot run (missing weights, bad settings, unwritable work directory, ...)."""


def _log_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- weights


def keras_models_dir() -> Path:
    """Keras' download cache for application weights: ``$KERAS_HOME/models`` or ``~/.keras/models``."""
    home = os.environ.get("KERAS_HOME")
    if home:
        return Path(home).expanduser() / "models"
    base = Path.home()
    if not os.access(base, os.W_OK):  # Keras falls back to /tmp/.keras, so do we
        base = Path("/tmp")
    return base / ".keras" / "models"


_WHAT_TO_GET = f"ddim eval needs Keras' {WEIGHTS_FILE} ({WEIGHTS_URL})"


def missing_weights_message(reason: str | None = None) -> str:
    """The one-line explanation of where the InceptionV3 weights must go."""
    message = (
        f"InceptionV3 weights not found: ddim eval needs {WEIGHTS_FILE} (from {WEIGHTS_URL}); "
        f"put it in {keras_models_dir()}/, or pass --inception-weights PATH, or set {WEIGHTS_ENV}=PATH"
    )
    return message + (f" (download failed: {reason})" if reason else "")


def _download_weights() -> Path:
    """Download the weights into Keras' cache as Keras would (same URL, file name and md5 check).

    Done with urllib rather than ``keras.utils.get_file`` so that a failure
    (offline) costs no TensorFlow import and prints nothing but our error.
    """
    target = keras_models_dir() / WEIGHTS_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{WEIGHTS_FILE}.{os.getpid()}.part")
    try:
        with urllib.request.urlopen(WEIGHTS_URL, timeout=60) as response, open(partial, "wb") as file:
            shutil.copyfileobj(response, file, 1 << 20)
        digest = file_md5(partial)
        if digest != WEIGHTS_MD5:
            raise ValueError(f"downloaded file has md5 {digest}, expected {WEIGHTS_MD5}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def _check_weights_file(path: Path, origin: str) -> Path:
    if not path.is_file():
        raise EvaluationError(f"InceptionV3 weights file {path} (from {origin}) does not exist; {_WHAT_TO_GET}")
    if path.suffix.lower() not in (".h5", ".hdf5"):
        raise EvaluationError(f"InceptionV3 weights file {path} (from {origin}) is not an .h5 file; {_WHAT_TO_GET}")
    return path


def resolve_weights(weights: str | os.PathLike | None = None, download: bool = True) -> Path:
    """The InceptionV3 weights file to use, or :class:`EvaluationError` with one line saying where to put it.

    Order: ``weights`` (``--inception-weights``), ``$DDIM_INCEPTION_WEIGHTS``,
    Keras' cache (``~/.keras/models/`` + :data:`WEIGHTS_FILE`, or
    ``$KERAS_HOME/models/``), then a download into that cache (which fails
    offline). An explicit path that does not exist is an error, never a reason
    to look elsewhere.
    """
    if weights is not None and str(weights):
        return _check_weights_file(Path(weights).expanduser(), "--inception-weights")
    env = os.environ.get(WEIGHTS_ENV)
    if env:
        return _check_weights_file(Path(env).expanduser(), f"${WEIGHTS_ENV}")
    cached = keras_models_dir() / WEIGHTS_FILE
    if cached.is_file():
        return cached
    reason = "downloads disabled"
    if download:
        try:
            path = Path(_download_weights())
            if path.is_file():
                return path
            reason = f"{path} missing after download"
        except Exception as error:  # offline (URLError), timeout, unwritable cache, md5 mismatch, ...
            lines = str(error).strip().splitlines()
            reason = lines[-1] if lines else type(error).__name__
    raise EvaluationError(missing_weights_message(reason))


def file_md5(path: str | os.PathLike) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------- feature network


def _use_tensorflow_keras() -> None:
    """Make sure ``tf.keras`` runs on TensorFlow (Keras 3 follows ``$KERAS_BACKEND``)."""
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = "tensorflow"


def tf_keras():
    """``(tf, tf.keras)``: TensorFlow via :func:`ddim.data.tensorflow` (no GPU) and its Keras."""
    from ddim.data import tensorflow

    _use_tensorflow_keras()
    tf = tensorflow()
    keras = tf.keras
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise EvaluationError(f"Keras runs on the {backend!r} backend; set KERAS_BACKEND=tensorflow for ddim eval")
    return tf, keras


class FeatureExtractor:
    """A Keras image network as a function of uint8 images: ``extractor(images) -> (N, D) float32``.

    Images (``(N, H, W, C)`` uint8, C = 1 or 3, any side) are resized to
    ``image_size`` (bilinear, antialiased when shrinking), scaled to [-1, 1] by
    ``inception_v3.preprocess_input`` and fed to ``model`` in chunks of
    ``batch_size`` (bounding memory). ``identity`` names the network and its
    weights; the real-feature cache is keyed on it.

    :meth:`inception` builds the real thing; tests build one around a small
    random network, which exercises the same code.
    """

    def __init__(self, model, image_size: int, identity: str, batch_size: int = 32):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        tf, keras = tf_keras()
        self.model = model
        self.image_size = int(image_size)
        self.identity = identity
        self.batch_size = batch_size
        preprocess = keras.applications.inception_v3.preprocess_input
        size = self.image_size

        @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8)], reduce_retracing=True)
        def features(images):
            x = tf.image.resize(tf.cast(images, tf.float32), [size, size], method="bilinear", antialias=True)
            return model(preprocess(x), training=False)

        self._tf = tf
        self._features = features

    @classmethod
    def inception(cls, image_size: int, weights: str | os.PathLike, batch_size: int = 32, identity: str | None = None):
        """InceptionV3 (no top, average pooled, 2048-d) at ``image_size`` with the weights file ``weights``.

        ``weights`` must be a file: there is deliberately no random-weights
        option here.
        """
        if weights is None or not Path(weights).is_file():
            raise EvaluationError(missing_weights_message())
        _, keras = tf_keras()
        try:
            model = keras.applications.InceptionV3(
                include_top=False,
                weights=str(weights),
                pooling="avg",
                input_shape=(image_size, image_size, 3),
            )
        except Exception as error:  # wrong or damaged file: Keras raises ValueError, OSError, ...
            message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise EvaluationError(f"cannot load InceptionV3 weights from {weights}: {message}") from None
        identity = identity or f"keras-inception_v3-notop-avg@{image_size}px:md5={file_md5(weights)}"
        return cls(model, image_size, identity, batch_size)

    def __call__(self, images) -> np.ndarray:
        images = np.asarray(images)
        if images.ndim != 4 or images.shape[-1] not in (1, 3):
            raise ValueError(f"expected uint8 images (N, H, W, 1 or 3), got shape {images.shape}")
        if images.dtype != np.uint8:
            raise ValueError(f"expected uint8 images, got {images.dtype}")
        if images.shape[-1] == 1:
            images = np.repeat(images, 3, axis=-1)
        outputs = []
        for start in range(0, len(images), self.batch_size):
            chunk = self._tf.convert_to_tensor(images[start : start + self.batch_size])
            outputs.append(np.asarray(self._features(chunk), dtype=np.float32))
        if not outputs:
            return np.zeros((0, 0), np.float32)
        features = np.concatenate(outputs)
        if features.ndim != 2:
            raise EvaluationError(f"feature network {self.identity} returned shape {features.shape}, expected (N, D)")
        return features

    def __repr__(self) -> str:
        return f"FeatureExtractor({self.identity!r})"


def inception_factory(weights: str | os.PathLike | None = None, batch_size: int = 32, log=None) -> FeatureFactory:
    """``factory(image_size) -> FeatureExtractor`` for InceptionV3 with the resolved weights.

    Resolves the weights file now (:func:`resolve_weights`), so a missing file
    fails before any expensive work. Warns through ``log`` when the file is not
    the official Keras one (scores would not be comparable with others').
    """
    path = resolve_weights(weights)
    digest = file_md5(path)
    if digest != WEIGHTS_MD5 and log is not None:
        log(
            f"warning: {path} is not the official Keras {WEIGHTS_FILE} (md5 {digest}, expected {WEIGHTS_MD5}); "
            "scores are not comparable with published ones"
        )

    def factory(image_size: int) -> FeatureExtractor:
        identity = f"keras-inception_v3-notop-avg@{image_size}px:md5={digest}"
        return FeatureExtractor.inception(image_size, path, batch_size=batch_size, identity=identity)

    return factory


def kid_feature_extractor(weights: str | os.PathLike | None = None, batch_size: int = 32) -> FeatureExtractor:
    """The KID network (InceptionV3 at 75x75); raises :class:`EvaluationError` without weights."""
    return inception_factory(weights, batch_size)(KID_IMAGE_SIZE)


# --------------------------------------------------------------------------- real images


def split_expression(config: Config, split: str) -> str:
    """The TFDS split expression of ``split`` ("val" or "train") in ``config``."""
    if split not in SPLITS:
        raise EvaluationError(f"unknown split {split!r} (choose from {', '.join(SPLITS)})")
    expression = config.data.val_split if split == "val" else config.data.train_split
    if not expression:
        raise EvaluationError(f"the checkpoint's config has no data.{split}_split; use --split train")
    return expression


def real_cache_key(config: Config, split: str, real_num: int | None, identity: str) -> str:
    """Hash of everything the real features depend on: dataset, split, image size, count, network."""
    key = {
        "version": _CACHE_VERSION,
        "dataset": config.data.dataset,
        "split": split,
        "expression": split_expression(config, split),
        "image_size": config.model.image_size,
        "channels": config.model.channels,
        "real_num": real_num,
        "network": identity,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def select_real(images: np.ndarray, real_num: int | None) -> np.ndarray:
    """All images, or a fixed random subset of ``real_num`` of them (in their original order)."""
    if real_num is None or real_num >= len(images):
        return images
    index = np.sort(np.random.default_rng(0).choice(len(images), real_num, replace=False))
    return images[index]


def _load_cached(path: Path) -> np.ndarray | None:
    try:
        with np.load(path) as data:
            features = np.asarray(data["features"], np.float32)
    except Exception:  # missing, truncated or foreign file: recompute
        return None
    return features if features.ndim == 2 and len(features) else None


def _save_cached(path: Path, features: np.ndarray, meta: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, features=features, meta=np.array(json.dumps(meta)))
    os.replace(tmp, path)


def _extract_with_progress(extractor, images: np.ndarray, description: str, show_progress: bool) -> np.ndarray:
    if not show_progress:
        return extractor(images)
    from ddim.summary import Progress

    chunk = max(1, getattr(extractor, "batch_size", 32)) * 4
    progress = Progress(len(images), 0, description=description)
    parts = []
    try:
        for start in range(0, len(images), chunk):
            parts.append(extractor(images[start : start + chunk]))
            progress.update(min(start + chunk, len(images)), "")
    finally:
        progress.close()
    return np.concatenate(parts)


def real_features(
    config: Config,
    split: str,
    real_num: int | None,
    extractors: Sequence[FeatureExtractor],
    cache_dir: str | os.PathLike | None = None,
    log=None,
    show_progress: bool = False,
    images: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Features of the real images of ``split`` for each extractor, from the cache when possible.

    The images are loaded (and preprocessed as for training) only if some
    extractor's features are not cached; a caller that already holds the
    split's images (``load_split(config, split_expression(config, split))``)
    can pass them as ``images`` instead. With ``cache_dir=None`` nothing is
    cached. Raises :class:`ddim.data.DataError` when the dataset cannot be loaded.
    """
    log = log or (lambda message: None)
    cache = Path(cache_dir) if cache_dir is not None else None
    paths = [
        cache / f"real_{real_cache_key(config, split, real_num, ex.identity)}.npz" if cache else None
        for ex in extractors
    ]
    results: list[np.ndarray | None] = [_load_cached(p) if p is not None else None for p in paths]
    for path, result in zip(paths, results):
        if result is not None:
            log(f"real features: {len(result)} images from the cache {path}")
    if all(r is not None for r in results):
        return results  # type: ignore[return-value]

    expression = split_expression(config, split)
    if images is None:
        from ddim import data as data_lib

        images = data_lib.load_split(config, expression)
    images = select_real(np.asarray(images), real_num)
    if len(images) < 2:
        raise EvaluationError(f"split {split!r} ({expression}) has {len(images)} image(s); need at least 2")
    for index, (extractor, path) in enumerate(zip(extractors, paths)):
        if results[index] is not None:
            continue
        started = time.perf_counter()
        features = _extract_with_progress(extractor, images, f"real {extractor.image_size}px", show_progress)
        results[index] = features
        log(
            f"real features: {len(images)} {split} images at {extractor.image_size}px in "
            f"{time.perf_counter() - started:.1f}s"
        )
        if path is not None:
            meta = {
                "dataset": config.data.dataset,
                "split": split,
                "expression": expression,
                "image_size": config.model.image_size,
                "real_num": real_num,
                "network": extractor.identity,
            }
            try:
                _save_cached(path, features, meta)
            except OSError as error:  # a cache that cannot be written only costs time next run
                log(f"warning: cannot cache the real features in {path}: {error.strerror or error}")
    return results  # type: ignore[return-value]


# --------------------------------------------------------------------------- generated images


def batch_seed(seed: int, index: int) -> int:
    """The sampling seed of generated batch ``index`` (distinct per batch, a pure function of both)."""
    state = np.random.SeedSequence([seed % 2**32, index]).generate_state(1)[0]
    return int(state >> 1)  # fits a signed 32-bit int


def generated_features(
    generate: Callable[[int, int], np.ndarray],
    num: int,
    batch_size: int,
    seed: int,
    kid_extractor: FeatureExtractor,
    fid_extractor: FeatureExtractor | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """Generate ``num`` images batch by batch and keep only their features.

    ``generate(count, seed) -> uint8 images``. Returns the KID features
    ``(num, D)`` and the FID mean and covariance (None without
    ``fid_extractor``), accumulated with :class:`ddim.metrics.RunningStats`.
    """
    kid_features = None  # preallocated once the feature size is known: no copies at the end
    running = metrics.RunningStats() if fid_extractor is not None else None
    for index, start in enumerate(range(0, num, batch_size)):
        count = min(batch_size, num - start)
        images = generate(count, batch_seed(seed, index))
        features = kid_extractor(images)
        if kid_features is None:
            kid_features = np.empty((num, features.shape[1]), np.float32)
        kid_features[start : start + count] = features
        if running is not None:
            running.update(fid_extractor(images))
        del images
        if on_batch is not None:
            on_batch(start + count)
    return kid_features, (running.stats() if running is not None else None)


def cheap_kid(
    model,
    variables,
    real_features: np.ndarray,
    extractor: FeatureExtractor,
    num_images: int = 500,
    steps: int = 5,
    seed: int = 0,
    eta: float = 0.0,
    batch_size: int = 64,
    num_subsets: int = 20,
    subset_size: int = 1000,
) -> tuple[float, float]:
    """A quick KID ``(mean, std)`` for monitoring training, from a model and its (EMA) variables.

    ``model`` is a :class:`ddim.model.DiffusionModel`, ``variables`` its
    ``{"params", "batch_stats"}``; ``real_features`` come from
    :func:`real_features` with the same ``extractor`` (usually
    :func:`kid_feature_extractor`, InceptionV3 at 75x75). The Keras example
    monitors KID like this with 5 diffusion steps. Subsets are capped at the
    smaller set; images are generated and featurised batch by batch.
    """
    from ddim.sampling import generate_images

    if num_images < 2:
        raise EvaluationError(f"KID needs at least 2 generated images, got {num_images}")

    def generate(count: int, batch_seed_: int) -> np.ndarray:
        return generate_images(model, variables, count, steps, seed=batch_seed_, eta=eta, batch_size=count)

    features, _ = generated_features(generate, num_images, batch_size, seed, extractor)
    return metrics.kid(real_features, features, num_subsets, subset_size, rng=seed % 2**32)


# --------------------------------------------------------------------------- the evaluation job


def workdir_of(checkpoint_path: str | os.PathLike) -> Path:
    """The work directory of a checkpoint step directory ``<workdir>/checkpoints/<step>``."""
    path = Path(checkpoint_path).absolute()
    parent = path.parent
    return parent.parent if parent.name == "checkpoints" else parent


def _prepare_workdir(workdir: Path) -> Path:
    cache_dir = workdir / CACHE_DIR
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EvaluationError(f"cannot create {cache_dir}: {error.strerror or error}") from None
    if not os.access(workdir, os.W_OK) or not os.access(cache_dir, os.W_OK):
        raise EvaluationError(f"work directory {workdir} is not writable (eval writes {EVAL_FILE} and {CACHE_DIR}/)")
    return cache_dir


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line to ``path``."""
    with open(path, "a", encoding="utf-8") as file:
        file.write(json.dumps(record, sort_keys=False) + "\n")


def _check_settings(num, steps, eta, batch_size, real_num, split, kid_subsets, kid_subset_size) -> None:
    if num < 2:
        raise EvaluationError(f"the number of generated images must be >= 2 for KID and FID, got {num}")
    if steps < 1:
        raise EvaluationError(f"the number of diffusion steps must be >= 1, got {steps}")
    if eta < 0:
        raise EvaluationError(f"eta must be >= 0, got {eta}")
    if batch_size < 1:
        raise EvaluationError(f"the batch size must be >= 1, got {batch_size}")
    if real_num is not None and real_num < 2:
        raise EvaluationError(f"the number of real images must be >= 2, got {real_num}")
    if split not in SPLITS:
        raise EvaluationError(f"unknown split {split!r} (choose from {', '.join(SPLITS)})")
    if kid_subsets < 1 or kid_subset_size < 2:
        raise EvaluationError("KID needs >= 1 subset of >= 2 images")


def evaluate_checkpoint(
    source: str | os.PathLike,
    num: int = 5000,
    steps: int = 20,
    eta: float = 0.0,
    seed: int = 0,
    batch_size: int = 64,
    real_num: int | None = None,
    split: str = "val",
    weights: str | os.PathLike | None = None,
    feature_extractor_factory: FeatureFactory | None = None,
    *,
    workdir: str | os.PathLike | None = None,
    kid_subsets: int = 100,
    kid_subset_size: int = 1000,
    feature_batch_size: int = 32,
    log: Callable[[str], None] | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """KID and FID of ``num`` images generated by a checkpoint against the real ``split`` images.

    ``source`` is a work directory or a checkpoint step directory (as for
    :func:`ddim.sampling.load`). ``feature_extractor_factory(image_size)``
    replaces InceptionV3 (tests only); otherwise the weights are resolved by
    :func:`resolve_weights` before anything else. The record is appended as one
    JSON line to ``<workdir>/eval.jsonl`` (``workdir`` defaults to the
    checkpoint's work directory, which also holds the real-feature cache) and
    returned, with ``eval_file`` added.
    """
    started = time.perf_counter()
    log = log or _log_stderr
    _check_settings(num, steps, eta, batch_size, real_num, split, kid_subsets, kid_subset_size)
    factory = feature_extractor_factory or inception_factory(weights, feature_batch_size, log=log)

    from ddim.sampling import load
    from ddim.summary import Progress

    pipe = load(source)
    workdir = Path(workdir) if workdir is not None else workdir_of(pipe.path)
    cache_dir = _prepare_workdir(workdir)
    expression = split_expression(pipe.config, split)
    log(f"checkpoint {pipe.path} (step {pipe.step}, config {pipe.config.name})")

    kid_net, fid_net = factory(KID_IMAGE_SIZE), factory(FID_IMAGE_SIZE)
    real_kid, real_fid = real_features(pipe.config, split, real_num, [kid_net, fid_net], cache_dir, log, show_progress)

    progress = Progress(num, 0, description="eval") if show_progress else None
    generation_started = time.perf_counter()

    def generate(count: int, seed_: int) -> np.ndarray:
        return pipe.generate(count, steps=steps, seed=seed_, eta=eta, batch_size=count)

    def on_batch(done: int) -> None:
        if progress is not None:
            progress.update(done, "")

    try:
        gen_kid, gen_stats = generated_features(generate, num, batch_size, seed, kid_net, fid_net, on_batch)
    finally:
        if progress is not None:
            progress.close()
    log(f"generated and featurised {num} images in {time.perf_counter() - generation_started:.1f}s")

    subset_size = min(kid_subset_size, len(real_kid), len(gen_kid))
    kid_mean, kid_std = metrics.kid(real_kid, gen_kid, kid_subsets, subset_size, rng=seed % 2**32)
    fid = metrics.fid_from_features_and_stats(real_fid, *gen_stats)

    record: dict[str, Any] = {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": str(pipe.path),
        "step": pipe.step,
        "config": pipe.config.name,
        "steps": steps,
        "eta": float(eta),
        "seed": seed,
        "num": num,
        "real_num": int(len(real_kid)),
        "split": split,
        "split_expression": expression,
        "kid_mean": kid_mean,
        "kid_std": kid_std,
        "kid_subsets": kid_subsets,
        "kid_subset_size": subset_size,
        "kid_image_size": kid_net.image_size,
        "fid": fid,
        "fid_image_size": fid_net.image_size,
        "kid_feature_net": kid_net.identity,
        "fid_feature_net": fid_net.identity,
        "wall_time_s": round(time.perf_counter() - started, 3),
    }
    eval_file = workdir / EVAL_FILE
    try:
        append_record(eval_file, record)
    except OSError as error:
        raise EvaluationError(f"cannot write {eval_file}: {error.strerror or error}") from None
    return {**record, "eval_file": str(eval_file)}


def format_table(result: dict[str, Any]) -> str:
    """A small two-column text table of an evaluation result."""
    rows = [
        ("checkpoint", f"{result['checkpoint']} (step {result['step']})"),
        (
            "generated",
            f"{result['num']} images, {result['steps']} steps, eta {result['eta']:g}, seed {result['seed']}",
        ),
        ("real", f"{result['real_num']} images of the {result['split']} split ({result['split_expression']})"),
        (
            f"KID ({result['kid_image_size']}px)",
            f"{result['kid_mean']:.4g} ± {result['kid_std']:.2g} "
            f"({result['kid_subsets']} subsets of {result['kid_subset_size']})",
        ),
        (f"FID ({result['fid_image_size']}px)", f"{result['fid']:.2f}"),
        ("wall time", f"{result['wall_time_s']:.1f}s"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
