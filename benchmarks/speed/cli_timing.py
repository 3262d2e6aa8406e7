"""Wall time of whole ``ddim sample`` commands (Python start, model load, compilation or its cache, sampling, PNGs).

Run:  python -m benchmarks.speed.cli_timing --models flowers32-consistency flowers32 flowers64 \
          --out docs/results/cli-timing.jsonl [--sample-options "--steps 20 --guidance 3"]

Each model's command runs ``--repeats`` times in a row with a compilation cache of its own that starts empty,
so the first run compiles and the others are warm, as a user's second ``ddim sample`` is. One JSON line per
model: the wall seconds of each run (``time.perf_counter`` around the process) and the seconds ``ddim sample``
reports on its last line (sampling and writing, without Python's start and the imports), with the CPU and
its load average before the first run. Time on an otherwise idle machine.

Without ``--sample-options`` each command samples at the model's recorded defaults; a model whose record names
none yet (a bundle a rebuild has just exported) samples at the plain setting, so a recipe passes the defaults
it chose (``--sample-options "{defaults}"``), and the line names the options in its command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

from ddim.environment import cpu_model

from benchmarks.common import ddim_command

REPORTED = re.compile(r" in (\d+(?:\.\d+)?)s\s*$")


def cpu_name() -> str:
    return f"{os.cpu_count()}-core {cpu_model()}"


def time_command(name: str, num: int, repeats: int, options: str = "") -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "DDIM_COMPILATION_CACHE": str(Path(scratch) / "jax-cache")}
        load = os.getloadavg()[0]
        walls, reported = [], []
        for run in range(repeats):
            command = ddim_command("sample", "--pretrained", name, "--num", str(num),
                                   "--out", str(Path(scratch) / f"run{run}"), *shlex.split(options))
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            walls.append(round(time.perf_counter() - started, 2))
            if done.returncode:
                raise SystemExit(f"error: {' '.join(command)} failed: {done.stderr.strip().splitlines()[-1]}")
            last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            match = REPORTED.search(last)
            reported.append(float(match.group(1)) if match else None)
    shown = " ".join(["ddim sample --pretrained", name, "--num", str(num), "--out DIR", *shlex.split(options)])
    return {"measured": datetime.date.today().isoformat(), "command": shown,
            "setting": "the options in the command" if options.strip() else "the model's defaults", "cpu": cpu_name(),
            "load_average_before": round(load, 2), "wall_seconds": walls, "reported_seconds": reported,
            "note": f"{repeats} runs in a row, the first with an empty compilation cache"}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", required=True, help="bundled models, by name")
    parser.add_argument("--num", type=int, default=16, help="images per command")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="append one JSON line per model here")
    parser.add_argument("--sample-options", default="",
                        help="options for each ddim sample command, in one string (default: none, the model's own)")
    args = parser.parse_args(argv)
    lines = []
    for name in args.models:
        line = time_command(name, args.num, args.repeats, args.sample_options)
        print(json.dumps(line), flush=True)
        lines.append(line)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(line) + "\n")
    return lines


if __name__ == "__main__":
    main()
