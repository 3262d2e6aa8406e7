"""The recipe ablation: which training changes make ddim converge faster than the Keras example's recipe.

Run:  python -m benchmarks.studies.recipe --root /tmp/recipe [--variants keras,velocity,...] [--steps 1000 4000]
      python -m benchmarks.studies.recipe --root /tmp/recipe --time-only   (seconds a step of every variant, 32 and 64 px)

Every variant trains ``ddim/configs/flowers64.toml`` at 32x32 with batch 64 from the same seed and data order
(``ddim train``, so a rerun resumes where it stopped), with one change or a combination. ``--steps`` count
steps of the Keras recipe: a variant whose step costs another time (a smaller batch or network,
``STEPS_PER_KERAS_STEP``) is trained to and scored at the step that takes the same wall time. At each of
``--steps`` it samples ``--num`` images (default 1,000) with 20 steps of ddim/uniform and of
dpmpp-2m/logsnr and scores them with the standard FID Inception against all 8,189 Oxford Flowers images at
32x32 (``ddim eval --split all``; the real features are cached once in ``<root>/eval_cache``). Seconds per
training step are measured apart (``--time-only``, on a quiet machine), at 32x32 and at 64x64, because a
contended machine makes them meaningless and attention costs time.

Results go to ``<root>/results.jsonl`` (one line per variant, step and sampler; a rerun skips what is done)
and ``<root>/timing.json``; the table is printed as Markdown at the end. Sample quality is FID of samples,
never the distance to a converged ODE solution: the two disagree (see the docs' sampler table).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import ddim  # noqa: F401  (sets the XLA flags before JAX starts)
from ddim import runtime
from ddim.workdir.records import append_record, read_records

from benchmarks.common import ddim_command, log, score_fid

if __name__ == "__main__":
    runtime.restart_with_fast_allocator()  # the allocator the `ddim` command runs with

BASE = [
    "model.image_size=32", "train.batch_size=64", "train.kid_images=0", "train.eval_every=0",
    "train.keep_checkpoints=100",
]
"""The Keras example's recipe at 32x32 (ddim/configs/flowers64.toml otherwise): what every variant starts from."""

ATTENTION = ["model.attention_resolutions=[16, 8]", "model.attention_heads=1"]
"""DDPM's placement (16x16 for 32x32 images) and head count. Four heads (ADM) cost 2.5x a step on the CPU at
32x32 (+55 % at 64x64: the attention logits are 4x larger); one head costs +19 to +25 % at 64x64 (two runs)."""
LENGTH = 4000
"""The length of every variant's learning-rate schedule, whatever step it is trained to (--until)."""
WARMUP = 200
"""The warm-up of the variants with a schedule (SCHEDULE)."""
SCHEDULE = ['train.lr_schedule="cosine"', f"train.warmup_steps={WARMUP}", "train.grad_clip=1.0"]
FAST = ['model.embedding_injection="every-block"', *SCHEDULE]
"""The changes that helped alone, together (the `fast` variant: ddim/configs/flowers64-fast.toml's recipe;
ddim/configs/flowers32.toml's is `fast-lr2e-3`, the same at a peak learning rate of 2e-3)."""
RECOMMENDED = [*FAST, "train.learning_rate=2e-3"]
"""ddim/configs/flowers32.toml's recipe (the `fast-lr2e-3` variant): the base of the later variants' single changes."""
OBJECTIVE = ['model.prediction="velocity"', 'train.loss="mse"', 'train.loss_weighting="min-snr"']
"""The literature's objective: v-prediction with an MSE loss weighted by min-SNR-5 (Hang et al. 2023)."""

STEPS_PER_KERAS_STEP: dict[str, float] = {"fast-b32": 2.0, "fast-depth1": 1.7}
"""Variants whose steps cost a different time than the Keras recipe's: how many of their steps take the wall
time of one Keras step on the 2-core CPU (interleaved timings in one process: batch 32 costs 0.50 of batch 64's
step, one residual block per level 0.57 of two; rounded down, which favours the Keras recipe: a later run timed
them at 1/2.5 and 1/1.9 of the Keras network's step). Every other variant's step costs the Keras step's within
the timing scatter (the table's s/step)."""


