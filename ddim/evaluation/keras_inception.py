"""Keras' ImageNet InceptionV3 as a feature network: its weights file, the network, its preprocessing.

InceptionV3 without its top, global average pooled (2048-d features), with the
ImageNet weights file ``inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5``
(found as :func:`resolve_weights` says, never replaced by random weights).
Images are resized in TensorFlow (bilinear, antialiased) and scaled with
``inception_v3.preprocess_input``, as in the Keras DDIM example; it runs in
TensorFlow on the CPU (:func:`ddim.data.tensorflow`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import urllib.request
from pathlib import Path

import numpy as np

from ddim.evaluation.features import EvaluationError, FeatureExtractor, FeatureFactory, KID_IMAGE_SIZE

WEIGHTS_FILE = "inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5"
WEIGHTS_URL = "https://storage.googleapis.com/tensorflow/keras-applications/inception_v3/" + WEIGHTS_FILE
WEIGHTS_MD5 = "bcbd6486424b2319ff4ef7d526e38f63"
"""The md5 Keras checks the downloaded file against (``keras.applications.InceptionV3``)."""
WEIGHTS_ENV = "DDIM_INCEPTION_WEIGHTS"


def keras_models_dir() -> Path:
    """Keras' download cache for application weights: ``$KERAS_HOME/models`` or ``~/.keras/models``."""
    home = os.environ.get("KERAS_HOME")
    if home:
        return Path(home).expanduser() / "models"
    base = Path.home()
    if not os.access(base, os.W_OK):  # Keras falls back to /tmp/.keras, so do we
        base = Path("/tmp")
    return base / ".keras" / "models"


EVAL_OPTION = "--inception-weights"
"""How ``ddim eval`` is given the weights file (the default of the functions below)."""
TRAIN_OPTION = "train.inception_weights"
"""How training's KID monitor is: a config key, which ``ddim train`` sets with ``--set``."""


def _user(option: str) -> str:
    """Who needs the weights that ``option`` names."""
    return "ddim eval" if option == EVAL_OPTION else "KID monitoring"


def _how_to_pass(option: str) -> str:
    """How a user gives the weights file by ``option``: a command's option, or a config key."""
    return f"{option} PATH" if option.startswith("--") else f"--set {option}=PATH"


def _what_to_get(option: str) -> str:
    return f"{_user(option)} needs Keras' {WEIGHTS_FILE} ({WEIGHTS_URL})"


def missing_weights_message(reason: str | None = None, option: str = EVAL_OPTION) -> str:
    """The one-line explanation of where the InceptionV3 weights must go; ``option`` is how the command at hand
    is given them (:data:`EVAL_OPTION`, :data:`TRAIN_OPTION`)."""
    message = (
        f"InceptionV3 weights not found: {_user(option)} needs {WEIGHTS_FILE} (from {WEIGHTS_URL}); "
        f"put it in {keras_models_dir()}/, or pass {_how_to_pass(option)}, or set {WEIGHTS_ENV}=PATH"
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


def _check_weights_file(path: Path, origin: str, option: str) -> Path:
    if not path.is_file():
        raise EvaluationError(f"InceptionV3 weights file {path} (from {origin}) does not exist; {_what_to_get(option)}")
    if path.suffix.lower() not in (".h5", ".hdf5"):
        raise EvaluationError(f"InceptionV3 weights file {path} (from {origin}) is not an .h5 file; "
                              f"{_what_to_get(option)}")
    return path


def resolve_weights(weights: str | os.PathLike | None = None, download: bool = True,
                    option: str = EVAL_OPTION) -> Path:
    """The InceptionV3 weights file to use, or :class:`EvaluationError` with one line saying where to put it.

    Order: ``weights`` (given by ``option``: ``--inception-weights``, or training's
    ``train.inception_weights``), ``$DDIM_INCEPTION_WEIGHTS``,
    Keras' cache (``~/.keras/models/`` + :data:`WEIGHTS_FILE`, or
    ``$KERAS_HOME/models/``), then a download into that cache (which fails
    offline). An explicit path that does not exist is an error, never a reason
    to look elsewhere.
    """
    if weights is not None and str(weights):
        return _check_weights_file(Path(weights).expanduser(), option, option)
    env = os.environ.get(WEIGHTS_ENV)
    if env:
        return _check_weights_file(Path(env).expanduser(), f"${WEIGHTS_ENV}", option)
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
    raise EvaluationError(missing_weights_message(reason, option))


def file_md5(path: str | os.PathLike) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


class KerasFeatureExtractor(FeatureExtractor):
    """A Keras image network as a :class:`FeatureExtractor`.

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

    def features(self, images: np.ndarray) -> np.ndarray:
        return np.asarray(self._features(self._tf.convert_to_tensor(images)), dtype=np.float32)


def inception_factory(weights: str | os.PathLike | None = None, batch_size: int = 32, log=None,
                      option: str = EVAL_OPTION) -> FeatureFactory:
    """``factory(image_size) -> FeatureExtractor`` for InceptionV3 with the resolved weights.

    Resolves the weights file now (:func:`resolve_weights`), so a missing file
    fails before any expensive work. Warns through ``log`` when the file is not
    the official Keras one (scores would not be comparable with others').
    """
    path = resolve_weights(weights, option=option)
    digest = file_md5(path)
    if digest != WEIGHTS_MD5 and log is not None:
        log(
            f"warning: {path} is not the official Keras {WEIGHTS_FILE} (md5 {digest}, expected {WEIGHTS_MD5}); "
            "scores are not comparable with published ones"
        )

    def factory(image_size: int) -> KerasFeatureExtractor:
        identity = f"keras-inception_v3-notop-avg@{image_size}px:md5={digest}"
        return KerasFeatureExtractor.inception(image_size, path, batch_size=batch_size, identity=identity)

    return factory


def kid_feature_extractor(weights: str | os.PathLike | None = None, batch_size: int = 32,
                          option: str = TRAIN_OPTION) -> KerasFeatureExtractor:
    """Training's KID network (InceptionV3 at 75x75), with the weights of the config key ``option``; raises
    :class:`EvaluationError` without weights (saying how to give them)."""
    return inception_factory(weights, batch_size, option=option)(KID_IMAGE_SIZE)


