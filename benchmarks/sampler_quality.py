"""Sampling quality per network call: every sampler x spacing x step count against a converged reference.

Run:  python benchmarks/sampler_quality.py --checkpoint runs/flowers64/checkpoints/5000 [--num 256] [--out bench-samplers/]

From fixed initial noise (``--seed``), ``--num`` images are generated with a ``--reference-steps``-step
DDIM run (uniform grid, 1000 steps by default): the converged solution of the probability-flow ODE. Each
sampler x spacing then generates the same images at each of ``--steps`` from the same noise, and the
script reports the RMSE to the reference in [0, 1] pixels and the wall time per image. A second, cheaper
DDIM run at half the reference steps on ``--check-num`` images estimates the reference's own error (DDIM
is first order, so the error of the N-step run is about its distance to the N/2-step run).

Without ``--checkpoint`` it trains ``configs/smoke.toml`` first (needs the dataset) and says so. Results
are appended to ``<out>/samplers.jsonl`` as they come (a rerun with the same settings skips what is done,
the reference is cached in ``<out>/``), and a Markdown table is printed at the end. Timings are wall
clock on whatever else the machine is doing: compare them within one run (the load average is recorded).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import ddim  # noqa: E402  (sets the XLA flags before JAX starts)
from ddim import runtime  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import log, resolve_checkpoint  # noqa: E402

if __name__ == "__main__":
    runtime.restart_with_fast_allocator()  # the allocator the `ddim` command runs with


class FixedNoiseSampler:
    """Generates float images in [0, 1] from given initial noise, batch by batch, one compile per setting."""

    def __init__(self, pipe, batch_size: int):
        import jax

        from ddim.sampling import process
        from ddim.spec import SamplingSpec

        self.pipe, self.batch_size = pipe, batch_size
        model = pipe.model

        def generate(variables, noise, steps, sampler, spacing):
            spec = SamplingSpec(steps=steps, sampler=sampler, spacing=spacing)
            return process.generate(model, variables, jax.random.key(0), noise.shape[0], spec, latents=noise)

        self._jitted = jax.jit(generate, static_argnames=("steps", "sampler", "spacing"))

    def __call__(self, noise, steps: int, sampler: str, spacing: str, on_batch=None):
        """``(images, seconds, compile_seconds)``: the compile is done (and timed) before the clock starts."""
        import jax
        import numpy as np

        batches = [noise[start : start + self.batch_size] for start in range(0, len(noise), self.batch_size)]
        compile_started = time.perf_counter()
        compiled = {}
        for batch in batches:
            if batch.shape not in compiled:
                compiled[batch.shape] = self._jitted.lower(
                    self.pipe.variables, batch, steps=steps, sampler=sampler, spacing=spacing
                ).compile()
        compile_seconds = time.perf_counter() - compile_started
        started = time.perf_counter()
        outputs = []
        for index, batch in enumerate(batches):
            outputs.append(np.asarray(jax.block_until_ready(compiled[batch.shape](self.pipe.variables, batch))))
            if on_batch is not None:
                on_batch(index, outputs[-1])
        return np.concatenate(outputs), time.perf_counter() - started, compile_seconds


def initial_noise(pipe, num: int, seed: int):
    """Image ``i``'s noise is ``normal(fold_in(key(seed), i))``: a larger ``--num`` extends a smaller one."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    key = jax.random.key(seed)
    draw = jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(key, i), pipe.model.image_shape))
    return np.asarray(draw(jnp.arange(num)))


