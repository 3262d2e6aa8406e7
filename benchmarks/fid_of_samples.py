"""FID, KID and class accuracy of images generated on another machine, scored here as `ddim eval` scores.

A GPU machine without TensorFlow or the FID Inception's weights can still generate exactly what `ddim eval`
would (`benchmarks/generate_eval_samples.py`: the same batches of 64, seeds and classes, saved as .npz).
This scores those images with `ddim eval`'s pieces: the standard FID Inception, the real images' features
(cached in OUT/eval_cache, shared with `ddim eval --workdir OUT`), `metrics.fid`/`metrics.kid`, and the
class-consistency classifier fitted on the real training images. The generated features are cached beside
them, so scoring the first 1,000 and all 5,000 images featurises each image once.

Run:  python benchmarks/fid_of_samples.py samples-*.npz --checkpoint RUN/checkpoints/STEP --out EVAL_ROOT \
          [--config flowers64-fast --set model.class_conditional=true] [--split all] [--num 1000 5000]

The real images are the checkpoint's own data, as for `ddim eval`, or --config's (a model trained on a folder
exported from a dataset is scored against the dataset itself: Oxford Flowers 102 from TFDS at the checkpoint's
size); real class labels are matched to the model's classes by name, as `ddim eval` does. Appends one JSON line
per --num to OUT/samples_eval.jsonl.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load_samples(paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The images and asked class ids of the .npz files, in the order given (as they were generated)."""
    images, classes = [], []
    for path in paths:
        with np.load(path) as data:
            images.append(data["images"] if "images" in data else decode_webp(data["webp"], data["offsets"]))
            classes.append(data["classes"])
    return np.concatenate(images), np.concatenate(classes)


def load_setting(paths: list[str]) -> dict:
    """The sampling setting the .npz files were generated at (``generate_eval_samples.py`` stores it), or {}."""
    settings = []
    for path in paths:
        with np.load(path) as data:
            settings.append(json.loads(str(data["setting"])) if "setting" in data else {})
    if any(setting != settings[0] for setting in settings):
        raise SystemExit("error: the sample files were generated at different settings")
    return settings[0] if settings else {}


