"""DDIM reconstruction error: invert validation images to latents, generate them back, per-dimension MSE.

Run:  python -m benchmarks.studies.reconstruction --checkpoint runs/flowers64/checkpoints/5000 [--num 256] \
          [--out bench-reconstruction/]

The measure of the DDIM paper's Table 2 (Song et al. 2020, section 5.4): the mean squared error per pixel and
channel on [0, 1] values between ``--num`` validation images (the checkpoint's ``data.val_split``,
preprocessed as in training) and ``Pipeline.reconstruct`` of them (deterministic DDIM inversion then
generation with the same time grid) at each of ``--steps``. Their CIFAR-10 numbers (32x32, a converged
model, a schedule whose clean end has signal rate ~1) are printed beside ours.

``--pretrained NAME`` measures a model bundled with ddim; without it or ``--checkpoint`` it trains
``ddim/configs/smoke.toml`` first and says so. Results are appended to
``<out>/reconstruction.jsonl`` (a rerun skips what is done) and a Markdown table is printed at the end.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import ddim  # sets the XLA flags before JAX starts
from ddim import runtime
from ddim.workdir.records import append_record, read_records

from benchmarks.common import add_model_options, log, model_source

if __name__ == "__main__":
    runtime.restart_with_fast_allocator()  # the allocator the `ddim` command runs with

# DDIM paper, Table 2: reconstruction error of CIFAR-10 test images (per-dimension MSE on [0, 1]).
DDIM_PAPER_CIFAR10 = {10: 0.014, 20: 0.0065, 50: 0.0023, 100: 0.0009}


def validation_images(config, num: int):
    """The first ``num`` images of the checkpoint's validation split, uint8, preprocessed as in training."""
    from ddim.data import load_split

    images = load_split(config, config.data.val_split)
    if len(images) < num:
        log(f"the validation split has only {len(images)} images; using them all")
    return images[:num]


def markdown_table(results: list[dict]) -> str:
    lines = [
        "| steps | MSE, this checkpoint (mean ± sd over images) | median | s/image | DDIM paper, CIFAR-10 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in sorted(results, key=lambda r: r["steps"]):
        paper = DDIM_PAPER_CIFAR10.get(r["steps"])
        lines.append(
            f"| {r['steps']} | {r['mse']:.4f} ± {r['mse_std']:.4f} | {r['mse_median']:.4f} | "
            f"{r['seconds_per_image']:.2f} | {paper if paper is not None else ''} |"
        )
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_options(parser)
    parser.add_argument("--num", type=int, default=256, help="validation images (default 256)")
    parser.add_argument("--steps", default="10,20,50,100", help="comma-separated step counts")
    parser.add_argument("--spacing", default="uniform")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench-reconstruction"), help="results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    import numpy as np

    pipe = ddim.load(model_source(args, args.out))
    log(f"checkpoint {pipe.path} (step {pipe.step}, config {pipe.config.name})")
    images = validation_images(pipe.config, args.num)
    common = {"checkpoint": str(pipe.path), "step": pipe.step, "num": len(images), "spacing": args.spacing}
    results_file = args.out / "reconstruction.jsonl"
    previous = [r for r in read_records(results_file) if all(r.get(k) == v for k, v in common.items())]
    done = {r["steps"] for r in previous}
    for steps in (int(s) for s in args.steps.split(",")):
        if steps in done:
            continue
        started = time.perf_counter()
        result = pipe.reconstruct(images, steps=steps, spacing=args.spacing, batch_size=args.batch_size)
        seconds = time.perf_counter() - started  # includes compiling inversion and generation once each
        record = {
            **common, "steps": steps, "mse": float(result.errors.mean()), "mse_std": float(result.errors.std()),
            "mse_median": float(np.median(result.errors)), "seconds_per_image": seconds / len(images),
            "load_average": os.getloadavg()[0],
        }
        log(f"{steps:4d} steps: MSE {record['mse']:.5f} (median {record['mse_median']:.5f}), "
            f"{record['seconds_per_image']:.2f} s/image (load {record['load_average']:.1f})")
        append_record(results_file, record)
        previous.append(record)
    print(markdown_table(previous))
    return previous


if __name__ == "__main__":
    main()
