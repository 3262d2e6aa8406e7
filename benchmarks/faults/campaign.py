"""Fault-injection campaign: kill -9 at random moments, damaged checkpoints, a full disk, two trainers,
a stop signalled to one of two processes; prints a table of faults injected, runs resumed, steps lost and
data lost.

Run:  TFDS_DATA_DIR=... python -m benchmarks.faults.campaign [--kills 24] [--seed 0] [--root /tmp/ddim-faults]
      [--config smoke] [--set key=value ...] [--out faults.json]

Every training run is a real ``ddim train`` process (the smoke config on the real dataset by default, with
more epochs so that there is time to interrupt). The reference is one uninterrupted run; every campaign
ends with the same command run to completion, and its final checkpoint (parameters, optimiser state,
BatchNorm statistics, EMA weights) is compared bit for bit with the reference's.

- kill -9: in turn at a random moment of the process's life (start-up included), right after a random
  step, and in the middle of a checkpoint write (the process is frozen with SIGSTOP when orbax's
  temporary directory appears and killed only if the write is still unfinished). After each kill the
  same command resumes. "Steps lost" is the last step the killed run logged minus the step it resumed
  from (work redone); "data lost" is any checkpoint that was complete at the kill and not resumed from.
- damaged checkpoints: each variant applied to the newest checkpoint of a copy of the reference; the
  same command must skip it (one warning), resume from the previous one and end bit-identical; ``ddim
  sample`` on another copy must fall back too.
- disk full: a tmpfs sized for two checkpoints (mounted in a user and mount namespace of its own, ``unshare
  -rm``); the run must end with one ``error:`` line naming the last good checkpoint and leave no temporary
  directory; after the file system is enlarged the same command resumes to the end.
- two trainers: a second ``ddim train`` on a busy work directory must stop at once, naming the first.
- two processes (``jax.distributed`` on localhost, 1 CPU device each): SIGTERM to process 1 at a random
  step; both must stop at the same step with one checkpoint, and resume bit-identical to an
  uninterrupted two-process run.
- a read-only work directory (a tmpfs remounted read-only) and a dataset file missing: one ``error:`` line each.

The faults are injected with :mod:`benchmarks.faults.inject`, as the tests inject theirs
(:mod:`benchmarks.faults.kills` and :mod:`benchmarks.faults.scenarios` run them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.faults.kills import kill_campaign
from benchmarks.faults.runs import CAMPAIGN_SETTINGS, Context, Row, Run
from benchmarks.faults.scenarios import damaged_checkpoints, disk_full, one_line_errors, two_process_stop, two_trainers


def reference_run(ctx: Context) -> tuple[Path, dict]:
    """The uninterrupted run every other is compared with, and its timing (start-up, seconds a step)."""
    workdir = ctx.root / "reference"
    run = Run(ctx.train_args(workdir), ctx.logs / "reference.log")
    first_step_at = last_step_at = None
    first = last = None
    while run.process.poll() is None:
        step = run.last_step()
        now = time.monotonic()
        if step is not None and first is None:
            first, first_step_at = step, now
        if step is not None and step != last:
            last, last_step_at = step, now
        time.sleep(0.002)
    ended = time.monotonic()
    if run.wait() != 0:
        sys.exit(f"the reference run failed:\n{run.text()[-3000:]}")
    total = run.last_step()
    step_s = (last_step_at - first_step_at) / max(1, last - first) if last and first and last > first else 0.05
    timing = dict(total_steps=total, startup_s=first_step_at - run.started, step_s=step_s,
                  tail_s=ended - last_step_at, wall_s=ended - run.started)
    return workdir, timing


def run_faults(ctx: Context, reference: Path, timing: dict) -> list[Row]:
    """Every fault in turn, each row printed as it is done."""
    rows = []
    for part in (lambda: [kill_campaign(ctx, reference, timing)], lambda: damaged_checkpoints(ctx, reference),
                 lambda: [disk_full(ctx, reference)], lambda: [two_trainers(ctx, reference)],
                 lambda: [two_process_stop(ctx)], lambda: [one_line_errors(ctx, reference)]):
        for row in part():
            rows.append(row)
            print(f"{'ok ' if row.ok else 'FAIL'} {row.fault}: injected {row.injected}, resumed {row.resumed}, "
                  f"steps lost {row.steps_lost}, data lost {row.data_lost}", flush=True)
    return rows


def print_table(rows: list[Row]) -> None:
    print()
    print("| fault | injected | runs resumed | steps lost | data lost | result |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row.fault} | {row.injected} | {row.resumed} | {row.steps_lost} | {row.data_lost} | "
              f"{'ok' if row.ok else 'FAILED'} |")
    print()
    for row in rows:
        for note in row.notes:
            print(f"- {row.fault}: {note}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="smoke")
    parser.add_argument("--set", dest="settings", action="append", default=[], help="extra config overrides")
    parser.add_argument("--kills", type=int, default=24, help="kill -9 faults to inject (at least 20 for the report)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", type=Path, default=Path("/tmp/ddim-faults"))
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.root.exists():
        shutil.rmtree(args.root)
    ctx = Context(root=args.root, logs=args.root / "logs", cache=args.root / "jax-cache", config=args.config,
                  settings=[*CAMPAIGN_SETTINGS, *args.settings], kills=args.kills, seed=args.seed)
    ctx.logs.mkdir(parents=True)
    started = time.monotonic()
    load = os.getloadavg()
    reference, timing = reference_run(ctx)
    print(f"reference: {timing['total_steps']} steps, start-up {timing['startup_s']:.1f}s, "
          f"{timing['step_s'] * 1000:.0f} ms/step, {timing['wall_s']:.1f}s in all", flush=True)
    rows = run_faults(ctx, reference, timing)
    print_table(rows)
    print(f"\n{sum(r.injected for r in rows)} faults, {sum(r.resumed for r in rows)} resumed runs, "
          f"{sum(r.data_lost for r in rows)} complete checkpoints lost; {time.monotonic() - started:.0f}s wall, "
          f"load average at start {load[0]:.1f} on {os.cpu_count()} CPUs")
    result = {"rows": [asdict(r) for r in rows], "reference": timing, "kills": ctx.kill_log}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    if not all(r.ok for r in rows):
        sys.exit(1)
    return result


if __name__ == "__main__":
    main()
