"""Speed benchmark: training and sampling throughput, compile times, memory, FLOPs and machine peak.

Run:  python -m benchmarks.speed.bench --config flowers64 [--set key=value ...] [--out result.json]
      python -m benchmarks.speed.bench --config folder64 --data path/to/images   (no TensorFlow needed)
      python -m benchmarks.speed.bench --config flowers64 --against-keras   (beside the Keras example)

Prints one JSON object (see docs/benchmarks.md). Everything runs on the default JAX backend, so the same
script measures a CPU, a GPU or a TPU. Training is timed on device-resident random batches (the model's
compute); the input pipeline (the data cache read by the Grain loader, as training reads it) is timed
separately, and compared with what training consumes. With ``--data`` the images come from that folder and
nothing imports TensorFlow, so it runs on a machine whose image has JAX but not TensorFlow. With
``--against-keras`` the Keras example's training step (``--keras-script``, which needs TensorFlow) is timed in a
subprocess, alternating with ddim's training windows, so both rates come from the same minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ddim  # sets the XLA flags before JAX starts
from ddim import onednn, runtime

from benchmarks.common import ddim_command, print_json
from benchmarks.speed.against_keras import KERAS_SCRIPT, BenchError, bench_against_keras, check_keras_available

if __name__ == "__main__":
    runtime.restart_with_fast_allocator()  # the allocator the `ddim` command runs with


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def flops_of(program) -> float | None:
    """XLA's FLOP count of a lowered or compiled program (None where the backend gives none)."""
    analysis = program.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    return float(analysis["flops"]) if analysis and "flops" in analysis else None


def flops_with_xla_convolutions(jitted, *args) -> float | None:
    """FLOPs of ``jitted(*args)`` traced with XLA's convolutions (XLA counts no FLOPs in a custom call, such as
    the oneDNN convolutions of ddim/onednn.py); the traces are dropped before and after, so nothing else runs them."""
    jitted.clear_cache()
    try:
        with onednn.disabled():
            return flops_of(jitted.lower(*args))
    finally:
        jitted.clear_cache()


def convolution_kernels(backend: str, dtype: str) -> str:
    if backend != "cpu":
        return f"xla ({backend})"
    if dtype != "float32":
        return f"xla ({dtype})"
    return "onednn" if onednn.available() else f"xla ({onednn.unavailable_reason()})"


def matmul_peak_gflops(size: int = 4096, repeats: int = 5) -> float:
    """fp32 GFLOP/s of a large jitted matmul: the machine's practical compute peak."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def bench_training(config, windows: int, window_steps: int) -> dict:
    import jax
    import numpy as np

    from ddim.train import state as train_lib

    t = config.train
    # A decaying learning rate needs the run's length; its value does not change the step's cost.
    state = train_lib.create_train_state(config, jax.random.key(0), total_steps=t.max_steps or 1000)
    shape = (t.batch_size, config.model.image_size, config.model.image_size, config.model.channels)
    batches = [
        jax.device_put({"image": np.random.default_rng(i).integers(0, 256, shape, dtype=np.uint8),
                        "label": np.full(t.batch_size, -1, np.int32)})
        for i in range(4)
    ]
    step_fn, _ = train_lib.compiled_steps(config)
    rng = jax.random.key(1)
    start = time.perf_counter()
    compiled = step_fn.lower(state, batches[0], rng).compile()
    compile_seconds = time.perf_counter() - start
    flops = flops_with_xla_convolutions(step_fn, state, batches[0], rng)
    state, metrics = compiled(state, batches[0], rng)  # warm-up step
    jax.block_until_ready(metrics)

    def time_windows(state, count: int):
        """``count`` windows of ``window_steps`` steps: the new state and each window's seconds per step."""
        seconds = []
        for _ in range(count):
            start = time.perf_counter()
            for i in range(window_steps):
                state, metrics = compiled(state, batches[i % len(batches)], rng)
            jax.block_until_ready((state, metrics))
            seconds.append((time.perf_counter() - start) / window_steps)
        return state, seconds

    state, step_times = time_windows(state, windows)
    rates = [t.batch_size / seconds for seconds in step_times]
    step_seconds = statistics.median(step_times)
    return {
        "train_batch_size": t.batch_size,
        "train_images_per_second": statistics.median(rates),
        "train_seconds_per_step": step_seconds,
        "train_window_images_per_second": rates,
        "train_compile_seconds": compile_seconds,
        "train_flops_per_step": flops,
        "train_gflops_per_second": flops / step_seconds / 1e9 if flops else None,
        "train_peak_rss_mb": peak_rss_mb(),
        "_state": state,
        "_time_windows": time_windows,
    }