STEP_COST: dict[str, float] = {"fast-wide": 4.1}
"""Variants trained to the Keras recipe's steps although each of their steps costs more: the wall time of one
of their steps in Keras steps (interleaved timings in one process, 2026-11-27: 3.35 s against 0.81 s at 32x32,
13.0 against 3.36 at 64x64). The table gives the Keras steps their steps took; they measure what a step buys."""


def scaled_step(variant: str, step: int) -> int:
    """The variant's step that takes the wall time of ``step`` Keras-recipe steps (--steps count those)."""
    return round(step * STEPS_PER_KERAS_STEP.get(variant, 1.0))


def stretched_schedule(variant: str) -> list[str]:
    """The warm-up and cosine length in ``variant``'s own steps: the same schedule in wall time as the others'."""
    return [f"train.warmup_steps={scaled_step(variant, WARMUP)}",
            f"train.lr_decay_steps={scaled_step(variant, LENGTH)}"]


VARIANTS: dict[str, list[str]] = {
    "keras": [],
    "velocity": ['model.prediction="velocity"'],
    "mse": ['train.loss="mse"'],
    "min-snr": ['train.loss_weighting="min-snr"'],
    "p2": ['train.loss_weighting="p2"'],
    "attention": ATTENTION,
    "every-block": ['model.embedding_injection="every-block"'],
    "schedule": SCHEDULE,
    "combined": [*OBJECTIVE, *ATTENTION, 'model.embedding_injection="every-block"', *SCHEDULE],
    "fast": FAST,
    "combined-h4": [*OBJECTIVE, "model.attention_resolutions=[16, 8]", "model.attention_heads=4",
                    'model.embedding_injection="every-block"', *SCHEDULE],
    # Levers beyond the recipe's components, tried because fast's gain at 1,000 steps was small:
    "fast-1k": [*FAST, "train.lr_decay_steps=1000"],
    "fast-lr2e-3": RECOMMENDED,
    "fast-lr3e-3": [*FAST, "train.learning_rate=3e-3"],
    # The Keras recipe at fast-lr2e-3's peak (constant, as Keras'): is the gain the recipe's or the learning rate's?
    "keras-lr2e-3": ["train.learning_rate=2e-3"],
    # fast-lr2e-3 at half the batch: on the CPU a step then costs half (0.56 s against 1.11 s at 32x32), so it
    # takes twice the steps in the same wall time (STEPS_PER_KERAS_STEP); schedule stretched to match.
    "fast-b32": [*RECOMMENDED, "train.batch_size=32", *stretched_schedule("fast-b32")],
    # fast-lr2e-3 with one residual block per level instead of two: half the parameters, 0.57 of the step time,
    # so 1.7 steps in a Keras step's time (is a smaller network better at this budget?). Schedule stretched alike.
    "fast-depth1": [*RECOMMENDED, "model.block_depth=1", *stretched_schedule("fast-depth1")],
    # fast-lr2e-3 with the literature's objective and no attention: alone, each of the three changes was worse
    # at 1,000 steps; does the combination pay on this base?
    "fast-velocity": [*RECOMMENDED, *OBJECTIVE],
    # fast-lr2e-3 with a cleaner least-noisy level: the Keras schedule stops at a signal rate of 0.95 (noise rate
    # 0.31, SNR 9.3), so the sampler's last step guesses the clean image from a visibly noisy one; DDPM's and
    # EDM's schedules reach an almost clean image. 0.99 is a noise rate of 0.14 (SNR 49).
    "fast-signal-0.99": [*RECOMMENDED, "model.max_signal_rate=0.99"],
    # fast-lr2e-3 at twice the width (3.7x the parameters): what capacity buys per step. On the CPU a step costs
    # 4.1 times the Keras network's (STEP_COST); on a GPU, where a batch of 64 at 32x32 leaves most of the chip
    # idle, it need not. Measured level with fast-lr2e-3 per step at 1,000 steps, so it is no shortcut there either.
    "fast-wide": [*RECOMMENDED, "model.widths=[64, 128, 192, 256]"],
}
"""Each change alone, every change together (combined, combined-h4), and the changes that helped alone (fast:
the first recommended recipe); names are the work directories under --root. fast-1k decays its learning
rate to zero by step 1,000 (a run that knows its budget; train it only to 1,000); fast-lr2e-3 and fast-lr3e-3
raise the peak learning rate (1e-3 in the Keras recipe and fast) to 2e-3 and 3e-3; keras-lr2e-3 gives the
Keras recipe the same 2e-3 (constant), so that the comparison with fast-lr2e-3 is fair; fast-b32 and fast-depth1
spend the Keras recipe's wall time on more, cheaper steps (half the batch; one residual block per level);
fast-velocity is fast-lr2e-3 with v-prediction, MSE and min-SNR weighting; fast-signal-0.99 ends the noise
schedule at a cleaner level; fast-wide doubles every width (STEP_COST: it is scored at equal steps)."""

