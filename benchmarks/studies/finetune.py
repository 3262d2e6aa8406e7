"""Fine-tuned from flowers32-noise against trained from scratch, on images neither has seen: Fashion-MNIST at 32x32.

Run:  python -m benchmarks.studies.finetune export /data/fashion32 [--idx /usr/share/datasets/fashion-mnist]
      python -m benchmarks.studies.finetune export-small /data/small   [--idx ...]
      python -m benchmarks.studies.finetune run --data /data/fashion32 --out runs/finetune-fashion --step-seconds S \
          [--minutes 10 30 90] [--per-class 0 100] [--arms scratch finetuned] [--num 1000]
      python -m benchmarks.studies.finetune plot --out runs/finetune-fashion --png docs/images/finetune-fashion.png

``export`` writes Fashion-MNIST's original IDX files (Debian's package ``dataset-fashion-mnist``) as image
folders by class at 32x32 (bilinear from 28x28, grayscale PNGs that training reads as RGB): ``train/`` (all
60,000), ``train-100/`` (the first 100 of each class, 1,000 images) and ``test/`` (all 10,000).

``run`` trains the arms with the packaged config ``folder32`` (the same settings: flowers32's network and recipe) on
each training folder (``--per-class 0`` is all images), ``scratch`` from random weights and ``finetuned`` from
``pretrained:flowers32-noise`` (``ddim train --init``; it predicts noise, as the config does); ``--arms`` adds
fine-tunes that start differently (:data:`ARMS`: new classes as the null class or at the mean class vector, the
input normaliser adapted), and scores each at ``--minutes`` of training: FID and KID with the standard FID
Inception against all 10,000 test images, and class accuracy (a classifier on the FID features of the test
images), ``--num`` samples of 20 DDIM steps on the uniform grid, guidance 1, seed 0. A minute of training is
``60 / --step-seconds`` optimiser steps, the step time of this config on the machine measured on its own
(``python -m benchmarks.speed.bench --config folder32``: seconds a step = batch 64 / its images per
second), so the comparison holds whatever else the machine does while it runs; both arms take the same steps
(fine-tuning only adds the few seconds that load the source). Each run's schedule is the longest mark's, and it
trains in segments up to each mark (a stop and a resume are exact), so the earlier marks are points of the one
run. Every arm reaches a mark before any goes on to the next, so a stopped benchmark leaves comparable rows. Rows
go to ``<out>/finetune.jsonl``; a rerun trains and scores only what is missing.

``export-small`` writes the small folders that docs/own-images.md fine-tunes on (:data:`SMALL_FOLDERS`).

``table`` prints the rows as a Markdown table; ``plot`` draws FID against minutes for every arm (matplotlib:
``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np

import ddim  # noqa: F401  (sets the XLA flags before JAX starts)
from ddim import runtime

from benchmarks.common import log

if __name__ == "__main__":
    runtime.restart_with_fast_allocator()  # the arms train at the `ddim train` command's speed

IDX = Path("/usr/share/datasets/fashion-mnist")
CLASSES = ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle-boot")
"""Fashion-MNIST's ten classes in label order (its README's names, as folder names)."""
SIZE = 32
SOURCE = "pretrained:flowers32-noise"
CONFIG = "folder32"
BENCH_SETTINGS = ["data.val_fraction=0.0", "data.dataset_repetitions=1", "train.eval_every=0",
                  "train.checkpoint_every=100000", "train.keep_checkpoints=10"]
"""The test images are a folder of their own: every training image trains, and each mark is scored with
ddim eval; a checkpoint is kept at every mark."""
ARMS = {
    "scratch": (None, []),
    "finetuned": (SOURCE, []),
    "finetuned-null": (SOURCE, ['init.new_classes="null"']),
    "finetuned-mean": (SOURCE, ['init.new_classes="mean"']),
    "finetuned-adapt": (SOURCE, ['init.new_classes="null"', 'init.normalizer="adapt"']),
}
"""Each arm's source and settings: from random weights, the fine-tune at ddim's defaults (the source's input
normaliser kept, a new class starting at a random vector of its own), fine-tunes whose new classes start
otherwise, and one that adapts the input normaliser, to compare with ``finetuned-null`` (it was measured before
new classes started at random by default)."""


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip or plain) as a numpy array: uint8 images ``(N, 28, 28)`` or labels ``(N,)``."""
    data = (gzip.open if path.suffix == ".gz" else open)(path, "rb").read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def write_folder(out: Path, images: np.ndarray, labels: np.ndarray) -> int:
    from PIL import Image

    for row, (image, label) in enumerate(zip(images, labels)):
        folder = out / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).resize((SIZE, SIZE), Image.BILINEAR).save(folder / f"{row:05d}.png")
    return len(images)