def bench_sampling(config, state, num_images: int, steps: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp

    from ddim.model import DiffusionModel
    from ddim.sampling import programs
    from ddim.spec import SamplingSpec
    from ddim.train.state import ema_variables

    model = DiffusionModel(config.model)
    variables = ema_variables(state)
    # The program `ddim sample` and Pipeline.generate run on each batch (ddim.sampling.programs.map_batches).
    fn = programs.program_fn(programs.sample, model, SamplingSpec(steps=steps), num_images=num_images)
    rng, eta = jax.random.key(0), jnp.float32(0)
    start = time.perf_counter()
    compiled = fn.lower(variables, rng, eta, None).compile()
    compile_seconds = time.perf_counter() - start
    compiled(variables, rng, eta, None).block_until_ready()
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        compiled(variables, jax.random.key(i), eta, None).block_until_ready()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    # FLOPs of one network evaluation at the sampling batch size (one DDIM step).
    images = jnp.zeros((num_images, *model.image_shape))
    step = jax.jit(
        lambda v, x: model.apply(v, x, jnp.full((num_images, 1, 1, 1), 0.5), jnp.full((num_images, 1, 1, 1), 0.5),
                                 train=False, method=DiffusionModel.denoise)
    )
    step_flops = flops_with_xla_convolutions(step, variables, images)
    return {
        "sample_num_images": num_images,
        "sample_steps": steps,
        "sample_images_per_second": num_images / seconds,
        "sample_seconds": seconds,
        "sample_compile_seconds": compile_seconds,
        "sample_flops_per_step": step_flops,
        "sample_gflops_per_second": step_flops * steps / seconds / 1e9 if step_flops else None,
    }


def bench_cli(config, state, num: int, steps: int) -> dict:
    """Wall time of `ddim sample` in a fresh process, with a cold and then a warm compilation cache."""
    from ddim.checkpoint import Checkpointer, checkpoint_dir
    from ddim.train.state import state_to_dict

    with tempfile.TemporaryDirectory() as tmp:
        workdir, cache = Path(tmp) / "run", Path(tmp) / "cache"
        checkpointer = Checkpointer(checkpoint_dir(workdir))
        checkpointer.save(int(state.step), state_to_dict(state), config)
        checkpointer.close()
        result = {}
        for label in ("cold", "warm"):
            command = ddim_command("sample", "--workdir", str(workdir), "--num", str(num), "--steps", str(steps),
                                   "--out", str(Path(tmp) / label), "--compilation-cache", str(cache))
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            result[f"cli_sample_{label}_cache_seconds"] = time.perf_counter() - start
        result["cli_sample_num"], result["cli_sample_steps"] = num, steps
        return result


def bench_input_pipeline(config, batches: int, cache_dir: str | None = None) -> dict:
    """Build (or reuse) the data cache, then time the training batches read from it."""
    from ddim import data

    with tempfile.TemporaryDirectory() as tmp:
        workdir = cache_dir or tmp
        try:
            start = time.perf_counter()
            loaded = data.load(config, workdir, splits=("train",), log=lambda message: None, show_progress=False)
            load_seconds = time.perf_counter() - start
        except data.DataError as error:
            return {"input_pipeline": f"skipped: {error}"}
        images = loaded.train
        steps = data.steps_per_epoch(config, len(images))
        iterator = data.train_batches(images, config, 0, steps)
        next(iterator)
        start = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        seconds = time.perf_counter() - start
    return {
        "input_source": loaded.describe(),
        "input_train_images": len(images),
        "input_load_seconds": load_seconds,
        "input_cached_mb": images.nbytes / 2**20,
        "input_pipeline_images_per_second": batches * config.train.batch_size / seconds,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="flowers64")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    parser.add_argument("--windows", type=int, default=5, help="timing windows for training (median reported)")
    parser.add_argument("--window-steps", type=int, default=5, help="training steps per window")
    parser.add_argument("--sample-num", type=int, default=64)
    parser.add_argument("--sample-steps", type=int, default=20)
    parser.add_argument("--sample-repeats", type=int, default=3)
    parser.add_argument("--cli-num", type=int, default=16)
    parser.add_argument("--skip-sampling", action="store_true", help="skip the sampling timing (training only)")
    parser.add_argument("--skip-cli", action="store_true", help="skip the end-to-end `ddim sample` timings")
    parser.add_argument("--skip-input", action="store_true", help="skip the input pipeline timing")
    parser.add_argument("--data", help="an image folder: the input pipeline reads it (sets data.image_dir)")
    parser.add_argument("--data-cache", help="keep the data cache here (default: a temporary directory)")
    parser.add_argument("--input-batches", type=int, default=200, help="batches read to time the input pipeline")
    parser.add_argument("--against-keras", action="store_true",
                        help="also time the Keras example's training step (needs TensorFlow), alternating with ddim's")
    parser.add_argument("--keras-script", type=Path, default=KERAS_SCRIPT,
                        help="the Keras example's step script (default: ../shared/bench/keras_ddim_step.py)")
    parser.add_argument("--keras-rounds", type=int, default=2,
                        help="rounds of (ddim window, Keras run) for the comparison (median ratio reported)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def run(args) -> dict:
    """The benchmark of parsed ``args``: prints (and returns) the JSON result."""
    if args.against_keras:
        if args.keras_rounds < 1:
            raise BenchError(f"--keras-rounds must be at least 1, got {args.keras_rounds}")
        check_keras_available(args.keras_script)

    import jax

    overrides = list(args.overrides)
    if args.data:
        overrides.append(f"data.image_dir={json.dumps(str(Path(args.data).absolute()))}")
    config = ddim.load_config(args.config, overrides)
    result = {
        "config": config.name,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "jax_version": jax.__version__,
        "cpu_count": os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
        "model_dtype": config.model.dtype,
        # Which kernels run the float32 convolutions: oneDNN's (ddim/onednn.py) or XLA's, and why.
        "convolutions": convolution_kernels(jax.default_backend(), config.model.dtype),
    }
    result.update(bench_training(config, args.windows, args.window_steps))
    state, time_windows = result.pop("_state"), result.pop("_time_windows")
    if args.against_keras:
        state = bench_against_keras(config, result, state, time_windows, args.keras_rounds, args.keras_script)
    if not args.skip_sampling:
        result.update(bench_sampling(config, state, args.sample_num, args.sample_steps, args.sample_repeats))
    if not args.skip_cli:
        result.update(bench_cli(config, state, args.cli_num, args.sample_steps))
    if not args.skip_input:
        result.update(bench_input_pipeline(config, args.input_batches, args.data_cache))
        if "input_pipeline_images_per_second" in result:
            # What the input pipeline delivers per image training consumes (must stay well above 1).
            result["input_to_training_ratio"] = (
                result["input_pipeline_images_per_second"] / result["train_images_per_second"]
            )
    peak = matmul_peak_gflops(1024 if config.model.image_size < 32 else 4096)
    result["matmul_peak_gflops_per_second"] = peak
    for key in ("train", "sample"):
        achieved = result.get(f"{key}_gflops_per_second")
        result[f"{key}_fraction_of_matmul_peak"] = achieved / peak if achieved else None
    result["tensorflow_imported"] = "tensorflow" in sys.modules
    print_json(result, args.out)
    return result


if __name__ == "__main__":
    main()
