"""Faults of the processes: a second trainer on a busy work directory, a stale lock, kill -9 during a save,
and a stop signalled to one of two processes.

A second ``ddim train`` stops at once naming the first, and a lock whose trainer is gone is taken over with a
warning; a trainer killed in the middle of writing a checkpoint resumes to bit-identical parameters; and of two
processes training together, a SIGTERM to one stops both at the same step with one checkpoint. The workers run
``tests.multidevice_worker``. benchmarks.faults.campaign runs the long campaign (20+ kills at random moments).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ddim
from benchmarks.faults import inject
from ddim import checkpoint as ckpt
from ddim.cli import app
from ddim.train import loop
from ddim.workdir import LOCK_FILE, Holder, Workdir, WorkdirError, WorkdirLock, live_holder
from tests.conftest import REPO, mock_flowers, tiny_config
from tests.fault_helpers import QUIET, assert_same_state, copy_workdir, one_line_error, runner, saved_state, tiny_cli


# One trainer per work directory -------------------------------------------------------------------------


def test_a_second_trainer_stops_at_once_naming_the_first(trained_workdir, tmp_path):
    workdir = copy_workdir(trained_workdir, tmp_path)
    with WorkdirLock(workdir) as lock:
        holder = json.loads(lock.path.read_text())
        assert (holder["pid"], holder["host"]) == (os.getpid(), os.uname().nodename) and holder["started"]
        assert live_holder(workdir).pid == os.getpid()
        started = time.monotonic()
        result = runner.invoke(app, tiny_cli("--workdir", str(workdir), "--set", "train.max_steps=8"))
        assert time.monotonic() - started < 10  # before loading data or JAX compiling anything
        line = one_line_error(result)
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
    assert_same_state(saved_state(Workdir(workdir).checkpoints, 6),
                      saved_state(Workdir(trained_workdir).checkpoints, 6))


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
