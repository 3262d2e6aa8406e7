"""Fault-injection campaign: kill -9 at random moments, damaged checkpoints, a full disk, two trainers,
a stop signalled to one of two processes; prints a table of faults injected, runs resumed, steps lost and
data lost.

Run:  TFDS_DATA_DIR=... python benchmarks/faults.py [--kills 24] [--seed 0] [--root /tmp/ddim-faults]
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
- disk full: a tmpfs sized for two checkpoints (in a user+mount namespace, ``unshare -rm``, or with
  ``mount`` as root); the run must end with one ``error:`` line naming the last good checkpoint and leave
  no temporary directory; after the file system is enlarged the same command resumes to the end.
- two trainers: a second ``ddim train`` on a busy work directory must stop at once, naming the first.
- two processes (``jax.distributed`` on localhost, 1 CPU device each): SIGTERM to process 1 at a random
  step; both must stop at the same step with one checkpoint, and resume bit-identical to an
  uninterrupted two-process run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TMP_GLOB = "*.orbax-checkpoint-tmp*"
CAMPAIGN_SETTINGS = [
    "train.num_epochs=8",  # 200 steps of the smoke model: a few seconds of training per run
    "train.max_steps=0",
    "train.checkpoint_every=4",
    "train.log_every=1",
    "train.eval_every=4",
]


@dataclass
class Row:
    fault: str
    injected: int = 0
    resumed: int = 0
    steps_lost: int = 0
    data_lost: int = 0
    ok: bool = True
    notes: list[str] = field(default_factory=list)

    def check(self, condition: bool, note: str) -> None:
        if not condition:
            self.ok = False
            self.notes.append("FAILED: " + note)


class Run:
    """One ``ddim`` process, its output in a log file."""

    def __init__(self, args: list[str], log: Path, env: dict | None = None):
        self.log = log
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.first_step_at = None
        self._file = open(log, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ddim.cli", *args], cwd=REPO, stdout=self._file, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def last_step(self) -> int | None:
        steps = re.findall(r"^step (\d+)/", self.text(), re.M)
        if steps and self.first_step_at is None:
            self.first_step_at = time.monotonic()
        return int(steps[-1]) if steps else None

    def wait(self, timeout: float = 1200) -> int:
        try:
            code = self.process.wait(timeout)
        finally:
            self._file.close()
        return code

    def kill(self) -> None:
        self.process.kill()
        self.wait()


def partial_saves(checkpoints: Path, since: float) -> list[Path]:
    """orbax's temporary directories created at or after ``since`` (a killed run's old one does not count)."""
    found = []
    for path in checkpoints.glob(TMP_GLOB) if checkpoints.is_dir() else []:
        try:
            if path.stat().st_mtime >= since - 0.01:
                found.append(path)
        except FileNotFoundError:
            pass
    return found


def resumed_from(text: str) -> int:
    match = re.search(r"resuming from step (\d+)", text)
    return int(match.group(1)) if match else 0


def checkpoints_of(workdir: Path) -> Path:
    """The checkpoints folder of ``workdir``, as ddim names it."""
    from ddim.workdir.layout import Workdir  # here: importing ddim sets XLA_FLAGS, which every run inherits

    return Workdir(workdir).checkpoints


def complete_steps(checkpoints: Path) -> list[int]:
    if not checkpoints.is_dir():
        return []
    return sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def train_args(config: str, workdir: Path, settings: list[str], cache: Path) -> list[str]:
    args = ["train", "--config", config, "--workdir", str(workdir), "--compilation-cache", str(cache)]
    for setting in settings:
        args += ["--set", setting]
    return args


def final_state(workdir: Path):
    import jax

    from ddim.checkpoint import Checkpointer

    checkpointer = Checkpointer(checkpoints_of(workdir), create=False)
    step = checkpointer.latest_step()
    state = checkpointer.restore_state(step)
    checkpointer.close()
    return step, jax.tree.leaves(state)


def identical(a: Path, b: Path) -> bool:
    import numpy as np

    (step_a, leaves_a), (step_b, leaves_b) = final_state(a), final_state(b)
    return step_a == step_b and len(leaves_a) == len(leaves_b) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(leaves_a, leaves_b)
    )


# kill -9 ----------------------------------------------------------------------------------------------


def kill_campaign(ctx, reference: Path, timing: dict) -> Row:
    row = Row("kill -9 at random moments (start-up, steps, checkpoint writes)")
    rng = random.Random(ctx.seed)
    workdir = ctx.root / "killed"
    checkpoints = checkpoints_of(workdir)
    total = timing["total_steps"]
    phases = {"start-up": 0, "training": 0, "checkpoint write": 0, "end (final save, grid)": 0}
    awaiting = []  # kills whose resume point the next run that gets past start-up will tell
    attempt = 0

    def resolve(run: Run) -> None:
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

    while row.injected < ctx.kills and attempt < ctx.kills * 3:
        attempt += 1
        mode = ("moment", "step", "save")[row.injected % 3]
        start = (complete_steps(checkpoints) or [0])[-1]
        run = Run(train_args(ctx.config, workdir, ctx.settings, ctx.cache), ctx.logs / f"kill{attempt:02d}.log")
        # Spread the kills over the whole training: each one lands within about twice its share of what is
        # left (else each kill would halve the remaining steps and most would crowd the last few).
        window = max(1, 2 * (total - start) // (ctx.kills - row.injected + 1))
        if not _stop_at_a_fault(run, mode, rng, timing, start, min(total, start + window), checkpoints):
            row.notes.append(f"attempt {attempt} ({mode}): the run ended before the kill")
            run.wait()
            resolve(run)
            break
        complete_before = complete_steps(checkpoints)
        writing = bool(partial_saves(checkpoints, run.started_wall))
        last = run.last_step()
        if run.first_step_at is not None and mode != "moment":  # runs start faster than the reference (warm cache)
            timing["startup_s"] = min(timing["startup_s"], run.first_step_at - run.started)
        run.kill()  # SIGKILL of the frozen process: the state seen above is the state it dies in
        resolve(run)
        row.injected += 1
        phase = ("checkpoint write" if writing else "start-up" if last is None
                 else "end (final save, grid)" if last >= total else "training")
        phases[phase] += 1
        kill = dict(mode=mode, phase=phase, last_step=last, complete=complete_before)
        ctx.kill_log.append(kill)
        awaiting.append(kill)
    final = Run(train_args(ctx.config, workdir, ctx.settings, ctx.cache), ctx.logs / "kill-final.log")
    code = final.wait()
    resolve(final)
    row.check(row.injected >= min(ctx.kills, 20), f"only {row.injected} kills placed")
    row.check(code == 0, f"the final run exited {code}")
    row.check(not list(checkpoints.glob(TMP_GLOB)), "temporary directories left")
    row.check(not list(checkpoints.glob("*.damaged*")), "a kill damaged a complete checkpoint")
    row.check(not any("Traceback" in p.read_text() for p in ctx.logs.glob("kill*.log")), "a traceback")
    row.check(identical(workdir, reference), "final state differs from the uninterrupted run")
    takeovers = sum("taking over the lock" in p.read_text() for p in ctx.logs.glob("kill*.log"))
    row.notes.append("kills by phase: " + ", ".join(f"{k} {v}" for k, v in phases.items()))
    row.notes.append(f"stale train.lock of a killed run taken over with a warning: {takeovers} times")
    row.notes.append("final parameters, optimiser state, BatchNorm statistics and EMA weights bit-identical to "
                     f"the uninterrupted run: {identical(workdir, reference)}")
    return row


def _stop_at_a_fault(run: Run, mode: str, rng, timing: dict, start: int, until: int, checkpoints: Path) -> bool:
    """Freeze ``run`` (SIGSTOP) at the moment ``mode`` picks, before step ``until``; False if it ended first."""
    deadline = time.monotonic() + 900
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
    elif mode == "step":  # just after a random step of the window
        target = rng.randint(start + 1, max(start + 1, until - 1))
        while (run.last_step() or -1) < target and run.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, timing["step_s"]))
    else:  # while orbax writes a checkpoint: freeze on its temporary directory, kill if still there
        while run.process.poll() is None and time.monotonic() < deadline:
            if partial_saves(checkpoints, run.started_wall):
                run.process.send_signal(signal.SIGSTOP)
                if partial_saves(checkpoints, run.started_wall):
                    return True
                run.process.send_signal(signal.SIGCONT)  # the write ended in between: wait for the next
            time.sleep(0.0005)
        return False
    if run.process.poll() is not None:
        return False
    run.process.send_signal(signal.SIGSTOP)
    return True


# Damaged checkpoints -------------------------------------------------------------------------------------


def _truncate(step_dir: Path) -> None:
    for file in (step_dir / "state").rglob("d/*"):
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


DAMAGES = {
    "truncated data file": _truncate,
    "deleted manifest": lambda d: (d / "state" / "manifest.ocdbt").unlink(),
    "garbage metadata JSON": lambda d: (d / "state" / "_METADATA").write_text("{garbage"),
    "empty step directory": lambda d: (shutil.rmtree(d), d.mkdir()),
    "missing config item": lambda d: shutil.rmtree(d / "config"),
}


def damaged_checkpoints(ctx, reference: Path) -> list[Row]:
    rows = []
    steps = complete_steps(checkpoints_of(reference))
    newest, previous = steps[-1], steps[-2]
    for name, damage in DAMAGES.items():
        row = Row(f"damaged newest checkpoint: {name}")
        slug = name.replace(" ", "-")
        for what in ("train", "sample"):
            workdir = ctx.root / f"damaged-{slug}-{what}"
            shutil.copytree(reference, workdir)
            damage(checkpoints_of(workdir) / str(newest))
            row.injected += 1
            if what == "train":
                run = Run(train_args(ctx.config, workdir, ctx.settings, ctx.cache), ctx.logs / f"{slug}-train.log")
            else:
                run = Run(["sample", "--workdir", str(workdir), "--num", "2", "--steps", "2", "--out",
                           str(workdir / "samples-out"), "--compilation-cache", str(ctx.cache)],
                          ctx.logs / f"{slug}-sample.log")
            code = run.wait()
            text = run.text()
            warned = [line for line in text.splitlines() if line.startswith("warning: skipping damaged checkpoint")]
            row.check(code == 0, f"{what} exited {code}: {error_lines(text)}")
            row.check(len(warned) == 1, f"{what}: {len(warned)} warnings")
            row.check("Traceback" not in text, f"{what}: traceback")
            row.check((checkpoints_of(workdir) / f"{newest}.damaged").is_dir(), f"{what}: not set aside")
            if what == "train":
                row.resumed += resumed_from(text) == previous
                row.steps_lost += newest - resumed_from(text)
                row.check(identical(workdir, reference), "final state differs from the reference")
            else:
                row.check(f"(step {previous}," in text, "sample did not fall back to the previous step")
        row.notes.append(f"step {newest} set aside as {newest}.damaged; resumed and sampled from step {previous}")
        rows.append(row)
    return rows


# Disk full ----------------------------------------------------------------------------------------------


def namespace_prefix() -> list[str] | None:
    """A command prefix that may mount a tmpfs: unshare -rm (user+mount namespace) or nothing as root."""
    if shutil.which("unshare"):
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt 2>/dev/null || "
                                "mount -t tmpfs -o size=1m tmpfs /tmp"], capture_output=True)
        if probe.returncode == 0:
            return ["unshare", "-rm"]
    return None


def disk_full(ctx, reference: Path) -> Row:
    row = Row("disk full during a save (tmpfs for two checkpoints)")
    prefix = namespace_prefix()
    if prefix is None:
        row.notes.append("skipped: this platform allows no tmpfs mount here (tests/test_faults.py simulates ENOSPC)")
        return row
    step_kib = int(subprocess.run(["du", "-sk", str(checkpoints_of(reference) / str(complete_steps(
        checkpoints_of(reference))[-1]))], capture_output=True, text=True).stdout.split()[0])
    size_kib = int(2.5 * step_kib) + 64
    mount = ctx.root / "small-disk"
    mount.mkdir()
    out = ctx.root / "disk-full-result"
    out.mkdir()
    command = [sys.executable, "-m", "ddim.cli", *train_args(ctx.config, mount / "run", ctx.settings, ctx.cache)]
    quoted = " ".join(f"'{c}'" for c in command)
    script = (
        f"mount -t tmpfs -o size={size_kib}k tmpfs '{mount}' || exit 99\n"
        f"cd '{REPO}'\n"
        f"{quoted} > '{out}/first.log' 2>&1; echo $? > '{out}/first.rc'\n"
        f"ls -a '{checkpoints_of(mount / 'run')}' > '{out}/listing'\n"
        f"mount -o remount,size=262144k '{mount}'\n"
        f"{quoted} > '{out}/second.log' 2>&1; echo $? > '{out}/second.rc'\n"
        f"cp -r '{mount}/run' '{out}/run'\n"
    )
    done = subprocess.run([*prefix, "sh", "-c", script], capture_output=True, text=True)
    row.check(done.returncode == 0, f"namespace script failed: {done.stderr[-500:]}")
    first, second = (out / "first.log").read_text(), (out / "second.log").read_text()
    errors = error_lines(first)
    row.injected = 1
    row.check((out / "first.rc").read_text().strip() == "1", "the full-disk run did not exit 1")
    # The save, or another write (TensorBoard's events, a sample grid), meets the full disk first.
    row.check(len(errors) == 1 and "error: no space left on device" in errors[0], f"error lines: {errors}")
    row.check("Traceback" not in first and "Event loop is closed" not in first, "traceback or orbax noise")
    row.check("orbax-checkpoint-tmp" not in (out / "listing").read_text(), "temporary directory left")
    kept = re.search(r"last good checkpoint is step (\d+)", errors[0] if errors else "")
    reached = max(map(int, re.findall(r"^step (\d+)/", first, re.M)) or [0])
    row.check((out / "second.rc").read_text().strip() == "0", "the resumed run failed")
    row.resumed = int(kept is not None and resumed_from(second) == int(kept.group(1)))
    row.steps_lost = reached - resumed_from(second)
    row.check(identical(out / "run", reference), "final state differs from the reference")
    row.notes.append(f"tmpfs of {size_kib} KiB; {errors[0] if errors else 'no error line'}")
    return row


# Two trainers ------------------------------------------------------------------------------------------


def two_trainers(ctx, reference: Path) -> Row:
    row = Row("two ddim train on one work directory")
    workdir = ctx.root / "two-trainers"
    first = Run(train_args(ctx.config, workdir, ctx.settings, ctx.cache), ctx.logs / "trainer-1.log")
    while first.last_step() is None and first.process.poll() is None:
        time.sleep(0.01)
    second = Run(train_args(ctx.config, workdir, ctx.settings, ctx.cache), ctx.logs / "trainer-2.log")
    code = second.wait()
    seconds = time.monotonic() - second.started
    errors = error_lines(second.text())
    row.injected = 1
    row.check(code == 1 and len(errors) == 1 and f"in use by another ddim train (pid {first.pid}" in errors[0],
              f"second trainer: exit {code}, {errors}")
    row.check(first.wait() == 0, "the first trainer failed")
    row.check(identical(workdir, reference), "the first trainer's result differs from the reference")
    row.notes.append(f"second trainer exited after {seconds:.1f}s: {errors[0] if errors else ''}")
    return row


# Two processes -----------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _two_processes(ctx, workdir: Path, name: str) -> list[Run]:
    coordinator = f"127.0.0.1:{_free_port()}"
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=1"}
    return [
        Run([*train_args(ctx.config, workdir, ctx.settings, ctx.cache), "--coordinator", coordinator,
             "--num-processes", "2", "--process-id", str(i)], ctx.logs / f"{name}-{i}.log", env)
        for i in range(2)
    ]


def two_process_stop(ctx) -> Row:
    row = Row("SIGTERM to 1 of 2 processes (jax.distributed)")
    reference = ctx.root / "two-process-reference"
    runs = _two_processes(ctx, reference, "two-reference")
    row.check([r.wait() for r in runs] == [0, 0], "the uninterrupted two-process run failed")
    workdir = ctx.root / "two-process"
    runs = _two_processes(ctx, workdir, "two-stopped")
    target = random.Random(ctx.seed + 1).randint(5, 100)
    while (runs[1].last_step() or 0) < target and runs[1].process.poll() is None:
        time.sleep(0.002)
    runs[1].process.send_signal(signal.SIGTERM)
    row.injected = 1
    try:
        codes = [r.wait(timeout=300) for r in runs]
    except subprocess.TimeoutExpired:
        for r in runs:
            r.kill()
        row.check(False, "the processes did not stop together (hang)")
        return row
    stops = [re.findall(r"stopped at step (\d+)", r.text()) for r in runs]
    row.check(codes == [130, 130], f"exit codes {codes}")
    row.check(stops[0] == stops[1] and len(stops[0]) == 1, f"stop steps {stops}")
    stopped = int(stops[0][0]) if stops[0] else 0
    row.check(complete_steps(checkpoints_of(workdir))[-1:] == [stopped], "no checkpoint at the stop step")
    runs = _two_processes(ctx, workdir, "two-resumed")
    row.check([r.wait() for r in runs] == [0, 0], "the resumed two-process run failed")
    row.resumed = int(all(resumed_from(r.text()) == stopped for r in runs))
    row.check(identical(workdir, reference), "final state differs from the uninterrupted two-process run")
    row.notes.append(f"signal after process 1 logged step {target}; both stopped at step {stopped} (agreed 2 steps "
                     f"after the request) and saved one checkpoint; resumed bit-identical")
    return row


# Environment errors as one line ------------------------------------------------------------------------------


def one_line_errors(ctx, reference: Path) -> Row:
    row = Row("read-only work directory; missing dataset file")
    prefix = namespace_prefix()
    if prefix is not None:
        mount = ctx.root / "ro-disk"
        mount.mkdir()
        command = " ".join(f"'{c}'" for c in [sys.executable, "-m", "ddim.cli",
                                                  *train_args(ctx.config, mount / "run", ctx.settings, ctx.cache)])
        script = (f"mount -t tmpfs tmpfs '{mount}' && cp -r '{reference}' '{mount}/run' && "
                  f"mount -o remount,ro '{mount}' && cd '{REPO}' && {command}")
        done = subprocess.run([*prefix, "sh", "-c", script], capture_output=True, text=True)
        errors = error_lines(done.stdout + done.stderr)
        row.injected += 1
        row.check(done.returncode == 1 and len(errors) == 1 and "read-only file system" in errors[0], f"ro: {errors}")
        row.notes.append(errors[0] if errors else "")
    data = Path(os.environ.get("TFDS_DATA_DIR", REPO.parent / "shared" / "tfds")) / "oxford_flowers102"
    if data.is_dir():
        copy = ctx.root / "tfds" / "oxford_flowers102" / "2.1.1"
        copy.mkdir(parents=True)
        for file in (data / "2.1.1").iterdir():
            if "train.tfrecord" not in file.name:
                (copy / file.name).symlink_to(file)
        run = Run(train_args(ctx.config, ctx.root / "no-data", [*ctx.settings, f"data.data_dir={ctx.root / 'tfds'}"],
                             ctx.cache), ctx.logs / "no-data.log")
        code = run.wait()
        errors = error_lines(run.text())
        row.injected += 1
        row.check(code == 1 and len(errors) == 1 and "file not found" in errors[0], f"missing data: {errors}")
        row.check("Traceback" not in run.text(), "missing data: traceback")
        row.notes.append(errors[0] if errors else "")
    return row


# The campaign -----------------------------------------------------------------------------------------


@dataclass
class Context:
    root: Path
    logs: Path
    cache: Path
    config: str
    settings: list[str]
    kills: int
    seed: int
    kill_log: list = field(default_factory=list)


def reference_run(ctx) -> tuple[Path, dict]:
    workdir = ctx.root / "reference"
    run = Run(train_args(ctx.config, workdir, ctx.settings, ctx.cache), ctx.logs / "reference.log")
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
    rows = []
    for part in (lambda: [kill_campaign(ctx, reference, timing)], lambda: damaged_checkpoints(ctx, reference),
                 lambda: [disk_full(ctx, reference)], lambda: [two_trainers(ctx, reference)],
                 lambda: [two_process_stop(ctx)], lambda: [one_line_errors(ctx, reference)]):
        for row in part():
            rows.append(row)
            print(f"{'ok ' if row.ok else 'FAIL'} {row.fault}: injected {row.injected}, resumed {row.resumed}, "
                  f"steps lost {row.steps_lost}, data lost {row.data_lost}", flush=True)
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