def first_per_class(labels: np.ndarray, count: int) -> np.ndarray:
    """The indices of the first ``count`` images of each class, in file order."""
    return np.sort(np.concatenate([np.flatnonzero(labels == c)[:count] for c in range(len(CLASSES))]))


def export(args) -> None:
    idx, out = Path(args.idx), Path(args.out)
    files = {part: (idx / f"{prefix}-images-idx3-ubyte.gz", idx / f"{prefix}-labels-idx1-ubyte.gz")
             for part, prefix in (("train", "train"), ("test", "t10k"))}
    missing = [str(p) for pair in files.values() for p in pair if not p.is_file()]
    if missing:
        raise SystemExit(f"error: no Fashion-MNIST IDX file {missing[0]} (apt-get install dataset-fashion-mnist, "
                         "or --idx DIR)")
    for part, (images, labels) in files.items():
        images, labels = read_idx(images), read_idx(labels)
        log(f"{part}: wrote {write_folder(out / part, images, labels):,} images to {out / part}")
        if part == "train":
            keep = first_per_class(labels, args.per_class)
            target = out / f"train-{args.per_class}"
            log(f"{part}: wrote {write_folder(target, images[keep], labels[keep]):,} images to {target}")


SMALL_FOLDERS = {"fashion-20": ("train", ("dress", "sneaker"), 0, 10),
                 "fashion-20-heldout": ("train", ("dress", "sneaker"), 10, 200),
                 "fashion-500": ("train", CLASSES, 0, 50), "fashion-test-1000": ("t10k", CLASSES, 0, 100)}
"""The small folders of docs/own-images.md: name -> (IDX file prefix, classes, first image of each class in file
order, images of each class). fashion-20-heldout is the next 200 of fashion-20's classes, which its runs never
see; fashion-test-1000 (from the test set) is what fashion-500's runs are scored against."""


def export_small(args) -> None:
    """The :data:`SMALL_FOLDERS` at 64x64 (bicubic from 28x28), so both 32x32 and 64x64 runs read them."""
    from PIL import Image

    for name, (prefix, classes, first, count) in SMALL_FOLDERS.items():
        images, labels = (read_idx(Path(args.idx) / f"{prefix}-{kind}-idx{dims}-ubyte.gz")
                          for kind, dims in (("images", 3), ("labels", 1)))
        for class_name in classes:
            rows = np.flatnonzero(labels == CLASSES.index(class_name))[first:first + count]
            folder = Path(args.out) / name / class_name
            folder.mkdir(parents=True, exist_ok=True)
            for row in rows:
                Image.fromarray(images[row]).resize((64, 64), Image.BICUBIC).save(folder / f"{row:05d}.png")
        log(f"wrote {name}: {len(classes)} classes of {count} images to {Path(args.out) / name}")


def steps_at(minutes: float, step_seconds: float) -> int:
    return max(1, round(60.0 * minutes / step_seconds))


def arm_config(arm: str, train_dir: Path, total_steps: int, overrides: list[str]):
    from ddim.train import load_run_config

    source, settings = ARMS[arm]
    # The marks count optimiser steps, so the config's epochs must not end a run first: on 100 images per class
    # flowers32's 100 epochs are 1,500 steps. An epoch is at least one step, so total_steps epochs never bind.
    return load_run_config(CONFIG, [*BENCH_SETTINGS, f"data.image_dir={json.dumps(str(train_dir))}",
                                    f"train.num_epochs={total_steps}", f"train.lr_decay_steps={total_steps}",
                                    *settings, *overrides], init=source)


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run(args, feature_extractor_factory=None) -> None:
    from ddim.evaluation import EvalRequest, evaluate
    from ddim.spec import SamplingSpec
    from ddim.train import train

    data, out = Path(args.data), Path(args.out)
    results = out / "finetune.jsonl"
    marks = sorted(args.minutes)
    total = steps_at(marks[-1], args.step_seconds)
    for per_class in args.per_class:
        train_dir = data / ("train" if per_class == 0 else f"train-{per_class}")
        if not train_dir.is_dir():
            raise SystemExit(f"error: no training folder {train_dir} "
                             "(python -m benchmarks.studies.finetune export ...)")
        for minutes in marks:
            for arm in args.arms:
                workdir = out / f"{arm}-{'all' if per_class == 0 else per_class}"
                key = {"arm": arm, "per_class": per_class, "minutes": minutes}
                if any(all(row.get(k) == v for k, v in key.items()) for row in read_rows(results)):
                    continue
                steps = steps_at(minutes, args.step_seconds)
                config = arm_config(arm, train_dir, total, [f"train.max_steps={steps}", *args.set])
                log(f"{workdir.name}: training to step {steps} ({minutes:g} min at {args.step_seconds:g} s a step)")
                if train(config, workdir, log=lambda message: None).interrupted:  # Ctrl-C: a checkpoint was saved
                    raise SystemExit(f"{workdir.name}: stopped before step {steps}; run the same command to go on")
                step_dir = workdir / "checkpoints" / str(steps)
                request = EvalRequest(step_dir, num=args.num, spec=SamplingSpec(steps=20), seed=0, split="all",
                                      image_dir=data / "test", workdir=out / "eval", kid_subset_size=min(args.num, 1000))
                record = evaluate(request, feature_extractor_factory=feature_extractor_factory, log=log,
                                  show_progress=False)
                row = {**key, "step": steps, "images_seen": steps * config.train.batch_size,
                       "train_images": sum(1 for p in train_dir.rglob("*.png")),
                       "kid": record.get("kid_mean"),
                       **{k: record.get(k) for k in ("fid", "kid_std", "class_accuracy", "real_class_accuracy", "num",
                                                     "real_num", "steps", "sampler", "guidance")}}
                with open(results, "a") as f:
                    f.write(json.dumps(row) + "\n")
                log(f"{workdir.name} at {minutes:g} min: FID {row['fid']:.2f}")


