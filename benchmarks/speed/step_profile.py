"""Where a CPU training step's time goes, by XLA operation: XLA:CPU's own trace of each operation it runs.

Run:  python -m benchmarks.speed.step_profile --config flowers64 [--set key=value ...] [--steps 2] [--top 30]

Prints the operations (fusions, YNNPACK calls, matmuls) of the compiled train step grouped by kind and by
where they come from (forward or backward pass, and the JAX operation, from XLA's metadata), with their
milliseconds per step. XLA:CPU runs convolutions asynchronously on its thread pool, so their trace events
cover only the launch: what the listed operations do not account for of the step's wall time is, almost
all, the convolutions (docs/research/cpu-speed.md has the profile and a sampling profiler's view of it).
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import tempfile
import time

if __name__ == "__main__":
    # XLA:CPU records an event for each operation only with this flag, which must be set before JAX starts.
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_enable_xprof_traceme=true".strip()

import ddim  # noqa: E402  (adds ddim's XLA flags before JAX starts, after the flag above)
from ddim import runtime  # noqa: E402

if __name__ == "__main__":
    runtime.restart_with_fast_allocator()  # the allocator the `ddim` command runs with


def operation_origins(hlo_text: str) -> dict[str, tuple[str, str]]:
    """Each instruction of an optimised HLO module -> (``"forward"`` or ``"backward"``, the JAX operation)."""
    origins = {}
    for match in re.finditer(r'^\s+%([\w.\-]+) = [^\n]*?metadata=\{op_name="([^"]+)"', hlo_text, re.M):
        op_name = match.group(2)
        origins[match.group(1)] = ("backward" if "transpose(" in op_name else "forward", op_name.split("/")[-1])
    return origins


def group_events(durations: dict[str, float], origins: dict[str, tuple[str, str]]) -> collections.Counter:
    """Nanoseconds by (kind, pass, JAX operation); the kind is the instruction's name without its number."""
    grouped = collections.Counter()
    for name, nanoseconds in durations.items():
        where, op = origins.get(name, ("-", "-"))  # layout changes XLA adds carry no metadata
        grouped[(re.sub(r"\.\d+$", "", name), where, op)] += nanoseconds
    return grouped


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="flowers64")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    parser.add_argument("--steps", type=int, default=2, help="traced steps (after a warm-up step)")
    parser.add_argument("--top", type=int, default=30, help="rows to print")
    args = parser.parse_args(argv)

    import jax
    import numpy as np
    from jax._src.profiler import ProfileData

    from ddim.train import state as train_lib

    config = ddim.load_config(args.config, args.overrides)
    t = config.train
    state = train_lib.create_train_state(config, jax.random.key(0), total_steps=t.max_steps or 1000)
    shape = (t.batch_size, config.model.image_size, config.model.image_size, config.model.channels)
    batch = jax.device_put({"image": np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8),
                            "label": np.full(t.batch_size, -1, np.int32)})
    rng = jax.random.key(1)
    compiled = train_lib.compiled_steps(config)[0].lower(state, batch, rng).compile()
    state, metrics = compiled(state, batch, rng)
    jax.block_until_ready(metrics)
    with tempfile.TemporaryDirectory() as trace_dir:
        start = time.perf_counter()
        with jax.profiler.trace(trace_dir):
            for _ in range(args.steps):
                state, metrics = compiled(state, batch, rng)
            jax.block_until_ready((state, metrics))
        wall = (time.perf_counter() - start) / args.steps
        trace = ProfileData.from_file(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[0])
        durations = collections.Counter()
        for plane in trace.planes:
            for line in plane.lines:
                if "XLAEigen" not in line.name and "PjRtCpuClient" not in line.name:
                    continue  # XLA's thread pool and its caller, not Python or the profiler itself
                for event in line.events:
                    if "ThunkExecutor" not in event.name and not event.name.startswith("end:"):
                        durations[event.name] += event.duration_ns
    grouped = group_events(durations, operation_origins(compiled.as_text()))
    total = sum(grouped.values())
    print(f"{config.name}: {wall:.3f} s a step while traced; the operations below {total / 1e6 / args.steps:.0f} ms "
          f"a step, the rest is (almost all) the convolutions")
    for (kind, where, op), nanoseconds in grouped.most_common(args.top):
        print(f"{nanoseconds / 1e6 / args.steps:9.1f} ms {100 * nanoseconds / total:5.1f}%  {kind:30s} {where:8s} {op}")


if __name__ == "__main__":
    main()
