"""The error of the data package: a user error, printed as one ``error:`` line."""

from __future__ import annotations

from ddim.errors import UserError


class DataError(UserError, RuntimeError):
    """The dataset could not be loaded or has unusable images."""
