"""The one base class of the errors a user can fix: bad input or a fault of the environment.

Every module raises its own subclass (``ConfigError``, ``CheckpointError``,
``DataError``, ...) with a one-line message that says what happened and what to
do. The command line catches :class:`UserError` alone and prints that line;
anything else is a bug and keeps its traceback.

Faults of the environment (a full disk, a missing permission, a read-only
file system) reach us as ``OSError`` from Python, or as text from TensorStore
and TensorFlow, which carry the operating system's error code in their
message; :func:`environment_error` turns either into a short phrase.
``DDIM_DEBUG=1`` (``ddim --debug``) keeps the tracebacks as well.
"""

from __future__ import annotations

import errno
import os
import re

DEBUG_ENV = "DDIM_DEBUG"


class UserError(Exception):
    """A failure the user can act on; its message is one line, meant to be printed as it is."""


class InputError(UserError, ValueError):
    """An input image, mask or argument of a pipeline verb cannot be used (one sentence says why)."""


def debug() -> bool:
    """Whether tracebacks and library error logs are wanted (``DDIM_DEBUG=1`` or ``ddim --debug``)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


# What the operating system's error codes mean to someone running a training job.
_PHRASES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.EIO: "input/output error (failing disk or network file system)",
    errno.ENOENT: "file not found",
    errno.EFBIG: "file too large for the file system",
    errno.ENOTDIR: "a path component is not a directory",
    errno.EISDIR: "is a directory",
}

# TensorStore: "... No space left on device [os_error_code='28']"; TensorFlow: "...; No such file or directory".
_OS_CODE = re.compile(r"os_error_code='?(\d+)")
_STRERRORS = {os.strerror(code).lower(): code for code in _PHRASES}


def os_error_code(error: BaseException) -> int | None:
    """The ``errno`` behind ``error``, its causes or its message, if there is one."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno:
            return error.errno
        text = str(error)
        match = _OS_CODE.search(text)
        if match:
            return int(match.group(1))
        lowered = text.lower()
        for strerror, code in _STRERRORS.items():
            if strerror in lowered:
                return code
        error = error.__cause__ or error.__context__
    return None


_PATH = re.compile(r"(/[^\s;\"'\]]+)")


def environment_error(error: BaseException, path_from_message: bool = False) -> str | None:
    """A short phrase for an error of the environment (``"no space left on device"``), else None.

    ``OSError`` with a file name includes it: ``"permission denied: /runs/x/lock"``; with
    ``path_from_message`` so does an error whose message names the file (TensorFlow's, TensorStore's).
    """
    code = os_error_code(error)
    if code is None:
        return None
    phrase = _PHRASES.get(code, os.strerror(code).lower())
    filename = getattr(error, "filename", None)
    if not filename and path_from_message:
        filename = path_in_message(error)
    return f"{phrase}: {filename}" if filename else phrase


def path_in_message(error: BaseException) -> str | None:
    """The last absolute path named in the first line of ``error``'s message (TensorFlow's, TensorStore's).

    TensorFlow's device names (``/job:localhost/replica:0/...``) look like paths and are skipped.
    """
    paths = [path for path in _PATH.findall(first_line(error, limit=100000)) if not path.startswith("/job:")]
    return paths[-1] if paths else None


def first_line(error: BaseException, limit: int = 300) -> str:
    """Library errors can span many lines and carry kilobytes of specs; the CLI promises one short line."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    line = re.sub(r"\s*\[tensorstore_spec=.*$", "", line)  # TensorStore appends its whole JSON spec
    return line if len(line) <= limit else line[: limit - 3] + "..."
