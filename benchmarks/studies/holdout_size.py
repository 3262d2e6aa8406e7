"""How many held-out images does a folder need before scoring against them means something?

``ddim eval`` scores a run on an image folder against its held-out images (``data.val_fraction``, 20 %). With few
of them the score is mostly chance: this measures KID between two disjoint sets of the folder's own real images
(the score a perfect model would get, 0 on average) for held-out sets of several sizes, and reports its spread
across random draws. Where that spread is as large as the gap between a poor and a good model, holding images
out buys nothing and costs the model a fifth of its data: ``data.holdout_min_images`` in the fine-tune configs
is set from it (docs/own-images.md).

Run (from a clone of the repository):
      python -m benchmarks.studies.holdout_size FOLDER --out DIR [--sizes 4 10 20 40 100] [--reference 200] [--draws 50]

Features are the standard FID Inception's (DDIM_FID_WEIGHTS, docs/evaluation.md), cached in DIR/eval_cache;
one JSON line per size goes to DIR/holdout_size.jsonl.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.samples import real_features


def kid_spread(features: np.ndarray, sizes: list[int], reference: int, draws: int, seed: int = 0) -> list[dict]:
    """For each held-out size: KID (unbiased MMD^2, all pairs of one draw) between that many images and a
    disjoint reference set, over ``draws`` random draws: its mean and standard deviation."""
    from ddim.evaluation.metrics import mmd2_unbiased

    rng = np.random.default_rng(seed)
    rows = []
    for size in sizes:
        if size + reference > len(features):
            raise SystemExit(f"error: {len(features)} images are too few for {size} held out and {reference} more")
        values = []
        for _ in range(draws):
            order = rng.permutation(len(features))
            values.append(mmd2_unbiased(features[order[:size]], features[order[size:size + reference]]))
        rows.append({"held_out": size, "reference": reference, "draws": draws,
                     "kid_mean": float(np.mean(values)), "kid_std": float(np.std(values))})
    return rows


def main(argv: list[str] | None = None, feature_extractor_factory=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", help="an image folder (read as ddim train --data reads it)")
    parser.add_argument("--out", required=True, help="eval root: eval_cache/ and holdout_size.jsonl go there")
    parser.add_argument("--config", default="finetune32", help="the config whose image size to read it at")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 10, 20, 40, 100])
    parser.add_argument("--reference", type=int, default=200, help="images of the disjoint reference set")
    parser.add_argument("--draws", type=int, default=50)
    args = parser.parse_args(argv)

    from ddim.data import cache_root
    from ddim.evaluation.fid_inception import standard_factory
    from ddim.train import load_run_config
    from ddim.workdir import Workdir
    from ddim.workdir.records import append_record

    config = load_run_config(args.config, [f"data.image_dir={json.dumps(str(Path(args.folder).resolve()))}",
                                           "data.val_fraction=0.0", "data.holdout_min_images=0"])
    root = Workdir(args.out)
    root.eval_cache.mkdir(parents=True, exist_ok=True)
    extractor = (feature_extractor_factory or standard_factory(None, 64, log=print))(299)
    features = real_features(config, "train", extractor, root.eval_cache, cache_root(config, args.out))[0]
    rows = kid_spread(features, args.sizes, args.reference, args.draws)
    for row in rows:
        row.update(folder=str(Path(args.folder).resolve()), image_size=config.model.image_size,
                   fid_net=extractor.identity)
        print(json.dumps(row))
        append_record(Path(args.out) / "holdout_size.jsonl", row)
    return rows


if __name__ == "__main__":
    main()
