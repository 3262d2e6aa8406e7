"""Feature-network speed for FID: the Flax FID Inception (JAX) against Keras' InceptionV3 (TensorFlow, CPU).

Run:  python -m benchmarks.speed.fid_bench [--num 256] [--batch-size 32] [--image-size 64] [--out result.json]

Both networks featurise the same ``--num`` uint8 images of ``--image-size`` (resized to 299x299 inside each
network's own preprocessing), ``--batch-size`` at a time, after one warm-up batch that pays for compilation
(timed separately). Keras' official weights need a download, so on an offline machine its network runs with
random weights (``weights=None``): the arithmetic, hence the time, is the same. The FID Inception uses the
converted standard weights when they are found, random weights of the same shapes otherwise. Prints one JSON
object with images/s of each, their ratio, the compile/warm-up seconds and the machine's load average.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import ddim  # noqa: F401  (sets the XLA flags before JAX starts)
from ddim import runtime

from benchmarks.common import print_json

if __name__ == "__main__":
    runtime.restart_with_fast_allocator()  # the allocator the `ddim` command runs with

import numpy as np  # noqa: E402  (after the restart, which must come before anything heavy)


def flax_extractor(batch_size: int):
    from ddim.evaluation import fid_inception, fid_weights
    from ddim.evaluation.features import EvaluationError

    try:
        path = fid_weights.resolve_fid_weights(download=False, log=lambda message: None)
        return fid_inception.FIDInceptionExtractor.from_file(path, batch_size=batch_size), "standard weights"
    except EvaluationError:
        shapes = fid_inception.expected_shapes()
        rng = np.random.default_rng(0)
        weights = {n: rng.standard_normal(s, dtype=np.float32) * 0.05 for n, s in shapes.items()}
        weights.update({n: np.ones(s, np.float32) for n, s in shapes.items() if n.endswith(".var")})
        return fid_inception.FIDInceptionExtractor(weights, "random", batch_size), "random weights"


def keras_extractor(batch_size: int):
    from ddim.evaluation import keras_inception

    try:
        path = keras_inception.resolve_weights(download=False)
        return keras_inception.KerasFeatureExtractor.inception(299, path, batch_size=batch_size), "ImageNet weights"
    except keras_inception.EvaluationError:
        _, keras = keras_inception.tf_keras()
        model = keras.applications.InceptionV3(include_top=False, weights=None, pooling="avg",
                                               input_shape=(299, 299, 3))
        return keras_inception.KerasFeatureExtractor(model, 299, "keras-random", batch_size), "random weights (offline)"


def measure(extractor, images: np.ndarray, batch_size: int) -> dict:
    started = time.perf_counter()
    extractor(images[:batch_size])  # compiles (JAX) or traces (tf.function)
    warmup = time.perf_counter() - started
    started = time.perf_counter()
    features = extractor(images)
    seconds = time.perf_counter() - started
    assert features.shape == (len(images), 2048)
    return {"images_per_second": round(len(images) / seconds, 2), "seconds": round(seconds, 1),
            "warmup_seconds": round(warmup, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import jax

    images = np.random.default_rng(0).integers(0, 256, (args.num, args.image_size, args.image_size, 3), np.uint8)
    result = {"num": args.num, "batch_size": args.batch_size, "image_size": args.image_size,
              "backend": jax.default_backend(), "devices": jax.device_count(),
              "load_average_before": os.getloadavg()}
    for name, build in (("flax_fid_inception", flax_extractor), ("keras_inception_v3_tf", keras_extractor)):
        extractor, weights = build(args.batch_size)
        result[name] = {"weights": weights, **measure(extractor, images, args.batch_size)}
    result["flax_speedup"] = round(
        result["flax_fid_inception"]["images_per_second"] / result["keras_inception_v3_tf"]["images_per_second"], 2
    )
    result["load_average_after"] = os.getloadavg()
    print_json(result, args.out)


if __name__ == "__main__":
    main()
