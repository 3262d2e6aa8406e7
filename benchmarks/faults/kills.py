"""kill -9 at random moments: during start-up, right after a random step, and in the middle of a checkpoint write.

Each killed run is resumed by the same command; "steps lost" is the last step a killed run logged minus the step
the next run resumed from (work redone), "data lost" any checkpoint that was complete at the kill and not resumed
from. The last run goes to the end, and its final state must be bit-identical to the uninterrupted reference's.
"""

from __future__ import annotations

import random
import re
import signal
import time
from pathlib import Path

from benchmarks.faults.inject import TMP_GLOB, freeze_during_a_save, partial_saves
from benchmarks.faults.runs import Context, Row, Run, checkpoints_of, complete_steps, identical, resumed_from

MODES = ("moment", "step", "save")
PHASES = ("start-up", "training", "checkpoint write", "end (final save, grid)")


def kill_campaign(ctx: Context, reference: Path, timing: dict) -> Row:
    """``ctx.kills`` kills, in turn of each mode, spread over the training of one work directory."""
    row = Row("kill -9 at random moments (start-up, steps, checkpoint writes)")
    rng = random.Random(ctx.seed)
    workdir = ctx.root / "killed"
    checkpoints = checkpoints_of(workdir)
    awaiting: list[dict] = []  # kills whose resume point the next run that gets past start-up will tell
    attempt = 0
    while row.injected < ctx.kills and attempt < ctx.kills * 3:
        attempt += 1
        mode = MODES[row.injected % len(MODES)]
        start = (complete_steps(checkpoints) or [0])[-1]
        run = Run(ctx.train_args(workdir), ctx.logs / f"kill{attempt:02d}.log")
        # Spread the kills over the whole training: each one lands within about twice its share of what is
        # left (else each kill would halve the remaining steps and most would crowd the last few).
        window = max(1, 2 * (timing["total_steps"] - start) // (ctx.kills - row.injected + 1))
        kill = kill_once(run, mode, rng, timing, start, min(timing["total_steps"], start + window), checkpoints)
        tally_resume(row, run, awaiting)
        if kill is None:
            row.notes.append(f"attempt {attempt} ({mode}): the run ended before the kill")
            break
        row.injected += 1
        ctx.kill_log.append(kill)
        awaiting.append(kill)
    final = Run(ctx.train_args(workdir), ctx.logs / "kill-final.log")
    code = final.wait()
    tally_resume(row, final, awaiting)
    check_the_end(row, ctx, workdir, reference, code)
    return row


def kill_once(run: Run, mode: str, rng: random.Random, timing: dict, start: int, until: int,
              checkpoints: Path) -> dict | None:
    """Kill ``run`` at the moment ``mode`` picks before step ``until``: what it left (None if it ended first)."""
    if not stop_at_a_fault(run, mode, rng, timing, start, until, checkpoints):
        run.wait()
        return None
    complete = complete_steps(checkpoints)
    writing = bool(partial_saves(checkpoints, run.started_wall))
    last = run.last_step()
    if run.first_step_at is not None and mode != "moment":  # runs start faster than the reference (warm cache)
        timing["startup_s"] = min(timing["startup_s"], run.first_step_at - run.started)
    run.kill()  # SIGKILL of the frozen process: the state seen above is the state it dies in
    phase = ("checkpoint write" if writing else "start-up" if last is None
             else "end (final save, grid)" if last >= timing["total_steps"] else "training")
    return dict(mode=mode, phase=phase, last_step=last, complete=complete)


def tally_resume(row: Row, run: Run, awaiting: list[dict]) -> None:
    """Once ``run`` has restored a checkpoint: the steps and checkpoints lost by each kill before it."""
    if not re.search(r"\d+ steps?/epoch", run.text()):  # killed before it restored anything
        return
    step = resumed_from(run.text())
    row.resumed += step > 0
    for kill in awaiting:
        newest = kill["complete"][-1] if kill["complete"] else 0
        kill["resumed_from"] = step
        row.data_lost += max(0, newest - step)  # a complete checkpoint not resumed from
        row.steps_lost += max(0, (kill["last_step"] or step) - step)  # logged steps done again
    awaiting.clear()


def check_the_end(row: Row, ctx: Context, workdir: Path, reference: Path, code: int) -> None:
    """The final run's result, and what the kills did, as checks and notes of ``row``."""
    checkpoints = checkpoints_of(workdir)
    same = identical(workdir, reference)
    row.check(row.injected >= min(ctx.kills, 20), f"only {row.injected} kills placed")
    row.check(code == 0, f"the final run exited {code}")
    row.check(not list(checkpoints.glob(TMP_GLOB)), "temporary directories left")
    row.check(not list(checkpoints.glob("*.damaged*")), "a kill damaged a complete checkpoint")
    row.check(not any("Traceback" in p.read_text() for p in ctx.logs.glob("kill*.log")), "a traceback")
    row.check(same, "final state differs from the uninterrupted run")
    takeovers = sum("taking over the lock" in p.read_text() for p in ctx.logs.glob("kill*.log"))
    phases = {phase: sum(kill["phase"] == phase for kill in ctx.kill_log) for phase in PHASES}
    row.notes.append("kills by phase: " + ", ".join(f"{k} {v}" for k, v in phases.items()))
    row.notes.append(f"stale train.lock of a killed run taken over with a warning: {takeovers} times")
    row.notes.append("final parameters, optimiser state, BatchNorm statistics and EMA weights bit-identical to "
                     f"the uninterrupted run: {same}")


def stop_at_a_fault(run: Run, mode: str, rng: random.Random, timing: dict, start: int, until: int,
                    checkpoints: Path) -> bool:
    """Freeze ``run`` (SIGSTOP) at the moment ``mode`` picks, before step ``until``; False if it ended first."""
    deadline = time.monotonic() + 900
    if mode == "save":  # while orbax writes a checkpoint
        return freeze_during_a_save(run.process, checkpoints, run.started_wall, timeout=900) is not None
    if mode == "moment":
        # Uniform over the expected life of this run: start-up (the fastest seen so far) plus 90% of its
        # training window. A moment in training is timed from the run's first step, so a start-up faster
        # or slower than expected does not push the kill past the end.
        startup, training = timing["startup_s"], 0.9 * (until - start) * timing["step_s"]
        moment = rng.uniform(0.0, startup + training)
        while run.process.poll() is None and time.monotonic() < deadline:
            now = time.monotonic()
            if run.last_step() is None:
                if now >= run.started + moment:
                    break  # a kill during start-up
            elif now >= run.first_step_at + max(0.0, moment - startup):
                break
            time.sleep(0.002)
    else:  # just after a random step of the window
        target = rng.randint(start + 1, max(start + 1, until - 1))
        while (run.last_step() or -1) < target and run.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, timing["step_s"]))
    if run.process.poll() is not None:
        return False
    run.process.send_signal(signal.SIGSTOP)
    return True
