"""FID along a training run: score a work directory's checkpoints every N steps, and draw the curves.

Run:  python -m benchmarks.studies.curve score --workdir runs/flowers32 --csv docs/results/flowers32-fid.csv \
          [--every 1000] [--eval-root /tmp/eval]
      python -m benchmarks.studies.curve plot --csv docs/results/flowers32-fid.csv "recommended recipe" \
          --csv docs/results/keras32-fid.csv "Keras recipe" --out docs/images/fid-curve.png \
          [--hline 17.0 "1,000 real images"]
      python -m benchmarks.studies.curve floor --reference /tmp/eval/eval_cache/real_<key>.npz [--num 1000]

``score`` samples ``--num`` images (default 1,000) from every checkpoint whose step is a multiple of
``--every`` with 20 steps of ddim/uniform (the sampler with the best FID on these models: see the docs'
sampler table; ``--steps`` for another count) and scores them with the standard FID Inception against all 8,189
Oxford Flowers images at the model's size (``ddim eval --split all``). The checkpoints of a ``ddim distill``
run are students: they sample with their own sampler (DDIM or consistency sampling) at ``--steps`` (default:
their largest count), so a consistency run can be followed step by step too. A class-conditional checkpoint draws its classes from the
data's class frequencies, at guidance ``--guidance`` (default 1: plain conditional sampling). Rows are
appended to the CSV; a rerun scores only the steps that are missing, so it can follow a run in progress.
The real features are cached in ``<eval-root>/eval_cache`` (default: the work directory's), once per
image size: point several runs at one ``--eval-root`` to build them once.

``plot`` draws FID against training steps for one or more CSVs with matplotlib (``pip install
matplotlib``, or ``pip install -e ".[bench]"``), with dashed horizontal lines for ``--hline`` values.

``floor`` is the best score ``--num`` samples can get: the FID of ``--num`` real images, drawn at random
without replacement, against all of them (the mean over ``--draws`` draws). It reads the real features
that ``ddim eval`` cached (``<eval-root>/eval_cache/real_*.npz``), so it costs seconds.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import ddim  # noqa: F401  (sets the XLA flags before JAX starts)

from benchmarks.common import log, score_fid

COLUMNS = ("step", "images_seen", "fid", "kid", "sampler", "spacing", "sample_steps", "guidance", "num",
           "real_num", "checkpoint")
"""One row per scored checkpoint."""


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def checkpoint_steps(workdir: Path, every: int) -> list[int]:
    """The steps of ``workdir``'s checkpoints that are multiples of ``every``, oldest first."""
    from ddim.workdir import Workdir

    folder = Workdir(workdir).checkpoints
    steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    return sorted(s for s in steps if s > 0 and s % every == 0)


def checkpoint_spec(config, steps: int | None, guidance: float | None):
    """How a checkpoint is sampled for the curve: ``steps`` (default 20) of ddim/uniform, or a distilled student's
    own sampler at ``steps`` (default: its largest step count)."""
    from ddim.spec import SamplingRules, SamplingSpec

    rules = SamplingRules.of(config.model)
    if rules.distilled:
        return rules.resolve(steps=steps or max(rules.step_counts), guidance=guidance)
    return SamplingSpec(steps=steps or 20, sampler="ddim", spacing="uniform", guidance=guidance)


def score_checkpoint(workdir: Path, step: int, num: int, guidance: float | None, eval_root: Path | None,
                     feature_extractor_factory=None, steps: int | None = None) -> dict:
    """FID and KID of ``num`` samples of the checkpoint at ``step`` (:func:`checkpoint_spec`)."""
    from ddim.checkpoint import Checkpointer
    from ddim.workdir import Workdir

    folder = Workdir(workdir).checkpoints
    config = Checkpointer(folder, create=False).restore_config(step)
    spec = checkpoint_spec(config, steps, guidance)
    record = score_fid(folder / str(step), spec, num, eval_root or workdir,
                       feature_extractor_factory=feature_extractor_factory)
    return {"step": step, "images_seen": step * config.step_batch_size, "fid": f"{record['fid']:.3f}",
            "kid": f"{record['kid_mean']:.5f}", "sampler": spec.sampler, "spacing": spec.spacing,
            "sample_steps": spec.steps, "guidance": "" if guidance is None else guidance, "num": num,
            "real_num": record["real_num"], "checkpoint": str(folder / str(step))}


