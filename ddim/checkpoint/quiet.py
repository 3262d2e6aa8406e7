"""Orbax, imported with its log noise silenced.

When a save or restore fails, orbax, asyncio and TensorStore report it many
times over (logged tracebacks, unretrieved task exceptions, "Event loop is
closed" from threads still finishing). The checkpoint package raises each
failure as one error or prints one warning line instead, so the repeats are
dropped here, once per process, unless ``DDIM_DEBUG`` is set.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

from ddim.errors import debug


def orbax():
    """The ``orbax.checkpoint`` module (imported on first use: it pulls in JAX), with its noise silenced."""
    import orbax.checkpoint as ocp

    quiet_library_noise()
    return ocp


class _OrbaxLogFilter(logging.Filter):
    """Drops orbax's warning and error logs (tracebacks of a failed save or restore, notes on damaged
    files): what matters is raised as an error or printed as a one-line warning by this package."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING or f"{os.sep}orbax{os.sep}" not in record.pathname


class _OrbaxTaskFilter(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" for orbax's writes of a save that failed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and "orbax" in record.getMessage())


def _quiet_unraisable(previous):
    # When one read or write of a batch fails, orbax's event loop closes while TensorStore still
    # completes the others; each completion then reports "Event loop is closed" (or, at exit,
    # "Python is likely shutting down"), dozens of tracebacks that add nothing to the error raised.
    def hook(unraisable):
        text = str(unraisable.exc_value)
        if isinstance(unraisable.exc_value, (RuntimeError, ImportError)) and (
            "Event loop is closed" in text or "likely shutting down" in text
        ):
            return
        previous(unraisable)

    return hook


@dataclasses.dataclass
class _Quiet:
    installed: bool = False


_QUIET = _Quiet()


def quiet_library_noise() -> None:
    """Once per process, unless ``DDIM_DEBUG`` is set: see the filters and the hook above."""
    if _QUIET.installed or debug():
        return
    _QUIET.installed = True
    logging.getLogger("absl").addFilter(_OrbaxLogFilter())
    logging.getLogger("asyncio").addFilter(_OrbaxTaskFilter())
    sys.unraisablehook = _quiet_unraisable(sys.unraisablehook)
