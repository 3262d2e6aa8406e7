"""Faults of the environment: damaged checkpoints, a full disk, a read-only or busy work directory,
missing dataset files, kill -9 during a save, and a stop signalled to one of two processes.

benchmarks.faults.campaign runs the long campaign (20+ kills at random moments); these are the cases CI runs. Both
inject their faults with benchmarks.faults.inject, whose injectors are tested here too.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from typer.testing import CliRunner

import ddim
from benchmarks.faults import inject
from ddim import checkpoint as ckpt
from ddim.cli import app
from ddim.errors import environment_error, path_in_message
from ddim.train import loop
from ddim.train import state as state_lib
from ddim.workdir import LOCK_FILE, Holder, Workdir, WorkdirError, WorkdirLock, live_holder
from tests.conftest import CONFIGS, NO_FLOWERS, REPO, TINY, mock_flowers, real_data_dir, tiny_config

runner = CliRunner()
QUIET = dict(log=lambda message: None)


def _copy(trained_workdir: Path, tmp_path: Path, name: str = "run") -> Path:
    workdir = tmp_path / name
    shutil.copytree(trained_workdir, workdir)
    return workdir


def _state(checkpoints: Path, step: int) -> dict:
    checkpointer = ckpt.Checkpointer(checkpoints, create=False)
    try:
        return checkpointer.restore_state(step)
    finally:
        checkpointer.close()


def _assert_same_state(a: dict, b: dict) -> None:
    """Bit for bit: parameters, optimiser state, BatchNorm statistics, EMA weights and step."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _one_line_error(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def _tiny_cli(*extra: str) -> list[str]:
    return ["train", "--config", str(CONFIGS / "smoke.toml"), *[a for item in TINY for a in ("--set", item)], *extra]


# Damaged checkpoints ------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", list(inject.DAMAGES))
def test_damaged_newest_checkpoint_is_skipped_set_aside_and_never_latest_again(trained_workdir, tmp_path, damage):
    """Each damage the campaign injects is one ddim tells by its reason (so each injector does damage)."""
    workdir = _copy(trained_workdir, tmp_path)
    reason = inject.DAMAGES[damage].reason
    newest = Workdir(workdir).checkpoints / "6"
    inject.DAMAGES[damage].apply(newest)
    # Named explicitly, a damaged step is an error that says why, and nothing moves.
    with pytest.raises(ckpt.CheckpointError, match=f"checkpoint {newest} is damaged: {reason}"):
        ddim.load(newest)
    assert newest.is_dir()
    warnings = []
    pipe = ddim.load(workdir, warn=warnings.append)
    assert pipe.step == 4
    assert len(warnings) == 1 and f"skipping damaged checkpoint {newest} ({reason}" in warnings[0]
    aside = Workdir(workdir).checkpoints / "6.damaged"
    assert not newest.exists() and aside.is_dir() and reason in (aside / "DAMAGED.txt").read_text()
    # Never counted as the latest again: no second warning, and orbax does not list it.
    assert ddim.load(workdir, warn=warnings.append).step == 4 and len(warnings) == 1
    assert ckpt.Checkpointer(Workdir(workdir).checkpoints, create=False).all_steps() == [4]
    with pytest.raises(ckpt.CheckpointError, match="set aside as damaged"):
        ddim.load(aside)


@pytest.mark.slow
def test_resume_skips_a_damaged_checkpoint_and_ends_bit_identical(trained_workdir, tmp_path, monkeypatch):
    workdir = _copy(trained_workdir, tmp_path)
    inject.truncate_data_files(Workdir(workdir).checkpoints / "6")
    real, holders = state_lib.compiled_steps, []

    def observed(config, mesh=None, source=None):  # who holds the work directory while each step runs
        step_fn, eval_fn = real(config, mesh, source)
        return (lambda *args: (holders.append(live_holder(workdir)), step_fn(*args))[1]), eval_fn

    monkeypatch.setattr(state_lib, "compiled_steps", observed)
    warnings = []
    with mock_flowers():
        result = loop.train(tiny_config(), workdir, log=warnings.append)
    assert (result.start_step, result.final_step) == (4, 6)
    assert [holder.pid for holder in holders] == [os.getpid()] * 2  # the lock lives as long as the run
    assert not (workdir / LOCK_FILE).exists()
    assert any("skipping damaged checkpoint" in w and "truncated" in w for w in warnings), warnings
    _assert_same_state(_state(Workdir(workdir).checkpoints, 6), _state(Workdir(trained_workdir).checkpoints, 6))
    assert (Workdir(workdir).checkpoints / "6.damaged").is_dir()


