"""Faults of the checkpoints: a damaged one is skipped with a warning, set aside and never the latest again.

Each damage benchmarks.faults.inject makes is one ddim tells by its reason; a resume past a damaged checkpoint
ends bit-identical to an undamaged run; when every checkpoint is damaged that is an error that keeps them; a
reader leaves a live trainer's checkpoints in place; and a checkpoint that cannot be read is not damaged.
"""

from __future__ import annotations

import errno
import os

import pytest

import ddim
from benchmarks.faults import inject
from ddim import checkpoint as ckpt
from ddim.train import loop
from ddim.train import state as state_lib
from ddim.workdir import LOCK_FILE, Workdir, WorkdirLock, live_holder
from tests.conftest import mock_flowers, tiny_config
from tests.fault_helpers import assert_same_state, copy_workdir, saved_state


@pytest.mark.parametrize("damage", list(inject.DAMAGES))
def test_damaged_newest_checkpoint_is_skipped_set_aside_and_never_latest_again(trained_workdir, tmp_path, damage):
    """Each damage the campaign injects is one ddim tells by its reason (so each injector does damage)."""
    workdir = copy_workdir(trained_workdir, tmp_path)
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
    workdir = copy_workdir(trained_workdir, tmp_path)
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
    assert_same_state(saved_state(Workdir(workdir).checkpoints, 6),
                      saved_state(Workdir(trained_workdir).checkpoints, 6))
    assert (Workdir(workdir).checkpoints / "6.damaged").is_dir()


def test_all_checkpoints_damaged_is_an_error_that_keeps_them(trained_workdir, tmp_path):
    workdir = copy_workdir(trained_workdir, tmp_path)
    for step in (4, 6):
        (Workdir(workdir).checkpoints / str(step) / "state" / "_METADATA").write_text("not json")
    with pytest.raises(ckpt.CheckpointError, match=r"no intact checkpoint .*every one is damaged \(steps 6, 4\)"):
        ddim.load(workdir, warn=lambda message: None)
    assert sorted(p.name for p in Workdir(workdir).checkpoints.iterdir()) == ["4.damaged", "6.damaged"]


def test_a_reader_leaves_the_checkpoints_of_a_live_trainer_in_place(trained_workdir, tmp_path):
    workdir = copy_workdir(trained_workdir, tmp_path)
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