def plot(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_rows(Path(args.out) / "finetune.jsonl")
    figure, axis = plt.subplots(figsize=(6.5, 4))
    colours = dict(zip(ARMS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for per_class in sorted({row["per_class"] for row in rows}):
        for arm in ARMS:
            points = sorted((row["minutes"], row["fid"]) for row in rows
                            if row["arm"] == arm and row["per_class"] == per_class)
            if points:  # an arm keeps its colour; the training set is the line's style
                label = f"{arm}, {'all 60,000 images' if per_class == 0 else f'{per_class} images per class'}"
                axis.plot(*zip(*points), "-" if per_class == 0 else "--", marker="o", color=colours[arm],
                          label=label)
    step_seconds = {round(60.0 * row["minutes"] / row["step"], 2) for row in rows}
    pace = f", {step_seconds.pop():g} s a step" if len(step_seconds) == 1 else ""
    axis.set_xlabel(f"minutes of training (2-core CPU{pace})")
    axis.set_ylabel("FID against the 10,000 test images")
    axis.set_xticks(sorted({row["minutes"] for row in rows}))
    axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(args.png, dpi=120)
    log(f"wrote {args.png}")


def table(args) -> None:
    """The rows as a Markdown table, by training set, then minutes, then arm (the order of :data:`ARMS`)."""
    rows = sorted(read_rows(Path(args.out) / "finetune.jsonl"),
                  key=lambda r: (r["per_class"] == 0, r["minutes"], list(ARMS).index(r["arm"])))
    print("| training images | minutes | steps | start | FID | KID | class accuracy |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        images = "all 60,000" if r["per_class"] == 0 else f"{r['per_class']} per class"
        kid = "" if r.get("kid") is None else f"{r['kid']:.4f}"
        accuracy = "" if r.get("class_accuracy") is None else f"{100 * r['class_accuracy']:.1f} %"
        print(f"| {images} | {r['minutes']:g} | {r['step']:,} | {r['arm']} | {r['fid']:.1f} | {kid} | {accuracy} |")


def main(argv: list[str] | None = None, feature_extractor_factory=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("export", help="Fashion-MNIST's IDX files as image folders by class at 32x32")
    p.add_argument("out")
    p.add_argument("--idx", default=str(IDX), help="the folder of the four IDX files")
    p.add_argument("--per-class", type=int, default=100, help="images per class of the small training folder")
    p = commands.add_parser("export-small", help="the small folders of docs/own-images.md at 64x64")
    p.add_argument("out")
    p.add_argument("--idx", default=str(IDX), help="the folder of the four IDX files")
    p = commands.add_parser("run", help="train and score both arms at each mark")
    p.add_argument("--data", required=True, help="the folder `export` wrote")
    p.add_argument("--out", required=True)
    p.add_argument("--step-seconds", type=float, required=True, help="seconds a training step takes on this CPU")
    p.add_argument("--minutes", type=float, nargs="+", default=[10, 30, 90])
    p.add_argument("--per-class", type=int, nargs="+", default=[0, 100], help="0: all training images")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=["scratch", "finetuned"],
                   help="how each run starts (in this order at every mark)")
    p.add_argument("--num", type=int, default=1000, help="samples scored at each mark")
    p.add_argument("--set", action="append", default=[], help="a config override for both arms (tests)")
    p = commands.add_parser("plot", help="FID against minutes")
    p.add_argument("--out", required=True)
    p.add_argument("--png", required=True)
    p = commands.add_parser("table", help="the results as a Markdown table")
    p.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "export":
        export(args)
    elif args.command == "export-small":
        export_small(args)
    elif args.command == "run":
        run(args, feature_extractor_factory)
    elif args.command == "table":
        table(args)
    else:
        plot(args)


if __name__ == "__main__":
    main()
