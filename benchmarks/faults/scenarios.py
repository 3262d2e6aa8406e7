"""The campaign's faults after the kills: damaged checkpoints, a full disk, two trainers, a stop signalled to one
of two processes, a read-only work directory and a missing dataset file."""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from benchmarks.common import REPO, ddim_command, free_port
from benchmarks.faults.inject import (DAMAGES, namespace_prefix, remount_command, tmpfs_mount_command,
                                      without_train_files)
from benchmarks.faults.runs import (Context, Row, Run, checkpoints_of, complete_steps, error_lines, identical,
                                    resumed_from)


def damaged_checkpoints(ctx: Context, reference: Path) -> list[Row]:
    """Each damage applied to the newest checkpoint of a copy of ``reference``: ``ddim train`` must skip it with one
    warning, resume from the one before and end bit-identical; ``ddim sample`` must fall back too."""
    steps = complete_steps(checkpoints_of(reference))
    newest, previous = steps[-1], steps[-2]
    rows = []
    for name, damage in DAMAGES.items():
        row = Row(f"damaged newest checkpoint: {name}")
        slug = name.replace(" ", "-")
        for what in ("train", "sample"):
            workdir = ctx.root / f"damaged-{slug}-{what}"
            shutil.copytree(reference, workdir)
            damage.apply(checkpoints_of(workdir) / str(newest))
            row.injected += 1
            args = ctx.train_args(workdir) if what == "train" else [
                "sample", "--workdir", str(workdir), "--num", "2", "--steps", "2", "--out",
                str(workdir / "samples-out"), "--compilation-cache", str(ctx.cache)]
            run = Run(args, ctx.logs / f"{slug}-{what}.log")
            code = run.wait()
            text = run.text()
            warned = [line for line in text.splitlines() if line.startswith("warning: skipping damaged checkpoint")]
            row.check(code == 0, f"{what} exited {code}: {error_lines(text)}")
            row.check(len(warned) == 1 and damage.reason in warned[0], f"{what}: warnings {warned}")
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


def disk_full(ctx: Context, reference: Path) -> Row:
    """A run on a tmpfs with room for two checkpoints and a half: one ``error:`` line naming the last good
    checkpoint, no temporary directory left; once the file system is larger, the same command ends the run."""
    row = Row("disk full during a save (tmpfs for two checkpoints)")
    prefix = namespace_prefix()
    if prefix is None:
        row.notes.append("skipped: this platform allows no tmpfs mount here "
                         "(tests/test_faults_environment.py simulates ENOSPC)")
        return row
    newest = checkpoints_of(reference) / str(complete_steps(checkpoints_of(reference))[-1])
    step_kib = int(subprocess.run(["du", "-sk", str(newest)], capture_output=True, text=True).stdout.split()[0])
    size_kib = int(2.5 * step_kib) + 64
    mount, out = ctx.root / "small-disk", ctx.root / "disk-full-result"
    mount.mkdir()
    out.mkdir()
    train = shlex.join(ddim_command(*ctx.train_args(mount / "run")))
    script = "\n".join([
        f"{shlex.join(tmpfs_mount_command(mount, size_kib))} || exit 99",
        f"cd {shlex.quote(str(REPO))}",
        f"{train} > '{out}/first.log' 2>&1; echo $? > '{out}/first.rc'",
        f"ls -a '{checkpoints_of(mount / 'run')}' > '{out}/listing'",
        shlex.join(remount_command(mount, "size=262144k")),
        f"{train} > '{out}/second.log' 2>&1; echo $? > '{out}/second.rc'",
        f"cp -r '{mount}/run' '{out}/run'",
    ])
    done = subprocess.run([*prefix, "sh", "-c", script], capture_output=True, text=True)
    row.check(done.returncode == 0, f"namespace script failed: {done.stderr[-500:]}")
    error = check_disk_full(row, out, reference)
    row.notes.append(f"tmpfs of {size_kib} KiB; {error}")
    return row


