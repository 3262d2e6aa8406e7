"""Generate the images `ddim eval` would score, and save them as .npz files to score on another machine.

A GPU machine may lack TensorFlow or the FID Inception's weights. This makes there exactly the images
`ddim eval --num N --steps S --seed SEED --batch-size B` generates (batch i is ``generate(B, batch_seed(SEED, i))``
with the classes drawn from that seed as the training data has them, DDIM on the uniform grid, eta 0, guidance 1
or ``--guidance``, as ``ddim eval --guidance``)
and saves them with their asked class ids in chunks (``samples-0.npz``, ...: ``images`` uint8 NHWC, ``classes``
int); `benchmarks/fid_of_samples.py` scores them where the weights are, as `ddim eval` would.

Run:  python benchmarks/generate_eval_samples.py RUN_OR_CHECKPOINT --num 5000 --out DIR [--steps 20] [--chunk 1250]
          [--guidance 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="a work directory, checkpoint step directory or pretrained:NAME")
    parser.add_argument("--num", type=int, default=5000, help="images (ddim eval's --num)")
    parser.add_argument("--out", required=True, help="directory for samples-*.npz")
    parser.add_argument("--steps", type=int, default=20, help="sampling steps (ddim eval's --steps)")
    parser.add_argument("--seed", type=int, default=0, help="ddim eval's --seed")
    parser.add_argument("--batch-size", type=int, default=64, help="ddim eval's --batch-size (the seeds are per batch)")
    parser.add_argument("--guidance", type=float, default=None,
                        help="classifier-free guidance scale (ddim eval's --guidance; default: none, i.e. 1)")
    parser.add_argument("--chunk", type=int, default=1250, help="images per .npz file (keeps files small to move)")
    args = parser.parse_args(argv)

    import ddim
    from ddim.evaluation.generated import batch_seed
    from ddim.spec import SamplingSpec

    pipe = ddim.load(args.checkpoint)
    spec = SamplingSpec(steps=args.steps, guidance=args.guidance)
    images, classes, started = [], [], time.perf_counter()
    for index, first in enumerate(range(0, args.num, args.batch_size)):
        count = min(args.batch_size, args.num - first)
        seed = batch_seed(args.seed, index)
        # The classes generate() draws from this seed when given none (what ddim eval records as asked).
        asked = pipe.class_ids(None, count, seed) if pipe.classes else np.full(count, -1, np.int32)
        images.append(pipe.generate(count, spec=spec, seed=seed, batch_size=count,
                                    classes=asked if pipe.classes else None))
        classes.append(np.asarray(asked, np.int32))
    images, classes = np.concatenate(images), np.concatenate(classes)
    print(f"generated {args.num} images in {time.perf_counter() - started:.1f}s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for part, first in enumerate(range(0, args.num, args.chunk)):
        paths.append(out / f"samples-{part}.npz")
        np.savez_compressed(paths[-1], images=images[first:first + args.chunk], classes=classes[first:first + args.chunk])
    return paths


if __name__ == "__main__":
    main()
