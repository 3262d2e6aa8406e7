"""The fault injectors themselves (benchmarks.faults.inject), which the campaign and the fault tests use.

Truncating a checkpoint halves every data file; the small disk is 4 MiB, filling it leaves no byte and it can
be remounted read-only (root only: skipped elsewhere); a dataset copied without its train files keeps the
others; and a checkpoint writer is frozen in the middle of a save, never after a finished one.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.faults import inject
from tests.fault_helpers import copy_workdir
from tests.fault_helpers import small_disk  # noqa: F401  (a fixture)


def test_truncating_a_checkpoint_halves_every_data_file(trained_workdir, tmp_path):
    step = copy_workdir(trained_workdir, tmp_path) / "checkpoints" / "6"
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
    # A finished save (here made elsewhere and renamed into place, so that no observer can catch it half done) lets
    # the writer go on; the next, unfinished, freezes it.
    writer = _writer(checkpoints, "time.sleep(0.5)\n(checkpoints.parent / '4.staging').mkdir()\n"
                                  "os.rename(checkpoints.parent / '4.staging', checkpoints / '4')\n"
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
