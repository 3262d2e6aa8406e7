"""FID, KID and class accuracy of images generated on another machine, scored here as `ddim eval` scores.

A GPU machine without TensorFlow or the FID Inception's weights can still generate exactly what `ddim eval`
would (`benchmarks.release.generate_eval_samples`: the same batches of 64, seeds and classes, saved as .npz).
This scores those images with `ddim eval`'s pieces: the standard FID Inception, the real images' features
(cached in OUT/eval_cache, shared with `ddim eval --workdir OUT`), `metrics.fid`/`metrics.kid`, and the
class-consistency classifier fitted on the real training images. The generated features are cached beside
them, so scoring the first 1,000 and all 5,000 images featurises each image once.

Run:  python -m benchmarks.release.fid_of_samples samples-*.npz --checkpoint RUN/checkpoints/STEP --out EVAL_ROOT \
          [--config flowers64-fast --set model.class_conditional=true] [--split all] [--num 1000 5000]

The real images are the checkpoint's own data, as for `ddim eval`, or --config's (a model trained on a folder
exported from a dataset is scored against the dataset itself: Oxford Flowers 102 from TFDS at the checkpoint's
size); real class labels are matched to the model's classes by name, as `ddim eval` does. Appends one JSON line
per --num to OUT/samples_eval.jsonl.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.samples import cached_generated_features, load_samples, load_setting, real_features


def parse_args(argv: list[str] | None) -> argparse.Namespace:
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
    return parser.parse_args(argv)


def sample_setting(args: argparse.Namespace) -> dict:
    """The setting the samples were made at, in ``ddim eval``'s eval.jsonl fields, so that the lines read as
    ``ddim eval``'s (records, sweeps): as the files store it, with the options' values on top."""
    from ddim.spec import SamplingSpec

    stored = load_setting(args.samples)
    seed, batch_size = stored.pop("seed", 0), stored.pop("batch_size", 64)
    spec = SamplingSpec.of(SamplingSpec(**stored), steps=args.steps, sampler=args.sampler, spacing=args.spacing,
                           guidance=args.guidance)
    return {**spec.to_dict(), "seed": seed, "batch_size": batch_size}


def class_predictions(pipe, config, extractor, eval_cache: Path, data_cache, features):
    """The classifier ``ddim eval`` fits on the real training images (labels as the model's ids): its accuracy on
    the real validation images and its classes of ``features``; (None, None) for an unconditional model."""
    if not pipe.classes:
        return None, None
    from ddim.evaluation import class_consistency
    from ddim.evaluation.conditional import ClassPlan, fit_on_real

    plan = ClassPlan(tuple(pipe.classes), None, 1.0)
    fitted = fit_on_real(plan, config, extractor, eval_cache, print, False, data_cache)
    return fitted.val_accuracy, class_consistency.predict(fitted.classifier, features)


def score_first(num: int, features, real, predicted, asked, head: dict, tail: dict) -> dict:
    """The record of the first ``num`` samples: FID and KID against ``real``, and class accuracy."""
    from ddim.evaluation import class_consistency, metrics

    if num > len(features):
        raise SystemExit(f"error: --num {num} but only {len(features)} images were given")
    # ddim eval's KID: 100 subsets of at most 1,000 images, drawn with the seed (0)
    subset = min(1000, len(real), num)
    kid_mean, kid_std = metrics.kid(real, features[:num], num_subsets=100, subset_size=subset, rng=0)
    accuracy = None if predicted is None else class_consistency.accuracy(predicted[:num], asked[:num])
    return {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), **head, "num": num, **tail,
            "fid": metrics.fid(real, features[:num]), "kid": kid_mean, "kid_mean": kid_mean, "kid_std": kid_std,
            "class_accuracy": accuracy}


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    import ddim
    from ddim.data import cache_root
    from ddim.evaluation.fid_inception import standard_factory
    from ddim.workdir import Workdir
    from ddim.workdir.records import append_record

    pipe = ddim.load(args.checkpoint)
    config = ddim.load_config(args.config, args.overrides) if args.config else pipe.config
    root = Workdir(args.out)
    root.eval_cache.mkdir(parents=True, exist_ok=True)
    extractor = standard_factory(None, 64, log=print)(299)
    data_cache = cache_root(config, args.out)
    images, asked = load_samples(args.samples)
    real, _ = real_features(config, args.split, extractor, root.eval_cache, data_cache)
    started = time.perf_counter()
    features = cached_generated_features(images, extractor, root.eval_cache)
    print(f"featurised {len(images)} generated images in {time.perf_counter() - started:.0f}s")
    ceiling, predicted = class_predictions(pipe, config, extractor, root.eval_cache, data_cache, features)

    named = args.checkpoint.startswith("pretrained:")
    head = {"checkpoint": args.checkpoint if named else str(Path(args.checkpoint).resolve()), "step": pipe.step,
            **sample_setting(args)}
    tail = {"split": args.split, "real_num": len(real)}
    words = {"class_accuracy_ceiling": ceiling, "real_val_class_accuracy": ceiling,
             "real": f"{config.data.image_dir or config.data.dataset} {args.split} ({len(real)} images) at "
                     f"{config.model.image_size}px", "fid_net": extractor.identity, "note": args.note}
    records = []
    for num in args.num or [len(images)]:
        records.append({**score_first(num, features, real, predicted, asked, head, tail), **words})
        print(json.dumps(records[-1]))
        append_record(Path(args.out) / "samples_eval.jsonl", records[-1])
    return records


if __name__ == "__main__":
    main()
