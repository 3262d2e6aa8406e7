"""A recipe's commands as child processes: ``ddim ...`` and ``python -m benchmarks.KIND.NAME ...``.

The rebuild changes neither its own working directory nor its environment: each child gets the stage's (``cwd=``,
``env=``), with the repository on ``PYTHONPATH`` so that ``benchmarks`` imports from any directory. A stop
(Ctrl-C, SIGTERM) is passed on to the child, which saves and stops as it would alone (``ddim train`` and ``ddim
distill`` exit 130). The child runs in a process group of its own (``start_new_session``), so that a terminal's
Ctrl-C reaches it once, through the rebuild. Its stderr passes through the rebuild, which notes whether it printed an ``error:`` line (the rebuild
then prints no second one); through a pseudo-terminal when the rebuild's stderr is a terminal, so that progress
bars still show.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from benchmarks.common import REPO
from benchmarks.release.recipe_files import RebuildError, command_module

# What may stand before ``error:`` at the start of a line on a terminal: carriage returns and escape sequences.
LINE_START = re.compile(r"^(?:\r|\x1b\[[0-9;?]*[A-Za-z])*")
OUTPUT_AFTER_EXIT_S = 10.0
"""How long the child's last output may take to arrive once it exited (a grandchild may still hold its stderr)."""


@dataclass(frozen=True)
class Outcome:
    code: int
    """The exit status; 128 + N for a child ended by signal N (130: stopped by SIGINT), as a shell says it."""
    printed_error: bool
    stop_requested: bool
    """A stop reached the rebuild while the command ran (it may have finished all the same)."""


def python_module(module: str, args: list[str]) -> list[str]:
    """The command line of ``python -m MODULE ARGS`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def child_environment(env: dict[str, str]) -> dict[str, str]:
    """This process's environment with ``env`` on top, and the repository first on ``PYTHONPATH``."""
    environ = {**os.environ, **env}
    environ["PYTHONPATH"] = os.pathsep.join(part for part in (str(REPO), environ.get("PYTHONPATH")) if part)
    return environ


def run_command(command: str, cwd: Path, env: dict[str, str]) -> Outcome:
    """Run a recipe ``command`` in ``cwd`` (created if missing) with ``env`` added to this process's environment."""
    module, args = command_module(command)
    try:
        cwd.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RebuildError(f"cannot work in {cwd}: {error.strerror or error}") from None
    sys.stdout.flush()
    sys.stderr.flush()
    watch = ErrorLineWatch(sys.stderr)
    reader, writer = _stderr_channel(sys.stderr)
    with forwarded_stops() as stops:
        try:
            process = subprocess.Popen(python_module(module, args), cwd=cwd, env=child_environment(env),
                                       stdin=subprocess.DEVNULL, stderr=writer, start_new_session=True)
        except OSError as error:
            os.close(reader)
            raise RebuildError(f"cannot start {command}: {error.strerror or error}") from None
        finally:
            os.close(writer)
        stops.forward_to(process)
        copier = threading.Thread(target=copy_output, args=(reader, watch), daemon=True)
        copier.start()
        code = process.wait()
    copier.join(OUTPUT_AFTER_EXIT_S)
    if not copier.is_alive():
        os.close(reader)
    return Outcome(128 - code if code < 0 else code, watch.saw_error, stops.requested)


def _stderr_channel(stream) -> tuple[int, int]:
    """A (read, write) pair of descriptors for the child's stderr: a pseudo-terminal of ``stream``'s size when
    ``stream`` is a terminal, a pipe otherwise."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    if not terminal:
        return os.pipe()
    import fcntl
    import pty
    import termios

    reader, writer = pty.openpty()
    with contextlib.suppress(OSError, AttributeError, ValueError):
        size = fcntl.ioctl(stream.fileno(), termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(writer, termios.TIOCSWINSZ, size)
    return reader, writer


def copy_output(reader: int, watch: ErrorLineWatch) -> None:
    """Pass everything read from ``reader`` to ``watch`` until the writing side is closed."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        try:
            chunk = os.read(reader, 65536)
        except OSError:  # a pseudo-terminal whose other side closed says EIO, not end of file
            chunk = b""
        if not chunk:
            break
        watch.write(decoder.decode(chunk))
    watch.write(decoder.decode(b"", final=True))
    watch.close()


class ErrorLineWatch:
    """Writes text on to ``sink`` and notes whether a line of it starts with ``error:``."""

    def __init__(self, sink):
        self.sink = sink
        self.saw_error = False
        self._line = ""  # the start of the line not yet ended (its first characters are all that count)

    def write(self, text: str) -> None:
        if not text:
            return
        self.sink.write(text)
        self.sink.flush()
        lines = (self._line + text).split("\n")
        self._line = lines.pop()[:64]
        self.saw_error = self.saw_error or any(map(_is_error_line, lines))

    def close(self) -> None:
        self.saw_error = self.saw_error or _is_error_line(self._line)
        self._line = ""


def _is_error_line(line: str) -> bool:
    return LINE_START.sub("", line).startswith("error:")


class _Stops:
    """SIGINT and SIGTERM received while a child runs: each is passed on to it (to come, if it has not started)."""

    def __init__(self):
        self.requested = False
        self._pending: list[int] = []
        self._process: subprocess.Popen | None = None

    def handle(self, signum: int, frame) -> None:
        self.requested = True
        if self._process is None:
            self._pending.append(signum)
        elif self._process.poll() is None:
            self._process.send_signal(signum)

    def forward_to(self, process: subprocess.Popen) -> None:
        self._process = process
        for signum in self._pending:
            process.send_signal(signum)


@contextlib.contextmanager
def forwarded_stops() -> Iterator[_Stops]:
    """Stop signals to this process go to the child instead while the block runs (in the main thread; elsewhere
    signals stay as they are)."""
    stops = _Stops()
    handlers: dict[int, Callable] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            handlers[signum] = signal.signal(signum, stops.handle)
    except ValueError:  # not the main thread
        pass
    try:
        yield stops
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