ATTENTION_LAYOUTS: dict[str, list[str]] = {
    "attention-h4": ["model.attention_resolutions=[16, 8]", "model.attention_heads=4"],
    "attention-8-h4": ["model.attention_resolutions=[8]", "model.attention_heads=4"],
    "attention-8-4-h4": ["model.attention_resolutions=[8, 4]", "model.attention_heads=4"],
}
"""Other places and head counts of attention, for --time-only (what each costs a CPU step)."""


def batch_size(variant: str) -> int:
    """The variant's batch (64, BASE's, unless it sets its own)."""
    sizes = [int(o.split("=")[1]) for o in [*BASE, *{**VARIANTS, **ATTENTION_LAYOUTS}[variant]]
             if o.startswith("train.batch_size=")]
    return sizes[-1]


SAMPLERS = (("ddim", "uniform"), ("dpmpp-2m", "logsnr"))


def overrides(variant: str, max_steps: int, checkpoint_every: int) -> list[str]:
    # The variant's own settings come after the shared schedule length, so a variant may size its own.
    return [*BASE, f"train.lr_decay_steps={LENGTH}", *{**VARIANTS, **ATTENTION_LAYOUTS}[variant],
            f"train.max_steps={max_steps}", f"train.checkpoint_every={checkpoint_every}", f"name={json.dumps(variant)}"]


def train(root: Path, variant: str, steps: list[int], until: int) -> None:
    """Train (or resume) ``variant`` to step ``until`` with the ``ddim`` command, a checkpoint at every one of ``steps``."""
    every = min(steps) if all(s % min(steps) == 0 for s in steps) else 1000
    command = ddim_command("train", "--config", "flowers64", "--workdir", str(root / variant))
    # One preprocessed-image cache for every variant.
    for override in [*overrides(variant, until, every), f"data.cache_dir={json.dumps(str(root / 'data_cache'))}"]:
        command += ["--set", override]
    log(f"{variant}: training to step {until}")
    code = subprocess.run(command).returncode
    if code:  # ddim train has said why (and saved its state if it was stopped); a rerun resumes it
        raise SystemExit(f"error: training {variant} stopped with exit status {code}; rerun to resume")


def done(root: Path) -> set[tuple[str, int, str, str]]:
    return {(r["variant"], r["step"], r["sampler"], r["spacing"]) for r in read_records(root / "results.jsonl")}


def score(root: Path, variant: str, step: int, sampler: str, spacing: str, num: int) -> dict:
    """FID (and KID) of ``num`` samples of the checkpoint at ``step`` against all Flowers images."""
    from ddim.spec import SamplingSpec
    from ddim.workdir import Workdir

    record = score_fid(Workdir(root / variant).checkpoints / str(step),
                       SamplingSpec(steps=20, sampler=sampler, spacing=spacing), num, root)
    return {"variant": variant, "step": step, "images": step * batch_size(variant), "sampler": sampler,
            "spacing": spacing, "fid": record["fid"],
            "kid": record["kid_mean"], "num": num, "real_num": record["real_num"]}


