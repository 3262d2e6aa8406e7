"""ddim's training rate beside the Keras DDIM example's, timed in turns on one machine (``bench --against-keras``).

The Keras example's network and training step is a script of its own (``--keras-script``; it needs TensorFlow with
Keras 3) that prints one result line. :func:`bench_against_keras` alternates one of ddim's timing windows and one
run of that script, so that both rates come from the same minutes.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from ddim import runtime

from benchmarks.common import REPO

# The Keras DDIM example's network and training step, timed with TensorFlow; it lives beside the repository.
KERAS_SCRIPT = REPO.parent / "shared" / "bench" / "keras_ddim_step.py"
# What the script prints: "keras 64px b64 step 3.094s img/s 20.7" ("keras xla ..." with XLA).
KERAS_LINE = re.compile(r"^keras(?: xla)? (?P<size>\d+)px b(?P<batch>\d+) step (?P<step>[\d.]+)s img/s (?P<rate>[\d.]+)$")


class BenchError(Exception):
    """A benchmark that cannot run as asked: reported as one ``error:`` line."""


def keras_environment(environ) -> dict[str, str]:
    """``environ`` for the Keras script: as a user runs it, without what ddim adds to its own process.

    ddim's XLA:CPU flags (``ddim.runtime.CPU_XLA_FLAGS``), and the huge-page malloc tunable and the
    preloaded large-block layer that the restart added, are taken out; the user's own settings stay.
    """
    env = dict(environ)
    ours = {f"{name}={value}" for name, value in runtime.CPU_XLA_FLAGS.items()}
    flags = [flag for flag in env.pop("XLA_FLAGS", "").split() if flag not in ours]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    if env.pop(runtime.RESTARTED_MARK, None):
        tunables = [t for t in env.pop("GLIBC_TUNABLES", "").split(":") if t and t != runtime.FAST_MALLOC_TUNABLE]
        if tunables:
            env["GLIBC_TUNABLES"] = ":".join(tunables)
        layer = runtime.KEEP_LARGE_BLOCKS_SOURCE.stem
        preloaded = [p for p in env.pop("LD_PRELOAD", "").split() if not Path(p).name.startswith(layer)]
        if preloaded:
            env["LD_PRELOAD"] = " ".join(preloaded)
    return env


def parse_keras_output(text: str) -> dict:
    """The Keras script's result line (its last matching line) as numbers; ValueError when there is none."""
    for line in reversed(text.splitlines()):
        match = KERAS_LINE.match(line.strip())
        if match:
            return {"image_size": int(match["size"]), "batch_size": int(match["batch"]),
                    "seconds_per_step": float(match["step"]), "images_per_second": float(match["rate"])}
    raise ValueError("no 'keras <size>px b<batch> step <s>s img/s <rate>' line in its output")


def run_keras_step(script: Path, image_size: int) -> dict:
    """Time the Keras example's step at ``image_size`` in a fresh process (it prints one result line)."""
    done = subprocess.run([sys.executable, str(script), str(image_size)], capture_output=True, text=True,
                          env=keras_environment(os.environ))
    try:
        return parse_keras_output(done.stdout)
    except ValueError:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BenchError(f"the Keras step script failed (exit {done.returncode}): {last}") from None


def keras_comparison(ddim_rates: list[float], keras_runs: list[dict]) -> dict:
    """ddim's training rate beside the Keras example's, from alternating rounds (ddim, Keras, ddim, Keras, ...).

    The ratio is the median of each round's ddim/Keras ratio, so each compares rates from the same minutes.
    """
    keras_rates = [run["images_per_second"] for run in keras_runs]
    return {
        "keras_images_per_second": statistics.median(keras_rates),
        "keras_round_images_per_second": keras_rates,
        "keras_batch_size": keras_runs[0]["batch_size"],
        "keras_image_size": keras_runs[0]["image_size"],
        "ddim_round_images_per_second": list(ddim_rates),
        "train_to_keras_ratio": statistics.median(d / k for d, k in zip(ddim_rates, keras_rates)),
    }


def bench_against_keras(config, result: dict, state, time_windows, rounds: int, script: Path):
    """Alternate ddim's training windows and the Keras script ``rounds`` times; returns the new state."""
    ddim_rates, keras_runs = [], []
    for _ in range(rounds):
        # The Keras script times its steps after three warm-up steps; ddim's window gets one untimed window
        # first too, because a process that sat idle through the Keras run steps slowly at first (at 32x32,
        # 72 against 118 images/s for the first three steps after 30 idle seconds, XLA's convolutions or not).
        state, _ = time_windows(state, 1)
        state, seconds = time_windows(state, 1)
        ddim_rates.append(config.train.batch_size / seconds[0])
        keras_runs.append(run_keras_step(script, config.model.image_size))
    result.update(keras_comparison(ddim_rates, keras_runs))
    return state


def check_keras_available(script: Path) -> None:
    """Fail before any timing when ``--against-keras`` cannot run: no script, or no TensorFlow."""
    import importlib.util

    if not script.is_file():
        raise BenchError(f"the Keras step script is not at {script} (give its path with --keras-script)")
    if importlib.util.find_spec("tensorflow") is None:
        raise BenchError("--against-keras needs TensorFlow (with Keras 3) installed to run the Keras example")
