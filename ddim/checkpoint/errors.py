"""The errors of the checkpoint package: each is a :class:`ddim.errors.UserError` with a one-line message."""

from __future__ import annotations

from pathlib import Path

from ddim.errors import UserError


class CheckpointError(UserError, RuntimeError):
    """No usable checkpoint where one was expected (the message says where and why)."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose files are missing, truncated or garbled."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"checkpoint {path} is damaged: {reason}")
        self.path, self.reason = path, reason


class CheckpointSaveError(CheckpointError):
    """A save failed (full disk, lost permission, ...); older checkpoints are untouched."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step