def test_all_checkpoints_damaged_is_an_error_that_keeps_them(trained_workdir, tmp_path):
    workdir = _copy(trained_workdir, tmp_path)
    for step in (4, 6):
        (Workdir(workdir).checkpoints / str(step) / "state" / "_METADATA").write_text("not json")
    with pytest.raises(ckpt.CheckpointError, match=r"no intact checkpoint .*every one is damaged \(steps 6, 4\)"):
        ddim.load(workdir, warn=lambda message: None)
    assert sorted(p.name for p in Workdir(workdir).checkpoints.iterdir()) == ["4.damaged", "6.damaged"]


def test_a_reader_leaves_the_checkpoints_of_a_live_trainer_in_place(trained_workdir, tmp_path):
    workdir = _copy(trained_workdir, tmp_path)
    (Workdir(workdir).checkpoints / "6" / "_CHECKPOINT_METADATA").write_text("{")
    warnings = []
    with WorkdirLock(workdir):  # a trainer owns the directory: sampling still works, nothing moves
        assert ddim.load(workdir, warn=warnings.append).step == 4
    assert len(warnings) == 1 and "moved aside" not in warnings[0]
    assert (Workdir(workdir).checkpoints / "6").is_dir()


def test_unreadable_is_not_damaged(trained_workdir):
    checkpointer = ckpt.Checkpointer(Workdir(trained_workdir).checkpoints, create=False)
    denied = checkpointer._read_error(6, PermissionError(errno.EACCES, "Permission denied"))
    assert not isinstance(denied, ckpt.DamagedCheckpoint) and "permission denied" in str(denied)
    truncated = checkpointer._read_error(6, ValueError('OUT_OF_RANGE: Error reading "params.x/0.0" in OCDBT'))
    assert isinstance(truncated, ckpt.DamagedCheckpoint) and truncated.reason == "a data file is truncated (array params.x)"
    checkpointer.close()


# Errors of the environment --------------------------------------------------------------------------


