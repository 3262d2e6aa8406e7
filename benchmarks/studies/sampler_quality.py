"""Sampling quality per network call: every sampler x spacing x step count, by FID and against a converged reference.

Run:  python -m benchmarks.studies.sampler_quality --checkpoint runs/flowers64/checkpoints/5000 [--num 256] \
          [--out bench-samplers/]
      python -m benchmarks.studies.sampler_quality --pretrained flowers32 --fid [--fid-num 1000] [--eval-root DIR]

From fixed initial noise (``--seed``), ``--num`` images are generated with a ``--reference-steps``-step
DDIM run (uniform grid, 1000 steps by default): the converged solution of the probability-flow ODE. Each
sampler x spacing then generates the same images at each of ``--steps`` from the same noise, and the
script reports the RMSE to the reference in [0, 1] pixels and the wall time per image. A second, cheaper
DDIM run at half the reference steps on ``--check-num`` images estimates the reference's own error (DDIM
is first order, so the error of the N-step run is about its distance to the N/2-step run).

Closeness to the ODE solution is not sample quality (the two can rank samplers differently), so sampler
advice rests on FID: with ``--fid`` each setting also samples ``--fid-num`` images (seed ``--seed``) and
scores their FID and KID as ``ddim eval --split all`` does (benchmarks.studies.recipe's protocol: the standard FID
Inception against every real Flowers image at the model's size). The real features are computed once, in
``<eval-root>/eval_cache`` (default ``<out>``), where ``ddim eval``'s lines also go. ``--num 0`` skips the
reference and the RMSE.

``--pretrained NAME`` measures a model bundled with ddim; without ``--checkpoint`` or ``--pretrained`` it
trains ``ddim/configs/smoke.toml`` first (needs the dataset) and says so. Results are appended to
``<out>/samplers.jsonl`` as they come (a rerun with the same settings skips what is done, the reference is
cached in ``<out>/``), and a Markdown table is printed at the end: RMSE per step count, or with ``--fid``
one row per setting ranked by FID within each step count. Timings are wall clock on whatever else the
machine is doing: compare them within one run (the load average is recorded).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import time
from pathlib import Path

import ddim  # sets the XLA flags before JAX starts
from ddim import runtime
from ddim.workdir.records import append_record, read_records

from benchmarks.common import add_model_options, log, model_source, score_fid

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


def read_results(path: Path, common: dict, metric: str) -> list[dict]:
    """The rows of ``path`` measured with the settings ``common`` that hold ``metric``."""
    rows = read_records(path)
    return [r for r in rows if metric in r and all(r.get(k) == v for k, v in common.items())]


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


def fid_table(fids: list[dict], rmses: list[dict]) -> str:
    """One row per setting, ranked by FID (lower is better) within each step count; the RMSE beside it."""
    rmse = {(r["sampler"], r["spacing"], r["steps"]): r for r in rmses}
    lines = ["| steps | rank | sampler | spacing | FID | KID | RMSE to reference | s/image |", "|" + " --- |" * 8]
    for count, group in itertools.groupby(sorted(fids, key=lambda r: (r["steps"], r["fid"])), key=lambda r: r["steps"]):
        for rank, r in enumerate(group, 1):
            other = rmse.get((r["sampler"], r["spacing"], count))
            cells = (f"{other['rmse']:.4f}", f"{other['seconds_per_image']:.3g}") if other else ("", "")
            lines.append(f"| {count} | {rank} | {r['sampler']} | {r['spacing']} | {r['fid']:.1f} | {r['kid']:.4f} | "
                         + " | ".join(cells) + " |")
    if fids:
        first = fids[0]
        lines.append(f"\nFID and KID: {first['fid_num']} samples (seed {first['seed']}) against all "
                     f"{first['real_num']} real images, {first['fid_feature_net']}.")
    return "\n".join(lines)


def rmse_results(pipe, args, settings: list[tuple[int, str, str]], results_file: Path) -> list[dict]:
    """The RMSE of every setting to the ``--reference-steps`` DDIM reference (and the reference's own error)."""
    generate = FixedNoiseSampler(pipe, min(args.batch_size, args.num))
    noise = initial_noise(pipe, args.num, args.seed)
    key = hashlib.sha256(f"{pipe.path.resolve()}|{args.seed}|{args.batch_size}".encode()).hexdigest()[:12]
    reference = reference_images(generate, noise, args.reference_steps, args.out / f"reference_{key}.npz")
    if len(reference) < args.num:
        raise SystemExit(f"the cached reference has {len(reference)} images, fewer than --num {args.num}")
    reference = reference[: args.num]

    common = {"checkpoint": str(pipe.path), "step": pipe.step, "num": args.num, "seed": args.seed,
              "reference_steps": args.reference_steps}
    done = {(r["sampler"], r["spacing"], r["steps"]) for r in read_results(results_file, common, "rmse")}

    if args.check_num and ("check", "uniform", args.reference_steps // 2) not in done:
        count = min(args.check_num, args.num)
        images, seconds, _ = generate(noise[:count], args.reference_steps // 2, "ddim", "uniform")
        record = {**common, "sampler": "check", "spacing": "uniform", "steps": args.reference_steps // 2,
                  "check_num": count, "rmse": rmse(images, reference[:count]), "seconds_per_image": seconds / count}
        log(f"reference check: DDIM {args.reference_steps // 2} vs {args.reference_steps} steps on {count} images: "
            f"RMSE {record['rmse']:.5f} (about the reference's own error)")
        append_record(results_file, record)

    for count, sampler, spacing in settings:
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
        append_record(results_file, record)
    return read_results(results_file, common, "rmse")


def fid_results(source, pipe, args, settings: list[tuple[int, str, str]], results_file: Path,
                feature_extractor_factory=None) -> list[dict]:
    """FID and KID of ``--fid-num`` samples of every setting (``ddim eval --split all``)."""
    from ddim.spec import SamplingSpec

    common = {"checkpoint": str(pipe.path), "step": pipe.step, "fid_num": args.fid_num, "seed": args.seed,
              "batch_size": args.batch_size}
    done = {(r["sampler"], r["spacing"], r["steps"]) for r in read_results(results_file, common, "fid")}
    todo = [setting for setting in settings if (setting[1], setting[2], setting[0]) not in done]
    if todo and feature_extractor_factory is None:
        from ddim.evaluation.fid_inception import standard_factory

        feature_extractor_factory = standard_factory(log=log)  # one network, compiled once, for every setting
    for count, sampler, spacing in todo:
        record = score_fid(source, SamplingSpec(steps=count, sampler=sampler, spacing=spacing), args.fid_num,
                           args.eval_root or args.out, seed=args.seed, batch_size=args.batch_size,
                           feature_extractor_factory=feature_extractor_factory)
        row = {**common, "sampler": sampler, "spacing": spacing, "steps": count, "fid": record["fid"],
               "kid": record["kid_mean"], "real_num": record["real_num"],
               "fid_feature_net": record["fid_feature_net"], "wall_time_s": record["wall_time_s"]}
        log(f"{sampler:9s} {spacing:8s} {count:4d} steps: FID {row['fid']:.2f}, KID {row['kid']:.4f}")
        append_record(results_file, row)
    return read_results(results_file, common, "fid")


def main(argv=None, feature_extractor_factory=None) -> list[dict]:
    """Measure, append to ``<out>/samplers.jsonl``, print the table; the rows of this run's settings
    (``feature_extractor_factory`` replaces the FID Inception: tests only)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_options(parser)
    parser.add_argument("--num", type=int, default=256, help="images for the RMSE (default 256; 0: no RMSE)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", default="5,10,20,50", help="comma-separated step counts")
    parser.add_argument("--samplers", default="ddim,dpmpp-2m,dpmpp-3m")
    parser.add_argument("--spacings", default="uniform,logsnr,karras")
    parser.add_argument("--reference-steps", type=int, default=1000)
    parser.add_argument("--check-num", type=int, default=64, help="images for the reference's own error (0: skip)")
    parser.add_argument("--fid", action="store_true", help="also score FID and KID of every setting")
    parser.add_argument("--fid-num", type=int, default=1000, help="samples per FID (default 1000)")
    parser.add_argument("--eval-root", type=Path, default=None,
                        help="where the real images' features are cached (<eval-root>/eval_cache) and ddim eval's "
                             "lines go (default: --out)")
    parser.add_argument("--out", type=Path, default=Path("bench-samplers"), help="results and caches")
    args = parser.parse_args(argv)
    if not args.num and not args.fid:
        parser.error("--num 0 measures no RMSE: add --fid, or nothing is measured")
    steps = [int(s) for s in args.steps.split(",")]
    settings = [(count, sampler, spacing) for count in steps for sampler in args.samplers.split(",")
                for spacing in args.spacings.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)

    source = model_source(args, args.out)
    pipe = ddim.load(source)
    log(f"model {pipe.path} (step {pipe.step}, config {pipe.config.name}); seed {args.seed}")
    results_file = args.out / "samplers.jsonl"
    rmses = rmse_results(pipe, args, settings, results_file) if args.num else []
    # A work directory could gain a newer checkpoint meanwhile: FID scores the step directory loaded now.
    fids = fid_results(source if isinstance(source, str) else pipe.path, pipe, args, settings, results_file,
                       feature_extractor_factory) if args.fid else []
    wanted = set(settings)
    fids = [r for r in fids if (r["steps"], r["sampler"], r["spacing"]) in wanted]
    print(fid_table(fids, rmses) if args.fid else markdown_table([r for r in rmses if r["sampler"] != "check"], steps))
    return rmses + fids


if __name__ == "__main__":
    main()
