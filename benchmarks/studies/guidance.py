"""Classifier-free guidance: FID and class accuracy of a class-conditional checkpoint at each guidance scale.

Run:  python -m benchmarks.studies.guidance runs/flowers64-classes --out /tmp/guidance --grid docs/guidance.png
      [--guidance 0 1 2 3 5] [--steps 20] [--sampler ddim] [--spacing uniform] [--num 1000] [--grid-guidance 2]
      [--grid-classes sunflower,rose,...]

For each guidance scale the checkpoint's EMA weights sample ``--num`` images (classes drawn as the training
data has them, ``--steps`` steps of ``--sampler`` on the ``--spacing`` grid, ddim/uniform unless given) and
``ddim eval`` scores them: FID (the standard FID
Inception) against all real images at the model's size (``--split all``, as benchmarks.studies.recipe), and the
class accuracy: how often a classifier on the same FID features, fitted on the real training images, sees the
class each image was asked for; its accuracy on the real validation images is the ceiling, chance is
1 / classes. Guidance 0 is the unconditional model (the classes reach no image: accuracy near chance), 1 plain
conditional sampling; more guidance usually buys class accuracy with diversity, and FID rises again.

Results go to ``<out>/guidance.jsonl`` (one line per checkpoint step and setting; a rerun skips what is done;
``<out>/eval_cache`` keeps the real features), and a Markdown table is printed. ``--grid PATH`` writes one
image: a row per class of ``--grid-classes`` (eight recognisable Flowers classes by default), a column per
seed (column j is ``ddim sample --num 1 --seed j --class NAME --guidance G``), at ``--grid-guidance`` or else
the scale with the best (lowest) FID; ``--guidance`` with no scale draws the grid alone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import ddim  # noqa: F401  (sets the XLA flags before JAX starts)
from ddim import runtime
from ddim.workdir.records import append_record, read_records

from benchmarks.common import log, score_fid

if __name__ == "__main__":
    runtime.restart_with_fast_allocator()  # the allocator the `ddim` command runs with

GUIDANCES = (0.0, 1.0, 2.0, 3.0, 5.0)
GRID_CLASSES = ("sunflower", "pink primrose", "bird of paradise", "water lily", "passion flower",
                "purple coneflower", "californian poppy", "foxglove")
"""Oxford Flowers 102 classes that look unlike each other (colour and shape), one grid row each."""
RESULTS = "guidance.jsonl"
SAMPLER, SPACING = "ddim", "uniform"


def setting(row: dict) -> tuple:
    """What a result row measured: a rerun skips a setting already in the results."""
    return (row["checkpoint"], row["step"], row["steps"], row["num"], row["sampler"], row["spacing"], row["guidance"])


def read_results(out: Path) -> list[dict]:
    return read_records(out / RESULTS)


def score(source, guidance: float, steps: int, num: int, out: Path, batch_size: int = 64,
          feature_extractor_factory=None, sampler: str = SAMPLER, spacing: str = SPACING) -> dict:
    """FID, KID and class accuracy of ``num`` samples of ``source`` (a checkpoint, or ``"pretrained:NAME"``) at
    ``guidance`` (``ddim eval``)."""
    from ddim.spec import SamplingSpec

    spec = SamplingSpec(steps=steps, sampler=sampler, spacing=spacing, guidance=guidance)
    record = score_fid(source, spec, num, out, batch_size=batch_size,
                       feature_extractor_factory=feature_extractor_factory)
    keys = ("checkpoint", "step", "steps", "num", "sampler", "spacing", "guidance", "fid", "kid_mean",
            "class_accuracy", "real_val_class_accuracy", "chance", "real_num", "fid_feature_net", "wall_time_s")
    return {key: record[key] for key in keys}


def table(rows: list[dict]) -> str:
    """The results as Markdown, one row per guidance scale, and a line with the ceiling and chance."""
    lines = ["| guidance | FID | KID | class accuracy |", "| --- | --- | --- | --- |"]
    for row in sorted(rows, key=lambda r: r["guidance"]):
        lines.append(f"| {row['guidance']:g} | {row['fid']:.1f} | {row['kid_mean']:.4f} | "
                     f"{row['class_accuracy']:.1%} |")
    if rows:
        first = rows[0]
        ceiling = first["real_val_class_accuracy"]
        lines.append("")
        lines.append(f"Class accuracy of the real validation images (the ceiling): "
                     f"{'n/a' if ceiling is None else f'{ceiling:.1%}'}; chance {first['chance']:.1%}. "
                     f"{first['num']} samples per row, {first['steps']} steps of "
                     f"{first['sampler']}/{first['spacing']}, FID against all {first['real_num']} real images; "
                     f"checkpoint step {first['step']}.")
    return "\n".join(lines)


def best_guidance(rows: list[dict]) -> float:
    """The guidance scale with the lowest FID."""
    return min(rows, key=lambda row: row["fid"])["guidance"]


def write_grid(pipe, classes: list[str], guidance: float, steps: int, seeds: int, path: Path,
               batch_size: int = 64, sampler: str = SAMPLER, spacing: str = SPACING) -> Path:
    """One image: a row per class, column j from seed j's noise (``ddim sample --num 1 --seed j``)."""
    import numpy as np

    from ddim.images import make_grid, save_png
    from ddim.spec import SamplingSpec

    noise = np.concatenate([pipe.latents(1, seed=seed) for seed in range(seeds)])
    spec = SamplingSpec(steps=steps, sampler=sampler, spacing=spacing, guidance=guidance)
    ids = [pipe.class_space.class_id(name) for name in classes]
    images = pipe.generate(latents=np.concatenate([noise] * len(classes)), spec=spec, batch_size=batch_size,
                           classes=np.repeat(ids, seeds))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(make_grid(images, rows=len(classes)), path)
    log(f"wrote {path}: rows (top to bottom) {', '.join(classes)}; columns seeds 0-{seeds - 1}; guidance "
        f"{guidance:g}, {steps} steps of {sampler}/{spacing}")
    return path


