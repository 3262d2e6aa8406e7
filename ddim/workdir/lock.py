"""One trainer per work directory: a lock file held for the life of a training run.

``<workdir>/train.lock`` holds an exclusive ``flock`` while ``ddim train`` runs
and says who holds it (host, pid, start time, command), so a second trainer
on the same directory stops at once with a sentence naming the first. The
kernel drops a ``flock`` when its process dies, so a run killed with ``-9``,
or a host that rebooted, leaves no lock behind, only a stale file that the
next trainer takes over with a warning. Where the file system has no working
``flock`` (some network and FUSE mounts) the file's content decides: a live
pid on this host holds it, a dead one is stale, and a holder on another host
must be cleared by hand. Sampling and evaluation never take the lock; they
only ask :func:`live_holder` before moving a damaged checkpoint aside.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ddim.errors import UserError, environment_error, first_line
from ddim.workdir.layout import Workdir

try:  # POSIX; elsewhere the file's content is the only lock
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

# A trainer that starts while a reader briefly holds a shared lock (see live_holder) retries this long.
_BUSY_RETRY_SECONDS = 0.5


class WorkdirError(UserError, RuntimeError):
    """The work directory is in use by another trainer, or cannot be written."""


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a pid reused after a death."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing one.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])  # field 22 of proc(5)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a work directory's lock."""

    host: str
    pid: int
    started: str
    """Local time the trainer started, ISO format to the second."""
    command: str = ""
    boot_id: str | None = None
    process_start: int | None = None

    @classmethod
    def me(cls) -> "Holder":
        pid = os.getpid()
        return cls(
            host=socket.gethostname(),
            pid=pid,
            started=datetime.datetime.now().isoformat(sep=" ", timespec="seconds"),
            command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:500],
            boot_id=_boot_id(),
            process_start=_process_start(pid),
        )

    @classmethod
    def parse(cls, text: str) -> "Holder | None":
        try:
            values = json.loads(text)
            return cls(**{key: values.get(key) for key in cls.__dataclass_fields__ if key in values})
        except (ValueError, TypeError):  # an empty or half-written file: nobody we can name
            return None

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, started {self.started}"

    def alive(self) -> bool | None:
        """Whether the holding process still runs; None when it is on another host (cannot tell)."""
        if self.host != socket.gethostname():
            return None
        if self.boot_id and _boot_id() and self.boot_id != _boot_id():
            return False  # the machine rebooted since
        if self.process_start is not None and Path("/proc/self/stat").exists():
            # The same pid with the same start time: the same process (a reused pid starts later).
            return _process_start(self.pid) == self.process_start
        return _pid_alive(self.pid)