def reference_images(generate, noise, steps: int, cache: Path):
    """The ``steps``-step DDIM images, cached in ``cache`` and resumable batch by batch."""
    import numpy as np

    done = {}
    if cache.exists():
        with np.load(cache) as stored:
            done = {int(key.split("_")[1]): stored[key] for key in stored.files}
    batch = generate.batch_size
    missing = [i for i in range(0, len(noise), batch) if i // batch not in done]
    if missing:
        log(f"reference: {steps} DDIM steps for {len(missing) * batch} images (cached in {cache})")
    for start in missing:
        started = time.perf_counter()
        images, _, _ = generate(noise[start : start + batch], steps, "ddim", "uniform")
        done[start // batch] = images
        np.savez(cache.with_suffix(".tmp.npz"), **{f"batch_{key}": value for key, value in done.items()})
        os.replace(cache.with_suffix(".tmp.npz"), cache)
        log(f"  reference batch {start // batch + 1}/{-(-len(noise) // batch)}: {time.perf_counter() - started:.0f}s")
    return np.concatenate([done[key] for key in sorted(done)])


def rmse(images, reference) -> float:
    import numpy as np

    return float(np.sqrt(np.mean((np.asarray(images, np.float64) - reference) ** 2)))


def read_results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def markdown_table(results: list[dict], steps: list[int]) -> str:
    """RMSE to the reference (and seconds per image) per sampler/spacing row and step-count column."""
    rows: dict[tuple[str, str], dict[int, dict]] = {}
    for result in results:
        rows.setdefault((result["sampler"], result["spacing"]), {})[result["steps"]] = result
    header = "| sampler | spacing | " + " | ".join(f"{s} steps" for s in steps) + " |"
    lines = [header, "|" + " --- |" * (len(steps) + 2)]
    for (sampler, spacing), by_steps in rows.items():
        cells = []
        for s in steps:
            r = by_steps.get(s)
            cells.append(f"{r['rmse']:.4f} ({r['seconds_per_image']:.3g} s)" if r else "")
        lines.append(f"| {sampler} | {spacing} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="work dir, checkpoints dir or step dir (default: train the smoke config)")
    parser.add_argument("--num", type=int, default=256, help="images (default 256)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", default="5,10,20,50", help="comma-separated step counts")
    parser.add_argument("--samplers", default="ddim,dpmpp-2m,dpmpp-3m")
    parser.add_argument("--spacings", default="uniform,logsnr,karras")
    parser.add_argument("--reference-steps", type=int, default=1000)
    parser.add_argument("--check-num", type=int, default=64, help="images for the reference's own error (0: skip)")
    parser.add_argument("--out", type=Path, default=Path("bench-samplers"), help="results and caches")
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)

    pipe = ddim.load(resolve_checkpoint(args.checkpoint, args.out))
    log(f"checkpoint {pipe.path} (step {pipe.step}, config {pipe.config.name}); {args.num} images, seed {args.seed}")
    generate = FixedNoiseSampler(pipe, min(args.batch_size, args.num))
    noise = initial_noise(pipe, args.num, args.seed)
    key = hashlib.sha256(f"{pipe.path.resolve()}|{args.seed}|{args.batch_size}".encode()).hexdigest()[:12]
    reference = reference_images(generate, noise, args.reference_steps, args.out / f"reference_{key}.npz")
    if len(reference) < args.num:
        raise SystemExit(f"the cached reference has {len(reference)} images, fewer than --num {args.num}")
    reference = reference[: args.num]

    results_file = args.out / "samplers.jsonl"
    common = {"checkpoint": str(pipe.path), "step": pipe.step, "num": args.num, "seed": args.seed,
              "reference_steps": args.reference_steps}
    done = {(r["sampler"], r["spacing"], r["steps"]) for r in read_results(results_file)
            if all(r.get(k) == v for k, v in common.items())}

    if args.check_num and ("check", "uniform", args.reference_steps // 2) not in done:
        count = min(args.check_num, args.num)
        images, seconds, _ = generate(noise[:count], args.reference_steps // 2, "ddim", "uniform")
        record = {**common, "sampler": "check", "spacing": "uniform", "steps": args.reference_steps // 2,
                  "check_num": count, "rmse": rmse(images, reference[:count]), "seconds_per_image": seconds / count}
        log(f"reference check: DDIM {args.reference_steps // 2} vs {args.reference_steps} steps on {count} images: "
            f"RMSE {record['rmse']:.5f} (about the reference's own error)")
        with open(results_file, "a") as file:
            file.write(json.dumps(record) + "\n")

    for count in steps:
        for sampler in args.samplers.split(","):
            for spacing in args.spacings.split(","):
                if (sampler, spacing, count) in done:
                    continue
                images, seconds, compile_seconds = generate(noise, count, sampler, spacing)
                record = {
                    **common, "sampler": sampler, "spacing": spacing, "steps": count,
                    "rmse": rmse(images, reference), "seconds_per_image": seconds / args.num,
                    "compile_seconds": compile_seconds, "load_average": os.getloadavg()[0],
                }
                log(f"{sampler:9s} {spacing:8s} {count:4d} steps: RMSE {record['rmse']:.4f}, "
                    f"{record['seconds_per_image']:.3f} s/image (load {record['load_average']:.1f})")
                with open(results_file, "a") as file:
                    file.write(json.dumps(record) + "\n")

    results = [r for r in read_results(results_file) if all(r.get(k) == v for k, v in common.items())]
    print(markdown_table([r for r in results if r["sampler"] != "check"], steps))
    return results


if __name__ == "__main__":
    main()
