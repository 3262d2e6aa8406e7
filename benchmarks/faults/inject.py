"""Fault injectors: a damaged checkpoint, a full disk, a small or read-only file system, a dataset with files
missing, a process frozen in the middle of a checkpoint write.

The campaign (:mod:`benchmarks.faults.campaign`) and the tests (tests/test_faults_*.py) inject their faults with
these, so that what CI checks is what the campaign measures.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

TMP_GLOB = "*.orbax-checkpoint-tmp*"
"""orbax's temporary directory of a checkpoint being written (renamed to the step's name once complete)."""


# Damaged checkpoints ----------------------------------------------------------------------------------------


def truncate_data_files(step_dir: Path) -> None:
    """Cut every array data file of the checkpoint ``step_dir`` to half its length."""
    for file in (step_dir / "state").rglob("d/*"):
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def delete_manifest(step_dir: Path) -> None:
    (step_dir / "state" / "manifest.ocdbt").unlink()


def garble_metadata(step_dir: Path) -> None:
    (step_dir / "state" / "_METADATA").write_text("{garbage")


def empty_step_directory(step_dir: Path) -> None:
    shutil.rmtree(step_dir)
    step_dir.mkdir()


def delete_config_item(step_dir: Path) -> None:
    shutil.rmtree(step_dir / "config")


@dataclass(frozen=True)
class Damage:
    apply: Callable[[Path], None]
    """Damages the checkpoint step directory it is given, in place."""
    reason: str
    """How ddim names the damage when it finds it (its warning, and its error for a checkpoint named alone)."""


DAMAGES = {
    "truncated data file": Damage(truncate_data_files, "a data file is truncated"),
    "deleted manifest": Damage(delete_manifest, "state/manifest.ocdbt is missing"),
    "garbage metadata JSON": Damage(garble_metadata, "state/_METADATA is not valid JSON"),
    "empty step directory": Damage(empty_step_directory, "the directory is empty"),
    "missing config item": Damage(delete_config_item, "its 'config' item is missing"),
}


# Small, full and read-only file systems ------------------------------------------------------------------------


def tmpfs_mount_command(path: Path, size_kib: int | None = None) -> list[str]:
    """``mount`` of a tmpfs at ``path`` (of ``size_kib`` KiB; without it, tmpfs's default of half the memory)."""
    return ["mount", "-t", "tmpfs", *(["-o", f"size={size_kib}k"] if size_kib else []), "tmpfs", str(path)]


def remount_command(path: Path, option: str) -> list[str]:
    """``mount`` that changes the file system at ``path``: ``ro`` (read-only), ``size=262144k`` (larger)."""
    return ["mount", "-o", f"remount,{option}", str(path)]


def mount_tmpfs(path: Path, size_kib: int) -> bool:
    """Mount a tmpfs of ``size_kib`` KiB at ``path`` (created if missing) in this process's mount namespace; False
    where that is not allowed (only root may mount here)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(tmpfs_mount_command(path, size_kib), capture_output=True).returncode == 0


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def namespace_prefix() -> list[str] | None:
    """A command prefix under which a shell may mount a tmpfs for itself and its children: ``unshare -rm`` (a user
    and mount namespace, no root needed), or None where the platform allows none."""
    if not shutil.which("unshare"):
        return None
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt 2>/dev/null || "
                            "mount -t tmpfs -o size=1m tmpfs /tmp"], capture_output=True)
    return ["unshare", "-rm"] if probe.returncode == 0 else None


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until its file system is full, to the last byte; returns the file.

    Unbuffered: a buffered file would try to flush its last partial block again on close and raise ENOSPC there,
    out of this function, into whatever called it.
    """
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 16, 1 << 12, 1):  # smaller and smaller writes, to the last byte
            block = b"\0" * size
            try:
                while True:
                    os.write(fd, block)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return filler


def without_train_files(data_dir: Path, copy: Path, dataset: str = "oxford_flowers102",
                        version: str = "2.1.1") -> Path:
    """A TFDS data directory at ``copy`` with ``data_dir``'s ``dataset`` but none of its train split's files (the
    other files linked, not copied); returns ``copy``."""
    target = copy / dataset / version
    target.mkdir(parents=True)
    for file in (data_dir / dataset / version).iterdir():
        if "train.tfrecord" not in file.name:
            (target / file.name).symlink_to(file)
    return copy


# A process frozen in a checkpoint write ---------------------------------------------------------------------


def partial_saves(checkpoints: Path, since: float | None = None) -> list[Path]:
    """The temporary directories of unfinished checkpoint writes in ``checkpoints``; with ``since`` (a time as
    ``time.time()`` gives it), only those changed at or after it (an earlier run's leftover does not count)."""
    found = []
    for path in checkpoints.glob(TMP_GLOB) if checkpoints.is_dir() else []:
        try:
            if since is None or path.stat().st_mtime >= since - 0.01:
                found.append(path)
        except FileNotFoundError:  # the write finished between the listing and now
            pass
    return found


def freeze_during_a_save(process: subprocess.Popen, checkpoints: Path, since: float | None = None,
                         timeout: float = 900.0) -> Path | None:
    """Freeze ``process`` (SIGSTOP) in the middle of a checkpoint write into ``checkpoints``; the write's temporary
    directory, or None if the process ended (or ``timeout`` seconds passed) first.

    The process is stopped as soon as a temporary directory shows up, and left frozen only if the write is still
    unfinished then (else it goes on to the next write): a kill of the frozen process provably lands mid-write.
    """
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if partial_saves(checkpoints, since):
            process.send_signal(signal.SIGSTOP)
            unfinished = partial_saves(checkpoints, since)
            if unfinished:
                return unfinished[0]
            process.send_signal(signal.SIGCONT)  # the write ended in between: wait for the next
        time.sleep(0.0005)
    return None
