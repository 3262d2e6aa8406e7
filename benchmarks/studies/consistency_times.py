"""Where a consistency student's second pass should start: FID at 2 passes against the time it re-noises to.

Run:  python -m benchmarks.studies.consistency_times --checkpoint runs/flowers32-consistency/students/consistency
          --out runs/consistency-times [--times 0.3 0.4 0.5 0.6 0.7] [--guidance 1.5] [--num 1000]

Multistep consistency sampling (Song et al. 2023, Algorithm 1) denoises pure noise in one pass, re-noises the image
to a time ``t`` and denoises again; the paper picks ``t`` per model by search. ``ddim sample --steps 2
--sampler consistency`` re-noises to the uniform grid's ``t = 0.5``. This study scores 2 passes with the second pass
at each of ``--times`` instead (``ddim eval``'s protocol, benchmarks.common), by giving the sampling program that
grid. Results go to ``<out>/consistency-times.jsonl``; a rerun skips the times already scored. The real images'
features are cached in ``<out>/eval_cache`` (computed once).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import ddim  # sets the XLA flags before JAX starts

from benchmarks.common import fid_request, log

RESULTS = "consistency-times.jsonl"


def two_pass_grid(second_time: float):
    """``time_grid``'s replacement: the network at ``t = 1`` and ``t = second_time``, landing on 0 after the last."""
    import jax.numpy as jnp

    from ddim import samplers

    def grid(model, spec, start=1.0):
        times = jnp.asarray([1.0, second_time], jnp.float32)
        return samplers.TimeGrid(times, jnp.asarray([second_time, 0.0], jnp.float32))

    return grid


def score(source, second_time: float, guidance: float, num: int, out: Path) -> dict:
    """FID, KID and class accuracy of 2 consistency passes whose second starts at ``second_time``."""
    import jax

    from ddim.evaluation import evaluate
    from ddim.sampling import process
    from ddim.spec import SamplingSpec

    spec = SamplingSpec(steps=2, sampler="consistency", guidance=guidance)
    default_grid = process.time_grid
    process.time_grid = two_pass_grid(second_time)
    jax.clear_caches()  # the compiled program holds the grid: compile it again for this time
    try:
        record = evaluate(fid_request(source, spec, num, out), log=log, show_progress=False)
    finally:
        process.time_grid = default_grid
        jax.clear_caches()
    return {"source": str(source), "passes": 2, "second_time": second_time, "guidance": guidance, "num": num,
            "step": record["step"], "fid": record["fid"], "kid": record["kid_mean"],
            "class_accuracy": record.get("class_accuracy"), "fid_feature_net": record["fid_feature_net"]}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="the consistency student's work directory")
    parser.add_argument("--out", type=Path, required=True, help="results and the real images' feature cache")
    parser.add_argument("--times", type=float, nargs="+", default=[0.3, 0.4, 0.5, 0.6, 0.7],
                        help="times in (0, 1) the second pass starts from (0.5 is the uniform grid's)")
    parser.add_argument("--guidance", type=float, default=1.5)
    parser.add_argument("--num", type=int, default=1000, help="samples per score")
    args = parser.parse_args(argv)
    if not all(0.0 < t < 1.0 for t in args.times):
        parser.error("every --times value must be between 0 and 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / RESULTS
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    done = {(row["source"], row["second_time"], row["guidance"], row["num"]) for row in rows}
    for second_time in args.times:
        if (args.checkpoint, second_time, args.guidance, args.num) in done:
            continue
        log(f"2 passes, the second from t = {second_time}, guidance {args.guidance}, {args.num} samples")
        row = score(args.checkpoint, second_time, args.guidance, args.num, args.out)
        with results.open("a") as stream:
            stream.write(json.dumps(row) + "\n")
        rows.append(row)
    print("| second pass from t | FID | KID | class acc. |\n| ---: | ---: | ---: | ---: |")
    for row in sorted((r for r in rows if r["source"] == args.checkpoint), key=lambda r: r["second_time"]):
        print(f"| {row['second_time']:g} | {row['fid']:.1f} | {row['kid']:.4f} | {100 * row['class_accuracy']:.1f} % |")


if __name__ == "__main__":
    main()