def seconds_per_step(variants: list[str], image_size: int, rounds: int = 6) -> dict[str, float]:
    """Median wall time of one compiled training step of each variant at its batch (random images).

    Every variant is compiled first, then the steps run in interleaved rounds (one step of each variant per
    round), so a slow spell of the machine falls on all of them alike: the ratios are what to compare.
    """
    import functools

    import jax
    import numpy as np

    from ddim.config import load_config
    from ddim.objective import Objective
    from ddim.train import state as state_lib

    programs = {}
    for variant in variants:
        size = batch_size(variant)
        images = np.random.default_rng(0).integers(0, 256, (size, image_size, image_size, 3), dtype=np.uint8)
        batch = {"image": jax.numpy.asarray(images), "label": jax.numpy.full((size,), -1, jax.numpy.int32)}
        config = load_config("flowers64",
                             [*overrides(variant, 4000, 1000), f"model.image_size={image_size}"])
        step = jax.jit(functools.partial(state_lib.train_step, ema_decay=0.999, ema_warmup=True,
                                         objective=Objective.of(config.model, config)), donate_argnums=(0,))
        state, metrics = step(state_lib.create_train_state(config, jax.random.key(0)), batch, jax.random.key(1))
        jax.block_until_ready(metrics)  # compiled
        programs[variant] = [step, state, batch]
    times: dict[str, list[float]] = {variant: [] for variant in variants}
    for _ in range(rounds):
        for variant, program in programs.items():
            started = time.perf_counter()
            program[1], metrics = program[0](program[1], program[2], jax.random.key(1))
            jax.block_until_ready(metrics)
            times[variant].append(time.perf_counter() - started)
    return {variant: float(np.median(values)) for variant, values in times.items()}


def table(root: Path, timing: dict) -> str:
    rows = read_records(root / "results.jsonl")
    fids = {(r["variant"], r["step"], r["sampler"]): r["fid"] for r in rows}
    lines = ["| variant | batch | s/step 32px | s/step 64px | steps | in Keras steps' time | FID ddim/uniform "
             "| FID dpmpp-2m/logsnr |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for variant in VARIANTS:
        for step in sorted({r["step"] for r in rows if r["variant"] == variant}):
            seconds = timing.get(variant, {})
            cells = [f"{fids[(variant, step, s)]:.1f}" if (variant, step, s) in fids else "" for s, _ in SAMPLERS]
            keras_steps = round(step * STEP_COST.get(variant, 1.0) / STEPS_PER_KERAS_STEP.get(variant, 1.0))
            lines.append(f"| {variant} | {batch_size(variant)} | {seconds.get('32', float('nan')):.2f} | "
                         f"{seconds.get('64', float('nan')):.2f} | {step} | {keras_steps} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="Work directories and results (outside the repo).")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="Comma-separated names of VARIANTS.")
    parser.add_argument("--steps", type=int, nargs="+", default=[1000, 4000], help="Checkpoints to score.")
    parser.add_argument("--until", type=int, default=None,
                        help="Train only to this step for now (default: the last of --steps); the learning-rate "
                             f"schedule stays the {LENGTH}-step one, so later runs continue it.")
    parser.add_argument("--num", type=int, default=1000, help="Samples per FID.")
    parser.add_argument("--time-only", action="store_true", help="Only measure seconds per step (quiet machine).")
    parser.add_argument("--score-only", action="store_true", help="Only score the checkpoints there are (no training).")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    known = {**VARIANTS, **ATTENTION_LAYOUTS} if args.time_only else VARIANTS
    unknown = [v for v in variants if v not in known]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)} (choose from {', '.join(known)})")
    args.root.mkdir(parents=True, exist_ok=True)
    timing_path = args.root / "timing.json"
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
    if args.time_only:
        for size in (32, 64):
            for variant, seconds in seconds_per_step(variants, size).items():
                timing.setdefault(variant, {})[str(size)] = seconds
                log(f"{variant}: {seconds:.3f} s/step at {size}x{size}")
            timing_path.write_text(json.dumps(timing, indent=1))
    else:
        until = args.until or max(args.steps)
        for variant in variants:
            # --steps count steps at batch 64; a variant at another batch trains and is scored at equal images.
            steps = [scaled_step(variant, s) for s in args.steps]
            if not args.score_only:
                train(args.root, variant, steps, scaled_step(variant, until))
            finished = done(args.root)
            for step in [s for s in steps if s <= scaled_step(variant, until)]:
                for sampler, spacing in SAMPLERS:
                    if (variant, step, sampler, spacing) in finished:
                        continue
                    result = score(args.root, variant, step, sampler, spacing, args.num)
                    log(json.dumps(result))
                    append_record(args.root / "results.jsonl", result)
    if (args.root / "results.jsonl").exists():
        print(table(args.root, timing))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # results so far are in results.jsonl; a rerun skips them
        raise SystemExit("interrupted: rerun the same command to resume") from None