def test_environment_errors_are_phrases():
    assert environment_error(OSError(errno.ENOSPC, "No space left on device")) == "no space left on device"
    tensorstore = ValueError("RESOURCE_EXHAUSTED: Error writing ... No space left on device [os_error_code='28']")
    assert environment_error(tensorstore) == "no space left on device"
    assert environment_error(PermissionError(errno.EACCES, "Permission denied", "/x")) == "permission denied: /x"
    assert environment_error(OSError(errno.EROFS, "Read-only file system")) == "read-only file system"
    assert environment_error(ValueError("a bug")) is None
    truncated = RuntimeError("{{function_node __wrapped__IteratorGetNext_device_/job:localhost/replica:0/task:0/"
                             "device:CPU:0}} truncated record at 295341' failed with Read less bytes")
    assert path_in_message(truncated) is None  # a TensorFlow device name is not a file
    assert path_in_message(RuntimeError("NotFoundError: /data/a.tfrecord; No such file")) == "/data/a.tfrecord"


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (root, as in this project's CI), or None where mounting is not allowed."""
    mount = tmp_path / "small"
    mounted = inject.mount_tmpfs(mount, 4096)
    yield mount if mounted else None
    if mounted:
        inject.unmount(mount)


@pytest.mark.slow
def test_disk_full_during_a_save_is_one_line_keeps_the_last_checkpoint_and_resumes(
    small_disk, tmp_path, monkeypatch, trained_workdir
):
    """The disk fills up after the step-4 checkpoint: the step-6 save fails with one line, its temporary
    directory is removed, and once there is room the same command resumes from step 4."""
    workdir = (small_disk or tmp_path) / "run"
    checkpoints = Workdir(workdir).checkpoints
    real = state_lib.compiled_steps
    filler = []

    def fill_after_step_4_is_saved(config, mesh=None, source=None):
        step_fn, eval_fn = real(config, mesh, source)

        def step(state, images, rng):
            if int(state.step) == 5 and not filler:
                deadline = time.monotonic() + 60
                while not (checkpoints / "4").is_dir() or inject.partial_saves(checkpoints):
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                filler.append(inject.fill(workdir) if small_disk else None)
            return step_fn(state, images, rng)

        return step, eval_fn

    monkeypatch.setattr(state_lib, "compiled_steps", fill_after_step_4_is_saved)
    if small_disk is None:  # no size-limited file system here: the writer reports ENOSPC for step 6
        real_save = ckpt.Checkpointer.save

        def save(self, step, *args, **kwargs):
            if step == 6:
                (self.directory / "6.orbax-checkpoint-tmp").mkdir()
                raise self._save_failed(6, OSError(errno.ENOSPC, "No space left on device"))
            return real_save(self, step, *args, **kwargs)

        monkeypatch.setattr(ckpt.Checkpointer, "save", save)
    no_grids = ("--set", "train.eval_every=0")  # the save, not a sample grid, meets the full disk first
    with mock_flowers():
        result = runner.invoke(app, _tiny_cli("--workdir", str(workdir), *no_grids))
    line = _one_line_error(result)
    assert line == (f"error: no space left on device while saving step 6 to {checkpoints}; "
                    f"the last good checkpoint is step 4 in {checkpoints}")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["4"]
    assert not (workdir / LOCK_FILE).exists()
    monkeypatch.undo()
    if filler[0] is not None:
        filler[0].unlink()
    with mock_flowers():
        result = runner.invoke(app, _tiny_cli("--workdir", str(workdir), *no_grids))
    assert result.exit_code == 0 and "resuming from step 4" in result.output, result.output
    _assert_same_state(_state(checkpoints, 6), _state(Workdir(trained_workdir).checkpoints, 6))


@pytest.mark.slow
def test_read_only_work_directory_is_one_line_and_still_samples(trained_workdir, tmp_path, small_disk):
    if small_disk is not None:  # root: a read-only file system (permissions do not stop root)
        workdir = small_disk / "run"
        shutil.copytree(trained_workdir, workdir)
        assert subprocess.run(inject.remount_command(small_disk, "ro")).returncode == 0
        expected = "read-only file system"
    else:
        workdir = _copy(trained_workdir, tmp_path)
        for path in [workdir, *workdir.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        expected = "permission denied"
    with mock_flowers():
        result = runner.invoke(app, _tiny_cli("--workdir", str(workdir), "--set", "train.max_steps=8"))
    assert _one_line_error(result).startswith(f"error: cannot train in {workdir}: {expected}")
    assert "nothing was changed there" in result.output
    out = tmp_path / "samples"
    result = runner.invoke(app, ["sample", "--workdir", str(workdir), "--steps", "1", "--num", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output


def test_missing_dataset_file_is_one_line(tmp_path):
    data = real_data_dir()
    if data is None:
        pytest.skip(NO_FLOWERS)
    from ddim import data as data_lib

    config = tiny_config(f"data.data_dir={inject.without_train_files(data, tmp_path / 'tfds')}")
    with pytest.raises(data_lib.DataError, match=r"file not found: .*oxford_flowers102-train\.tfrecord.*prepare it again"):
        data_lib.load_split(config, "train[:10]", cache_dir=tmp_path / "cache")


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    args = ["sample", "--workdir", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]
    assert "Traceback" not in runner.invoke(app, args).output
    monkeypatch.setenv("DDIM_DEBUG", "1")
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "Traceback" in result.output and "error: checkpoint not found" in result.output


# One trainer per work directory -------------------------------------------------------------------------


def test_a_second_trainer_stops_at_once_naming_the_first(trained_workdir, tmp_path):
    workdir = _copy(trained_workdir, tmp_path)
    with WorkdirLock(workdir) as lock:
        holder = json.loads(lock.path.read_text())
        assert (holder["pid"], holder["host"]) == (os.getpid(), os.uname().nodename) and holder["started"]
        assert live_holder(workdir).pid == os.getpid()
        started = time.monotonic()
        result = runner.invoke(app, _tiny_cli("--workdir", str(workdir), "--set", "train.max_steps=8"))
        assert time.monotonic() - started < 10  # before loading data or JAX compiling anything
        line = _one_line_error(result)
        assert f"{workdir} is in use by another ddim train (pid {os.getpid()} on host" in line
        with pytest.raises(WorkdirError, match="in use by another ddim train"):  # the lock itself, past the CLI
            with mock_flowers():
                loop.train(tiny_config("train.max_steps=8"), workdir, **QUIET)
        assert ddim.load(workdir).step == 6  # sampling and eval stay allowed
    assert sorted(p.name for p in Workdir(workdir).checkpoints.iterdir()) == ["4", "6"]
    assert not (workdir / LOCK_FILE).exists() and live_holder(workdir) is None


def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = Holder.me().__dict__ | {"pid": gone.pid}
    tmp_path.joinpath(LOCK_FILE).write_text(json.dumps(stale))
    assert live_holder(tmp_path) is None
    warnings = []
    with WorkdirLock(tmp_path).acquire(warnings.append):
        assert json.loads(tmp_path.joinpath(LOCK_FILE).read_text())["pid"] == os.getpid()
    assert len(warnings) == 1 and f"a ddim train that is gone (pid {gone.pid} on host" in warnings[0]


# kill -9 during a save; a stop on one of two processes ---------------------------------------------------


def _worker(mode: str, args: dict, env_extra: dict | None = None) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu", **(env_extra or {}))
    command = [sys.executable, "-m", "tests.multidevice_worker", mode, json.dumps(args)]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_during_a_save(process: subprocess.Popen, checkpoints: Path, timeout: float = 300) -> str:
    """SIGKILL ``process`` while a checkpoint is being written (frozen in it, so the kill provably lands
    mid-write); returns the name of that temporary directory."""
    partial = inject.freeze_during_a_save(process, checkpoints, timeout=timeout)
    process.kill()
    code = process.wait()
    if partial is None:
        pytest.fail(f"no save to interrupt (exit {code}): {process.stderr.read()[-2000:]}")
    return partial.name


@pytest.mark.slow  # a worker process killed mid-save, then the resume: about 30 s on two cores
def test_kill_9_during_a_save_resumes_to_bit_identical_parameters(trained_workdir, tmp_path):
    workdir = tmp_path / "killed"
    # Every step is saved, so the kill lands in a save well before the end (step 6, as trained_workdir).
    args = {"workdir": str(workdir), "max_steps": 6, "overrides": ["train.checkpoint_every=1"]}
    partial = _kill_during_a_save(_worker("train", args), Workdir(workdir).checkpoints)
    killed_at = int(partial.split(".")[0])
    complete = ckpt.Checkpointer(Workdir(workdir).checkpoints, create=False).all_steps()
    assert all(step < killed_at for step in complete)
    with mock_flowers():
        result = loop.train(tiny_config("train.checkpoint_every=1"), workdir, **QUIET)
    assert result.start_step == (max(complete) if complete else 0) and result.final_step == 6
    assert not inject.partial_saves(Workdir(workdir).checkpoints)  # the partial save is gone
    _assert_same_state(_state(Workdir(workdir).checkpoints, 6), _state(Workdir(trained_workdir).checkpoints, 6))


@pytest.mark.slow
def test_a_stop_on_one_of_two_processes_stops_both_at_one_step_with_one_checkpoint(tmp_path):
    from tests.test_parallel import _free_port, parse

    coordinator = f"127.0.0.1:{_free_port()}"
    workers = [
        _worker("distributed", {"workdir": str(tmp_path / "run"), "max_steps": 400, "coordinator": coordinator,
                                "num_processes": 2, "process_id": i, "log": True},
                {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=1"})
        for i in range(2)
    ]
    signalled = None
    for line in workers[1].stdout:  # process 1 is the one told to stop, as by a scheduler
        if line.startswith("LOG step 3/"):
            workers[1].send_signal(signal.SIGTERM)
            signalled = 3
            break
    assert signalled, workers[1].stderr.read()[-3000:]
    outputs = []
    for worker in workers:
        try:  # without an agreed stop, process 0 waits forever in the next step's collective
            stdout, stderr = worker.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for w in workers:
                w.kill()
            pytest.fail("the processes did not stop together (a hang)")
        outputs.append((worker.returncode, stdout, stderr))
    results = [parse(*output) for output in outputs]
    assert [r["interrupted"] for r in results] == [True, True]
    assert results[0]["final"] == results[1]["final"] < 400
    final = results[0]["final"]
    assert final >= signalled
    steps = ckpt.Checkpointer(Workdir(tmp_path / "run").checkpoints, create=False).all_steps()
    assert steps[-1] == final and not list(Workdir(tmp_path / "run").checkpoints.glob("*tmp*"))


# The injectors themselves ---------------------------------------------------------------------------------


def test_truncating_a_checkpoint_halves_every_data_file(trained_workdir, tmp_path):
    step = _copy(trained_workdir, tmp_path) / "checkpoints" / "6"
    files = sorted((step / "state").rglob("d/*"))
    before = [file.stat().st_size for file in files]
    assert files and all(before)
    inject.truncate_data_files(step)
    assert [file.stat().st_size for file in files] == [size // 2 for size in before]


def test_the_small_disk_is_that_small_and_fill_leaves_no_byte(small_disk):
    if small_disk is None:
        pytest.skip("mounting a tmpfs needs root here")
    stats = os.statvfs(small_disk)
    assert stats.f_blocks * stats.f_frsize == 4096 * 1024
    filler = inject.fill(small_disk)
    assert filler.stat().st_size > 3 * 1024 * 1024
    with pytest.raises(OSError) as error:
        (small_disk / "one-more").write_bytes(b"\0" * 4096)
    assert error.value.errno == errno.ENOSPC
    filler.unlink()
    assert subprocess.run(inject.remount_command(small_disk, "ro")).returncode == 0
    with pytest.raises(OSError, match="Read-only file system"):
        (small_disk / "after").write_text("x")


def test_a_dataset_without_its_train_files_keeps_the_others(tmp_path):
    data = tmp_path / "data" / "oxford_flowers102" / "2.1.1"
    data.mkdir(parents=True)
    for name in ("dataset_info.json", "oxford_flowers102-train.tfrecord-00000-of-00001",
                 "oxford_flowers102-test.tfrecord-00000-of-00001"):
        (data / name).write_text(name)
    copy = inject.without_train_files(tmp_path / "data", tmp_path / "copy")
    kept = copy / "oxford_flowers102" / "2.1.1"
    assert sorted(path.name for path in kept.iterdir()) == ["dataset_info.json",
                                                            "oxford_flowers102-test.tfrecord-00000-of-00001"]
    assert (kept / "dataset_info.json").resolve() == data / "dataset_info.json"


def _writer(checkpoints: Path, script: str) -> subprocess.Popen:
    """A process that writes (or pretends to write) checkpoints into ``checkpoints`` as ``script`` says."""
    code = f"import os, pathlib, time\ncheckpoints = pathlib.Path({str(checkpoints)!r})\n{script}"
    return subprocess.Popen([sys.executable, "-c", code])


def _stopped(process: subprocess.Popen, timeout: float = 5.0) -> bool:
    """Whether the process is stopped (state ``T``) within ``timeout`` seconds: a signal takes effect a moment
    after it is sent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
            return True
        time.sleep(0.01)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_save_in_progress_freezes_its_writer_and_a_finished_one_does_not(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    # A write that finishes at once (renamed into place) lets the writer go on; the next, unfinished, freezes it.
    writer = _writer(checkpoints, "time.sleep(0.5)\n(checkpoints / '4.orbax-checkpoint-tmp-1').mkdir()\n"
                                  "os.rename(checkpoints / '4.orbax-checkpoint-tmp-1', checkpoints / '4')\n"
                                  "time.sleep(0.5)\n(checkpoints / '6.orbax-checkpoint-tmp-2').mkdir()\n"
                                  "time.sleep(60)")
    try:
        partial = inject.freeze_during_a_save(writer, checkpoints, timeout=30)
        assert partial == checkpoints / "6.orbax-checkpoint-tmp-2"
        assert _stopped(writer) and (checkpoints / "4").is_dir()
    finally:
        writer.kill()
        writer.wait()


def test_a_writer_that_ends_without_a_new_save_is_not_frozen(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    leftover = checkpoints / "2.orbax-checkpoint-tmp-0"
    leftover.mkdir()
    os.utime(leftover, (time.time() - 60, time.time() - 60))  # an earlier run's
    since = time.time()
    assert inject.partial_saves(checkpoints) == [leftover] and inject.partial_saves(checkpoints, since) == []
    writer = _writer(checkpoints, "time.sleep(0.5)")
    assert inject.freeze_during_a_save(writer, checkpoints, since, timeout=30) is None
    assert writer.wait() == 0