def main(argv: list[str] | None = None, feature_extractor_factory=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="A class-conditional work directory, checkpoint step dir, or "
                        "pretrained:NAME (a bundled model).")
    parser.add_argument("--out", type=Path, required=True,
                        help="Results, eval cache and data cache (outside the repo).")
    parser.add_argument("--guidance", type=float, nargs="*", default=list(GUIDANCES),
                        help="Guidance scales to score; none: only the grid, at --grid-guidance.")
    parser.add_argument("--steps", type=int, default=20, help="Sampling steps.")
    parser.add_argument("--sampler", default=SAMPLER, help="The sampler of the scores and the grid.")
    parser.add_argument("--spacing", default=SPACING, help="The sampler's time grid (uniform, quadratic, logsnr).")
    parser.add_argument("--num", type=int, default=1000, help="Samples per guidance scale.")
    parser.add_argument("--batch-size", type=int, default=64, help="Images generated at once.")
    parser.add_argument("--grid", type=Path, default=None, help="Write the class-by-seed grid image here.")
    parser.add_argument("--grid-guidance", type=float, default=None, help="The grid's guidance (default: best FID).")
    parser.add_argument("--grid-classes", default=",".join(GRID_CLASSES),
                        help="Comma-separated class names, one grid row each.")
    parser.add_argument("--grid-seeds", type=int, default=8, help="Columns of the grid (seeds 0, 1, ...).")
    args = parser.parse_args(argv)
    from ddim.sampling import load

    from ddim.errors import InputError, UserError

    try:
        pipe = load(args.checkpoint)
    except UserError as error:  # no checkpoint there, an unknown bundled name, a damaged file
        raise SystemExit(f"error: {error}") from None
    if not pipe.classes:
        parser.error(f"{pipe.path} is not class-conditional (trained without model.class_conditional)")
    classes = [name.strip() for name in args.grid_classes.split(",") if name.strip()]
    if args.grid is not None and not args.guidance and args.grid_guidance is None:
        parser.error("--grid with no --guidance scale to score needs --grid-guidance")
    if args.grid:  # an unknown grid class fails now, not after the scoring
        try:
            for name in classes:
                pipe.class_space.class_id(name)
        except InputError as error:
            parser.error(str(error))
    args.out.mkdir(parents=True, exist_ok=True)
    finished = {setting(row) for row in read_results(args.out)}
    for guidance in args.guidance:
        key = (str(pipe.path), pipe.step, args.steps, args.num, args.sampler, args.spacing, float(guidance))
        if key in finished:
            log(f"guidance {guidance:g}: done (in {args.out / RESULTS})")
            continue
        row = score(args.checkpoint, guidance, args.steps, args.num, args.out, args.batch_size,
                    feature_extractor_factory, args.sampler, args.spacing)
        log(json.dumps(row))
        append_record(args.out / RESULTS, row)
    wanted = {float(g) for g in args.guidance}
    rows = [row for row in read_results(args.out) if row["checkpoint"] == str(pipe.path) and row["step"] == pipe.step
            and (row["steps"], row["num"], row["sampler"], row["spacing"]) == (args.steps, args.num, args.sampler,
                                                                               args.spacing)
            and row["guidance"] in wanted]
    if rows:
        print(table(rows))
    if args.grid is not None:
        guidance = args.grid_guidance if args.grid_guidance is not None else best_guidance(rows)
        write_grid(pipe, classes, guidance, args.steps, args.grid_seeds, args.grid, args.batch_size,
                   args.sampler, args.spacing)
    return rows


if __name__ == "__main__":
    main()
