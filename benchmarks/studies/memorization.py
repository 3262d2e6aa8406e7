"""Does a model copy its training images? Its samples against its own training and held-out images, set for set.

A model that memorises makes samples closer to the images it trained on than to images of the same kind that
it never saw. For samples of a checkpoint (.npz files as benchmarks.release.generate_eval_samples writes them),
this compares, in the standard FID Inception's feature space:

- FID against the checkpoint's held-out split (``val``: for an image folder the hash split it never trained
  on) and against random subsets of its training split of the same size, so both have the same small-set bias;
- each sample's distance to its nearest image in each set: the median ratio (1 for a model that does not copy,
  towards 0 for one that does) and the share of samples whose nearest image is a training one (0.5, towards 1);
- the same FIDs between real sets (a training subset against another, and against the held-out images): the
  gap that chance and the split alone give.

A run on a small folder holds nothing out (data.holdout_min_images): ``--held-out FOLDER`` names other images
of the same kind that it never saw, and the samples' nearest training image is compared with their nearest
image in random subsets of that folder of the training set's size (:func:`compare_small`); the record gives
the passes over the training images the checkpoint had made. FID is left out there: twenty images have no
meaningful covariance.

Run:  python -m benchmarks.studies.memorization samples-*.npz --checkpoint RUN/checkpoints/STEP --out EVAL_ROOT \
          [--subsets 3] [--num 5000] [--held-out FOLDER]

The real features are cached in OUT/eval_cache (shared with ``ddim eval --workdir OUT`` and
benchmarks.release.fid_of_samples); one JSON line goes to OUT/memorization.jsonl.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.samples import cached_generated_features, load_samples, real_features


def nearest_distances(features: np.ndarray, reference: np.ndarray, chunk: int = 1024) -> np.ndarray:
    """The Euclidean distance from each row of ``features`` to its nearest row of ``reference``."""
    reference = reference.astype(np.float64)
    squared_reference = (reference**2).sum(1)
    distances = []
    for start in range(0, len(features), chunk):  # chunks keep the distance matrix small
        rows = features[start:start + chunk].astype(np.float64)
        squared = (rows**2).sum(1)[:, None] - 2 * rows @ reference.T + squared_reference[None]
        distances.append(np.sqrt(np.maximum(squared.min(1), 0.0)))
    return np.concatenate(distances)


def compare(generated: np.ndarray, train: np.ndarray, held_out: np.ndarray, subsets: int = 3,
            seed: int = 0) -> dict:
    """Samples' features against the training features and the held-out ones, at the held-out set's size."""
    from ddim.evaluation import metrics

    size = len(held_out)
    if len(train) < 2 * size:
        raise SystemExit(f"error: {len(train)} training images are too few for two subsets the size of the "
                         f"{size} held-out ones")
    rng = np.random.default_rng(seed)
    # Each set's statistics once; FID is symmetric, and a training subset (fewer rows than feature dimensions,
    # as a real split often is) against given statistics takes metrics' cheaper low-rank path.
    generated_stats, held_out_stats = metrics.feature_stats(generated), metrics.feature_stats(held_out)
    fid_train, ratios, closer_to_train, real_train = [], [], [], []
    to_held_out = nearest_distances(generated, held_out)
    for _ in range(subsets):
        order = rng.permutation(len(train))
        first, second = train[order[:size]], train[order[size:2 * size]]
        fid_train.append(metrics.fid_from_features_and_stats(first, *generated_stats))
        to_train = nearest_distances(generated, first)
        ratios.append(float(np.median(to_train / np.maximum(to_held_out, 1e-12))))
        closer_to_train.append(float(np.mean(to_train < to_held_out)))
        real_train.append((metrics.fid(first, second), metrics.fid_from_features_and_stats(first, *held_out_stats)))
    return {
        "num": len(generated), "set_size": size, "subsets": subsets,
        "fid_held_out": metrics.fid_from_features_and_stats(held_out, *generated_stats),
        "fid_train": float(np.mean(fid_train)), "fid_train_spread": float(np.ptp(fid_train)),
        "median_distance_ratio": float(np.mean(ratios)), "share_closer_to_train": float(np.mean(closer_to_train)),
        "real_fid_train_vs_train": float(np.mean([pair[0] for pair in real_train])),
        "real_fid_train_vs_held_out": float(np.mean([pair[1] for pair in real_train])),
    }


def compare_small(generated: np.ndarray, train: np.ndarray, held_out: np.ndarray, subsets: int = 10,
                  seed: int = 0) -> dict:
    """Samples' features against all the training features and held-out subsets of the same size, for a
    training set too small to split: the median nearest-distance ratio (1 for a model that does not copy,
    towards 0 for one that does) and the share of samples nearer a training image (0.5, towards 1)."""
    size = len(train)
    if len(held_out) < size:
        raise SystemExit(f"error: {len(held_out)} held-out images are fewer than the {size} training images")
    rng = np.random.default_rng(seed)
    to_train = nearest_distances(generated, train)
    ratios, closer = [], []
    for _ in range(subsets):
        to_held_out = nearest_distances(generated, held_out[rng.permutation(len(held_out))[:size]])
        ratios.append(float(np.median(to_train / np.maximum(to_held_out, 1e-12))))
        closer.append(float(np.mean(to_train < to_held_out)))
    return {"num": len(generated), "set_size": size, "subsets": subsets,
            "median_distance_ratio": float(np.mean(ratios)), "share_closer_to_train": float(np.mean(closer))}


def main(argv: list[str] | None = None, feature_extractor_factory=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("samples", nargs="+", help=".npz files with 'images' (uint8 NHWC) and 'classes'")
    parser.add_argument("--checkpoint", required=True,
                        help="the checkpoint that generated them: its own data's train and val splits are compared")
    parser.add_argument("--out", required=True, help="eval root: eval_cache/ and memorization.jsonl go there")
    parser.add_argument("--num", type=int, default=None, help="use the first N samples (default: all)")
    parser.add_argument("--subsets", type=int, default=3, help="random training subsets to average over")
    parser.add_argument("--note", default="", help="how the samples were made (recorded as given)")
    parser.add_argument("--held-out", help="a folder of images of the same kind that the run never saw, for a run "
                        "that held none out: compared at the training set's size (compare_small)")
    args = parser.parse_args(argv)

    import ddim
    from ddim.data import cache_root
    from ddim.evaluation.fid_inception import standard_factory
    from ddim.workdir import Workdir
    from ddim.workdir.records import append_record

    pipe = ddim.load(args.checkpoint)
    config = pipe.config
    root = Workdir(args.out)
    root.eval_cache.mkdir(parents=True, exist_ok=True)
    factory = feature_extractor_factory or standard_factory(None, 64, log=print)
    extractor = factory(299)
    data_cache = cache_root(config, args.out)

    images, _ = load_samples(args.samples)
    generated = cached_generated_features(images[:args.num], extractor, root.eval_cache)
    train = real_features(config, "train", extractor, root.eval_cache, data_cache)[0]
    if args.held_out:
        other = config.override(f"data.image_dir={json.dumps(str(Path(args.held_out).resolve()))}",
                                "data.val_fraction=0.0", "data.holdout_min_images=0")
        held_out = real_features(other, "train", extractor, root.eval_cache, cache_root(other, args.out))[0]
        scores = {**compare_small(generated, train, held_out, max(args.subsets, 10)),
                  "passes": pipe.step * config.step_batch_size / len(train)}
    else:
        scores = compare(generated, train, real_features(config, "val", extractor, root.eval_cache, data_cache)[0],
                         args.subsets)
    record = {"checkpoint": str(Path(args.checkpoint).resolve()), "step": pipe.step, **scores,
              "real": f"{config.data.image_dir or config.data.dataset} at {config.model.image_size}px",
              "fid_net": extractor.identity, "note": args.note}
    print(json.dumps(record))
    append_record(Path(args.out) / "memorization.jsonl", record)
    return record


if __name__ == "__main__":
    main()
