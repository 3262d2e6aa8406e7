"""Sample quality: feature networks, KID/FID maths, real and generated features, the eval job.

- :mod:`~ddim.evaluation.features`: the :class:`FeatureExtractor` interface every network implements.
- :mod:`~ddim.evaluation.fid_network`: the standard FID Inception (2015-12-05 TF graph, pool3) in Flax.
- :mod:`~ddim.evaluation.torch_reader`: PyTorch files read without PyTorch (a restricted unpickler).
- :mod:`~ddim.evaluation.fid_weight_names`: the FID Inception's weights under one set of names, and their digest.
- :mod:`~ddim.evaluation.fid_weights`: its weights: found, converted once, checked.
- :mod:`~ddim.evaluation.fid_inception`: the network with its weights as a feature extractor (``standard_factory``).
- :mod:`~ddim.evaluation.keras_inception`: Keras' InceptionV3 (weights file, network, preprocessing).
- :mod:`~ddim.evaluation.metrics`: KID and FID on feature vectors (numpy only).
- :mod:`~ddim.evaluation.reference`: the real images and the cache of their features (and labels).
- :mod:`~ddim.evaluation.class_consistency`: the classifier of the class accuracy (pure numpy).
- :mod:`~ddim.evaluation.conditional`: what a class-conditional checkpoint adds (class mode, class accuracy).
- :mod:`~ddim.evaluation.generated`: features of generated images, and the cheap KID of training.
- :mod:`~ddim.evaluation.request`: :class:`EvalRequest`, what one evaluation is asked to do.
- :mod:`~ddim.evaluation.job`: :func:`evaluate` runs a request (``ddim eval``).
- :mod:`~ddim.evaluation.record`: the table of an ``eval.jsonl`` line (appended by :mod:`ddim.workdir.records`).

TensorFlow loads only when a Keras network is built; JAX only when the FID Inception is.
"""

from ddim.evaluation.features import (
    FID_IMAGE_SIZE,
    KID_IMAGE_SIZE,
    EvaluationError,
    FeatureExtractor,
    FeatureFactory,
)
from ddim.evaluation.generated import CHEAP_KID_SPEC, batch_seed, cheap_kid, generated_features
from ddim.evaluation.job import evaluate, evaluate_checkpoint, workdir_of
from ddim.evaluation.keras_inception import (
    WEIGHTS_ENV,
    WEIGHTS_FILE,
    WEIGHTS_MD5,
    WEIGHTS_URL,
    KerasFeatureExtractor,
    file_md5,
    inception_factory,
    kid_feature_extractor,
    resolve_weights,
    tf_keras,
)
from ddim.evaluation.reference import (
    CACHE_DIR,
    SPLITS,
    labelled_real_features,
    load_real_stats,
    real_cache_key,
    real_features,
    select_real,
    split_expression,
)
from ddim.evaluation.record import format_table
from ddim.evaluation.request import NETWORKS, EvalRequest
from ddim.workdir.layout import EVAL_FILE
from ddim.workdir.records import append_record

__all__ = [
    "CACHE_DIR",
    "CHEAP_KID_SPEC",
    "EVAL_FILE",
    "EvalRequest",
    "EvaluationError",
    "FID_IMAGE_SIZE",
    "FeatureExtractor",
    "FeatureFactory",
    "KID_IMAGE_SIZE",
    "KerasFeatureExtractor",
    "NETWORKS",
    "SPLITS",
    "WEIGHTS_ENV",
    "WEIGHTS_FILE",
    "WEIGHTS_MD5",
    "WEIGHTS_URL",
    "append_record",
    "batch_seed",
    "cheap_kid",
    "evaluate",
    "evaluate_checkpoint",
    "file_md5",
    "format_table",
    "generated_features",
    "inception_factory",
    "kid_feature_extractor",
    "labelled_real_features",
    "load_real_stats",
    "real_cache_key",
    "real_features",
    "resolve_weights",
    "select_real",
    "split_expression",
    "tf_keras",
    "workdir_of",
]
