"""Generate the images `ddim eval` would score, and save them as .npz files to score on another machine.

A GPU machine may lack TensorFlow or the FID Inception's weights. This makes there exactly the images
`ddim eval --num N --steps S --seed SEED --batch-size B` generates (batch i is ``generate(B, batch_seed(SEED, i))``
with the classes drawn from that seed as the training data has them, eta 0, and the sampler, time grid and
guidance given: DDIM on the uniform grid at guidance 1 unless ``--sampler``, ``--spacing``, ``--guidance`` say
otherwise, as the same options of ``ddim eval``)
and saves them with their asked class ids and the setting in chunks (``samples-0.npz``, ...: ``images`` uint8
NHWC, or with ``--encoding webp`` each image as lossless WebP; ``classes`` int; ``setting`` JSON);
`benchmarks.release.fid_of_samples` scores them where the weights are, as `ddim eval` would.

Run:  python -m benchmarks.release.generate_eval_samples RUN_OR_CHECKPOINT --num 5000 --out DIR [--steps 20]
          [--chunk 1250] [--guidance 2] [--sampler dpmpp-2m --spacing logsnr] [--encoding webp]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.samples import save_samples


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
    parser.add_argument("--sampler", default="ddim", help="ddim eval's --sampler (ddim, dpmpp-2m, dpmpp-3m, ...)")
    parser.add_argument("--spacing", default="uniform", help="ddim eval's --spacing (uniform, logsnr, karras)")
    parser.add_argument("--chunk", type=int, default=1250, help="images per .npz file (keeps files small to move)")
    parser.add_argument("--encoding", choices=["raw", "webp"], default="raw",
                        help="raw: uint8 arrays, deflated; webp: lossless WebP per image (about 35 %% smaller)")
    args = parser.parse_args(argv)

    import ddim
    from ddim.spec import SamplingSpec

    pipe = ddim.load(args.checkpoint)
    spec = SamplingSpec(steps=args.steps, sampler=args.sampler, spacing=args.spacing, guidance=args.guidance)
    started = time.perf_counter()
    images, classes = generate_like_eval(pipe, args.num, spec, args.seed, args.batch_size)
    print(f"generated {args.num} images in {time.perf_counter() - started:.1f}s")
    setting = {**spec.to_dict(), "seed": args.seed, "batch_size": args.batch_size}
    return save_samples(Path(args.out), "samples", images, classes, args.chunk, args.encoding, setting)


def generate_like_eval(pipe, num: int, spec, seed: int = 0, batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """The images ``ddim eval --num num --seed seed --batch-size batch_size`` generates at ``spec``, with the
    class ids they were asked for (-1 for an unconditional model)."""
    from ddim.evaluation.generated import batch_seed

    images, classes = [], []
    for index, first in enumerate(range(0, num, batch_size)):
        count = min(batch_size, num - first)
        batch = batch_seed(seed, index)
        # The classes generate() draws from this seed when given none (what ddim eval records as asked).
        asked = pipe.class_ids(None, count, batch) if pipe.classes else np.full(count, -1, np.int32)
        images.append(pipe.generate(count, spec=spec, seed=batch, batch_size=count,
                                    classes=asked if pipe.classes else None))
        classes.append(np.asarray(asked, np.int32))
    return np.concatenate(images), np.concatenate(classes)


if __name__ == "__main__":
    main()
