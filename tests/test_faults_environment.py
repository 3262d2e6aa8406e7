"""Faults of the environment: a full disk, a read-only work directory, a missing dataset file.

Each is one line that names what went wrong (no traceback, unless DDIM_DEBUG is set): a disk that fills up
during a save keeps the last good checkpoint and, once there is room, the same command resumes from it; a
read-only work directory cannot be trained in but still samples. Where no tmpfs can be mounted (not root), the
full disk is simulated by a save that fails with ENOSPC and the read-only directory by its permissions.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import time

import pytest

from benchmarks.faults import inject
from ddim import checkpoint as ckpt
from ddim.cli import app
from ddim.errors import environment_error, path_in_message
from ddim.train import state as state_lib
from ddim.workdir import LOCK_FILE, Workdir
from tests.conftest import NO_FLOWERS, mock_flowers, real_data_dir, tiny_config
from tests.fault_helpers import assert_same_state, copy_workdir, one_line_error, runner, saved_state, tiny_cli
from tests.fault_helpers import small_disk  # noqa: F401  (a fixture)


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
        result = runner.invoke(app, tiny_cli("--workdir", str(workdir), *no_grids))
    line = one_line_error(result)
    assert line == (f"error: no space left on device while saving step 6 to {checkpoints}; "
                    f"the last good checkpoint is step 4 in {checkpoints}")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["4"]
    assert not (workdir / LOCK_FILE).exists()
    monkeypatch.undo()
    if filler[0] is not None:
        filler[0].unlink()
    with mock_flowers():
        result = runner.invoke(app, tiny_cli("--workdir", str(workdir), *no_grids))
    assert result.exit_code == 0 and "resuming from step 4" in result.output, result.output
    assert_same_state(saved_state(checkpoints, 6), saved_state(Workdir(trained_workdir).checkpoints, 6))


@pytest.mark.slow
def test_read_only_work_directory_is_one_line_and_still_samples(trained_workdir, tmp_path, small_disk):
    if small_disk is not None:  # root: a read-only file system (permissions do not stop root)
        workdir = small_disk / "run"
        shutil.copytree(trained_workdir, workdir)
        assert subprocess.run(inject.remount_command(small_disk, "ro")).returncode == 0
        expected = "read-only file system"
    else:
        workdir = copy_workdir(trained_workdir, tmp_path)
        for path in [workdir, *workdir.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        expected = "permission denied"
    with mock_flowers():
        result = runner.invoke(app, tiny_cli("--workdir", str(workdir), "--set", "train.max_steps=8"))
    assert one_line_error(result).startswith(f"error: cannot train in {workdir}: {expected}")
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