def decode_webp(files: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The uint8 NHWC images of ``generate_eval_samples.py --encoding webp``: lossless WebP files end to end."""
    import io

    from PIL import Image

    data = files.tobytes()
    return np.stack([np.asarray(Image.open(io.BytesIO(data[start:end])).convert("RGB"))
                     for start, end in zip(offsets[:-1], offsets[1:])])


def cached_generated_features(images: np.ndarray, extractor, cache: Path) -> np.ndarray:
    """FID features of ``images``, cached by the images' digest and the network's identity."""
    key = hashlib.sha256(images.tobytes() + extractor.identity.encode()).hexdigest()[:16]
    path = cache / f"generated-{key}.npy"
    if path.exists():
        return np.load(path)
    from ddim.evaluation.features import extract_with_progress

    features = extract_with_progress(extractor, images, "generated", sys.stderr.isatty())
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, features)
    return features


def real_features(config, split: str, extractor, eval_cache: Path, data_cache) -> tuple[np.ndarray, np.ndarray]:
    """The FID features and labels of ``config``'s real ``split``, cached in ``eval_cache`` as ``ddim eval`` does."""
    from ddim.evaluation.reference import labelled_real_features

    (features,), labels = labelled_real_features(config, split, None, [extractor], eval_cache, print, False,
                                                 data_cache)
    return features, labels


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("samples", nargs="+", help=".npz files with 'images' (uint8 NHWC) and 'classes'")
    parser.add_argument("--checkpoint", required=True, help="the checkpoint that generated them (class names, step)")
    parser.add_argument("--config", help="a config whose data are the real images (default: the checkpoint's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    parser.add_argument("--split", default="val", help="real images: val (default, as ddim eval), train or all")
    parser.add_argument("--num", type=int, nargs="+", default=None, help="score the first N images (default: all)")
    parser.add_argument("--out", required=True, help="eval root: eval_cache/ and samples_eval.jsonl go there")
    parser.add_argument("--note", default="", help="how the samples were made (recorded as given)")
    parser.add_argument("--steps", type=int, help="the sampling steps they were made with (default: as stored)")
    parser.add_argument("--sampler", help="their sampler (default: as stored in the files, else ddim)")
    parser.add_argument("--spacing", help="their time grid (default: as stored in the files, else uniform)")
    parser.add_argument("--guidance", type=float, help="their guidance scale (default: as stored, else none)")
    args = parser.parse_args(argv)

    import ddim
    from ddim.data import cache_root
    from ddim.evaluation import class_consistency, metrics
    from ddim.evaluation.fid_inception import standard_factory
    from ddim.spec import SamplingSpec
    from ddim.workdir import Workdir
    from ddim.workdir.records import append_record

    pipe = ddim.load(args.checkpoint)
    config = ddim.load_config(args.config, args.overrides) if args.config else pipe.config
    root = Workdir(args.out)
    root.eval_cache.mkdir(parents=True, exist_ok=True)
    extractor = standard_factory(None, 64, log=print)(299)
    data_cache = cache_root(config, args.out)

    images, asked = load_samples(args.samples)
    # The setting, in ddim eval's eval.jsonl fields, so the lines read as ddim eval's (records, sweeps).
    stored = load_setting(args.samples)
    seed, batch_size = stored.pop("seed", 0), stored.pop("batch_size", 64)
    spec = SamplingSpec.of(SamplingSpec(**stored), steps=args.steps, sampler=args.sampler, spacing=args.spacing,
                           guidance=args.guidance)
    setting = {**spec.to_dict(), "seed": seed, "batch_size": batch_size}
    real_all, _ = real_features(config, args.split, extractor, root.eval_cache, data_cache)
    started = time.perf_counter()
    features = cached_generated_features(images, extractor, root.eval_cache)
    print(f"featurised {len(images)} generated images in {time.perf_counter() - started:.0f}s")

    accuracy = ceiling = None
    if pipe.classes:  # the classifier ddim eval fits, on the real training images' labels as the model's ids
        from ddim.evaluation.conditional import ClassPlan, fit_on_real

        plan = ClassPlan(tuple(pipe.classes), None, 1.0)
        fitted = fit_on_real(plan, config, extractor, root.eval_cache, print, False, data_cache)
        ceiling, predicted = fitted.val_accuracy, class_consistency.predict(fitted.classifier, features)

    named = args.checkpoint.startswith("pretrained:")
    checkpoint = args.checkpoint if named else str(Path(args.checkpoint).resolve())
    records = []
    for num in args.num or [len(images)]:
        if num > len(images):
            raise SystemExit(f"error: --num {num} but only {len(images)} images were given")
        # ddim eval's KID: 100 subsets of at most 1,000 images, drawn with the seed (0)
        subset = min(1000, len(real_all), num)
        kid_mean, kid_std = metrics.kid(real_all, features[:num], num_subsets=100, subset_size=subset, rng=0)
        if pipe.classes:
            accuracy = class_consistency.accuracy(predicted[:num], asked[:num])
        record = {
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "checkpoint": checkpoint, "step": pipe.step, **setting, "num": num, "split": args.split,
            "real_num": len(real_all),
            "fid": metrics.fid(real_all, features[:num]), "kid": kid_mean, "kid_mean": kid_mean, "kid_std": kid_std,
            "class_accuracy": accuracy, "class_accuracy_ceiling": ceiling, "real_val_class_accuracy": ceiling,
            "real": f"{config.data.image_dir or config.data.dataset} {args.split} ({len(real_all)} images) at "
                    f"{config.model.image_size}px",
            "fid_net": extractor.identity, "note": args.note,
        }
        records.append(record)
        print(json.dumps(record))
        append_record(Path(args.out) / "samples_eval.jsonl", record)
    return records


if __name__ == "__main__":
    main()
