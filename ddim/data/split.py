"""The validation split of an image folder: a hash of each file's relative path.

An image is a validation image when the first 8 bytes of the SHA-256 of its
path relative to the folder (``/``-separated, UTF-8), read as a fraction of
2**64, fall below ``data.val_fraction``. The decision depends on nothing but
that path, so adding or removing files never moves another image between
training and validation, and every machine agrees on the split.
"""

from __future__ import annotations

import hashlib


def validation_score(relative_path: str) -> float:
    """A uniform number in [0, 1) determined by the path alone."""
    digest = hashlib.sha256(relative_path.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def is_validation(relative_path: str, val_fraction: float) -> bool:
    """Whether the image at ``relative_path`` belongs to the validation split."""
    return validation_score(relative_path) < val_fraction