def score(args, feature_extractor_factory=None) -> None:
    done = {int(row["step"]) for row in read_rows(args.csv)}
    todo = [s for s in checkpoint_steps(args.workdir, args.every) if s not in done]
    if not todo:
        log(f"nothing to score: every checkpoint at a multiple of {args.every} is in {args.csv}")
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    for step in todo:
        row = score_checkpoint(args.workdir, step, args.num, args.guidance, args.eval_root, feature_extractor_factory,
                               args.steps)
        log(f"step {step}: FID {row['fid']}, KID {row['kid']}")
        new_file = not args.csv.exists()
        with open(args.csv, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            if new_file:
                writer.writeheader()
            writer.writerow(row)


def real_floor(reference: Path, num: int, draws: int = 5) -> tuple[float, float]:
    """Mean and spread (max - min) of the FID of ``num`` of the reference's real images against all of them."""
    import numpy as np

    from ddim.evaluation import EvaluationError
    from ddim.evaluation.metrics import fid_from_features_and_stats
    from ddim.evaluation.reference import load_real_stats

    try:
        stats = load_real_stats(reference)
    except EvaluationError as error:  # no such file, not an npz, no mu and sigma
        raise SystemExit(f"error: {error}") from None
    features = stats["features"]
    if features is None:
        raise SystemExit(f"error: {reference} holds no features (ddim eval's cache files do)")
    if not 2 <= num <= len(features):
        raise SystemExit(f"error: --num must be between 2 and the {len(features)} real images, got {num}")
    scores = [fid_from_features_and_stats(features[np.random.default_rng(seed).choice(len(features), num, replace=False)],
                                          stats["mu"], stats["sigma"]) for seed in range(draws)]
    return float(np.mean(scores)), float(np.max(scores) - np.min(scores))


def floor(args) -> None:
    mean, spread = real_floor(args.reference, args.num, args.draws)
    print(f"FID of {args.num} real images against all of them: {mean:.2f} (spread {spread:.2f} over {args.draws} "
          "draws)")


def axis_labels(rows: list[dict]) -> tuple[str, str]:
    """The axes' words from what the rows share: the batch of a step, and how the samples were drawn."""
    def shared(values):
        values = set(values)
        return values.pop() if len(values) == 1 else None

    batch = shared(int(r["images_seen"]) // int(r["step"]) if r.get("images_seen") else None for r in rows)
    num = shared(r.get("num") for r in rows)
    sampling = shared((r.get("sample_steps"), r.get("sampler")) for r in rows)
    how = []
    if num:
        how.append(f"{int(num):,} samples")
    if sampling and all(sampling):
        how.append(f"{sampling[0]} {sampling[1]} steps")
    return (f"training steps (batch {batch})" if batch else "training steps",
            "FID" + (f" ({', '.join(how)})" if how else ""))


def plot(args) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    tables = []
    for path, label in args.csv:
        rows = sorted(read_rows(Path(path)), key=lambda r: int(r["step"]))
        if not rows:
            raise SystemExit(f"error: no rows in {path}")
        tables.append(rows)
        axes.plot([int(r["step"]) for r in rows], [float(r["fid"]) for r in rows], marker="o", label=label)
    for value, label in args.hline or []:
        axes.axhline(float(value), color="grey", linestyle="--", linewidth=1)
        axes.annotate(label, (0.01, float(value)), xycoords=("axes fraction", "data"), va="bottom", fontsize=8,
                      color="grey")
    if args.log_steps:  # runs of 10x different lengths on one axis: a short run's curve keeps its shape
        axes.set_xscale("log")
    xlabel, ylabel = axis_labels([row for rows in tables for row in rows])
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(args.title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out)
    log(f"wrote {args.out}")


def main(argv: list[str] | None = None, feature_extractor_factory=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    scoring = commands.add_parser("score", help="Score the checkpoints that are missing from the CSV.")
    scoring.add_argument("--workdir", type=Path, required=True)
    scoring.add_argument("--csv", type=Path, required=True)
    scoring.add_argument("--every", type=int, default=1000, help="Score checkpoints at multiples of this step.")
    scoring.add_argument("--num", type=int, default=1000, help="Samples per FID.")
    scoring.add_argument("--guidance", type=float, default=None,
                         help="Classifier-free guidance of a class-conditional checkpoint (default: 1).")
    scoring.add_argument("--steps", type=int, default=None,
                         help="Sampling steps (default: 20 of ddim/uniform; a distillation run's: its student's "
                              "largest count, with its own sampler).")
    scoring.add_argument("--eval-root", type=Path, default=None,
                         help="Where eval.jsonl and the real-feature cache go (default: the work directory).")
    plotting = commands.add_parser("plot", help="Draw FID against steps.")
    plotting.add_argument("--csv", nargs=2, action="append", metavar=("CSV", "LABEL"), required=True)
    plotting.add_argument("--out", type=Path, required=True)
    plotting.add_argument("--title", default="FID at 32x32 against all 8,189 Oxford Flowers images")
    plotting.add_argument("--hline", nargs=2, action="append", metavar=("FID", "LABEL"),
                          help="A dashed reference line (repeatable), e.g. the floor of `floor`.")
    plotting.add_argument("--log-steps", action="store_true", help="A logarithmic step axis.")
    flooring = commands.add_parser("floor", help="The FID of --num real images against all of them.")
    flooring.add_argument("--reference", type=Path, required=True,
                          help="A real-feature cache file of ddim eval (<eval-root>/eval_cache/real_*.npz).")
    flooring.add_argument("--num", type=int, default=1000, help="Real images per draw (the samples per FID).")
    flooring.add_argument("--draws", type=int, default=5, help="Random draws to average.")
    args = parser.parse_args(argv)
    if args.command == "score":
        score(args, feature_extractor_factory)
    else:
        {"plot": plot, "floor": floor}[args.command](args)


if __name__ == "__main__":
    main()