def _flock(fd: int, operation: int) -> bool | None:
    """Try a non-blocking flock: True when taken, False when held elsewhere, None when unsupported."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as error:
        if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return None
        raise


def _read(fd: int) -> Holder | None:
    os.lseek(fd, 0, os.SEEK_SET)
    return Holder.parse(os.read(fd, 65536).decode("utf-8", "replace"))


class WorkdirLock:
    """The lock of one work directory; :meth:`acquire` it, :meth:`release` it (or use ``with``)."""

    def __init__(self, workdir: str | Path):
        self.workdir = Path(workdir).absolute()
        self.path = Workdir(self.workdir).lock_file
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, warn: Callable[[str], None] | None = None) -> "WorkdirLock":
        """Take the lock or raise :class:`WorkdirError` naming its holder; creates the work directory.

        ``warn`` receives one line when a stale lock (a run that is gone) is taken over.
        """
        warn = warn or (lambda message: print(message, file=sys.stderr, flush=True))
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            deadline = time.monotonic() + _BUSY_RETRY_SECONDS
            while True:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                taken = _flock(fd, fcntl.LOCK_EX if fcntl else 0)
                if taken is False and time.monotonic() < deadline:
                    os.close(fd)
                    time.sleep(0.05)
                    continue
                if taken is not False and not self._same_file(fd):
                    os.close(fd)  # the holder released (and removed) it after we opened it: start over
                    continue
                break
            previous = _read(fd)
            if previous is not None and (previous.host, previous.pid) == (socket.gethostname(), os.getpid()):
                previous = None if taken else previous  # our own file, left by a lock not removed on release
            alive = previous.alive() if previous is not None else False
            # Held: flock says so, or the holder is a live process (a file system whose flock is not shared),
            # or, without flock, a holder on another host that only a person can declare gone.
            if taken is False or alive is True or (taken is None and alive is None):
                os.close(fd)
                raise self._busy(previous, unverifiable=taken is None and alive is None)
            if previous is not None:
                warn(f"warning: taking over the lock of a ddim train that is gone ({previous.describe()}): {self.path}")
            me = json.dumps(asdict(Holder.me()), indent=1) + "\n"
            os.ftruncate(fd, 0)
            os.pwrite(fd, me.encode(), 0)
            os.fsync(fd)
        except OSError as error:
            raise WorkdirError(
                f"cannot train in {self.workdir}: {environment_error(error) or first_line(error)}; nothing was changed there"
            ) from None
        self._fd = fd
        return self

    def _same_file(self, fd: int) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            return False

    def _busy(self, holder: Holder | None, unverifiable: bool) -> WorkdirError:
        who = f"another ddim train ({holder.describe()})" if holder else "another ddim train"
        advice = "wait for it to finish or stop it (Ctrl-C saves), or use another --workdir"
        if unverifiable:
            advice = f"if that run is gone, delete {self.path}"
        return WorkdirError(f"{self.workdir} is in use by {who}; {advice}")

    def release(self) -> None:
        """Remove the lock file and drop the lock (removal first, so nobody locks a removed file)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only remount or a vanished directory: the kernel drops the flock below anyway
        os.close(fd)

    def __enter__(self) -> "WorkdirLock":
        return self if self.held else self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def live_holder(workdir: str | Path) -> Holder | None:
    """The trainer holding ``workdir``'s lock right now, or None (no lock, or a stale one).

    Takes a shared lock for an instant, so it never blocks a trainer for longer
    than that; a trainer starting in that instant retries (see ``acquire``).
    """
    path = Workdir(workdir).lock_file
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        holder = _read(fd)
        taken = _flock(fd, fcntl.LOCK_SH if fcntl else 0)
        if taken is False:
            return holder or Holder("unknown", 0, "unknown")
        if taken is True:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        return holder if holder is not None and holder.alive() is not False else None
    finally:
        os.close(fd)


def check_free(workdir: str | Path) -> None:
    """Raise :class:`WorkdirError` naming the trainer that holds ``workdir``, if one does.

    A quick check before a trainer's slow start-up, so a second ``ddim train``
    fails at once; the lock itself is taken by :func:`lock_for_training`.
    """
    holder = live_holder(workdir)
    if holder is not None:
        raise WorkdirLock(workdir)._busy(holder, unverifiable=False)


def lock_for_training(workdir: str | Path, warn: Callable[[str], None] | None = None) -> WorkdirLock:
    """The work directory's lock for a training run, taken by process 0 of a multi-process run.

    All processes share the work directory; process 0 holds the lock for all
    of them, and every process raises the same :class:`WorkdirError` when it
    cannot be taken, so none is left waiting in a collective.
    """
    import jax

    lock = WorkdirLock(workdir)
    if jax.process_count() == 1:
        return lock.acquire(warn)
    import numpy as np
    from jax.experimental import multihost_utils

    error = None
    if jax.process_index() == 0:
        try:
            lock.acquire(warn)
        except WorkdirError as caught:
            error = caught
    taken = multihost_utils.broadcast_one_to_all(np.int32(error is None))
    if error is not None:
        raise error
    if not int(taken):
        holder = live_holder(workdir)
        raise lock._busy(holder, unverifiable=False) if holder else WorkdirError(
            f"process 0 could not lock {lock.workdir} (its error says why)"
        )
    return lock
