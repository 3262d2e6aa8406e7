"""The one error of bundled models: a :class:`ddim.checkpoint.CheckpointError` with a one-line message."""

from __future__ import annotations

from ddim.checkpoint.errors import CheckpointError


class PretrainedError(CheckpointError):
    """A bundled model that is unknown, damaged, changed or cannot be written (the message says which and why).

    A :class:`CheckpointError`, so whatever handles a bad checkpoint handles a bad bundled model too.
    """