def check_disk_full(row: Row, out: Path, reference: Path) -> str:
    """What the full-disk run and its resumption left in ``out``, as checks of ``row``; the run's error line."""
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
    return errors[0] if errors else "no error line"


def two_trainers(ctx: Context, reference: Path) -> Row:
    """A second ``ddim train`` on a busy work directory must stop at once, naming the first."""
    row = Row("two ddim train on one work directory")
    workdir = ctx.root / "two-trainers"
    first = Run(ctx.train_args(workdir), ctx.logs / "trainer-1.log")
    while first.last_step() is None and first.process.poll() is None:
        time.sleep(0.01)
    second = Run(ctx.train_args(workdir), ctx.logs / "trainer-2.log")
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


def two_processes(ctx: Context, workdir: Path, name: str) -> list[Run]:
    """One run as two ``jax.distributed`` processes on localhost, one CPU device each."""
    coordinator = f"127.0.0.1:{free_port()}"
    env = {"JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=1"}
    return [Run([*ctx.train_args(workdir), "--coordinator", coordinator, "--num-processes", "2", "--process-id",
                 str(i)], ctx.logs / f"{name}-{i}.log", env) for i in range(2)]


def two_process_stop(ctx: Context) -> Row:
    """SIGTERM to process 1 at a random step: both stop at one step with one checkpoint, and resume bit-identical to
    an uninterrupted two-process run."""
    row = Row("SIGTERM to 1 of 2 processes (jax.distributed)")
    reference = ctx.root / "two-process-reference"
    row.check([r.wait() for r in two_processes(ctx, reference, "two-reference")] == [0, 0],
              "the uninterrupted two-process run failed")
    workdir = ctx.root / "two-process"
    runs = two_processes(ctx, workdir, "two-stopped")
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
    runs = two_processes(ctx, workdir, "two-resumed")
    row.check([r.wait() for r in runs] == [0, 0], "the resumed two-process run failed")
    row.resumed = int(all(resumed_from(r.text()) == stopped for r in runs))
    row.check(identical(workdir, reference), "final state differs from the uninterrupted two-process run")
    row.notes.append(f"signal after process 1 logged step {target}; both stopped at step {stopped} (agreed 2 steps "
                     f"after the request) and saved one checkpoint; resumed bit-identical")
    return row


def one_line_errors(ctx: Context, reference: Path) -> Row:
    """A read-only work directory and a dataset file that is missing: each one ``error:`` line, no traceback."""
    row = Row("read-only work directory; missing dataset file")
    prefix = namespace_prefix()
    if prefix is not None:
        mount = ctx.root / "ro-disk"
        mount.mkdir()
        script = " && ".join([shlex.join(tmpfs_mount_command(mount)), f"cp -r '{reference}' '{mount}/run'",
                              shlex.join(remount_command(mount, "ro")), f"cd {shlex.quote(str(REPO))}",
                              shlex.join(ddim_command(*ctx.train_args(mount / "run")))])
        done = subprocess.run([*prefix, "sh", "-c", script], capture_output=True, text=True)
        errors = error_lines(done.stdout + done.stderr)
        row.injected += 1
        row.check(done.returncode == 1 and len(errors) == 1 and "read-only file system" in errors[0], f"ro: {errors}")
        row.notes.append(errors[0] if errors else "")
    data = Path(os.environ.get("TFDS_DATA_DIR", REPO.parent / "shared" / "tfds"))
    if (data / "oxford_flowers102").is_dir():
        copy = without_train_files(data, ctx.root / "tfds")
        run = Run(ctx.train_args(ctx.root / "no-data", f"data.data_dir={copy}"), ctx.logs / "no-data.log")
        code = run.wait()
        errors = error_lines(run.text())
        row.injected += 1
        row.check(code == 1 and len(errors) == 1 and "file not found" in errors[0], f"missing data: {errors}")
        row.check("Traceback" not in run.text(), "missing data: traceback")
        row.notes.append(errors[0] if errors else "")
    return row
