"""Sample quality: feature networks, KID/FID maths, real and generated features, the eval job.

- :mod:`~ddim.evaluation.features`: the :class:`FeatureExtractor` interface every network implements.
- :mod:`~ddim.evaluation.fid_inception`: the standard FID Inception (2015-12-05 TF graph, pool3) in Flax.
- :mod:`~ddim.evaluation.fid_weights`: its weights: found, read without PyTorch, converted once, checked.
- :mod:`~ddim.evaluation.keras_inception`: Keras' InceptionV3 (weights file, network, preprocessing).
- :mod:`~ddim.evaluation.metrics`: KID and FID on feature vectors (numpy only).
- :mod:`~ddim.evaluation.reference`: the real images and the cache of their features.
- :mod:`~ddim.evaluation.generated`: features of generated images, and the cheap KID of training.
- :mod:`~ddim.evaluation.job`: ``evaluate_checkpoint`` (``ddim eval``), its record and table.

TensorFlow loads only when a Keras network is built; JAX only when the FID Inception is.
"""

from ddim.evaluation.features import (
    FID_IMAGE_SIZE,
    KID_IMAGE_SIZE,
    EvaluationError,
    FeatureExtractor,
    FeatureFactory,
)
from ddim.evaluation.generated import batch_seed, cheap_kid, generated_features
from ddim.evaluation.job import EVAL_FILE, NETWORKS, append_record, evaluate_checkpoint, format_table, workdir_of
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
    load_real_stats,
    real_cache_key,
    real_features,
    select_real,
    split_expression,
)

__all__ = [
    "CACHE_DIR",
    "EVAL_FILE",
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
    "evaluate_checkpoint",
    "file_md5",
    "format_table",
    "generated_features",
    "inception_factory",
    "kid_feature_extractor",
    "load_real_stats",
    "real_cache_key",
    "real_features",
    "resolve_weights",
    "select_real",
    "split_expression",
    "tf_keras",
    "workdir_of",
]
