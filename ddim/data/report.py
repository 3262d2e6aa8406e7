"""What was loaded: :class:`Data` (the splits and what a user should know about them) and its JSON report."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ddim.config import Config
from ddim.data.cache import ImageRows
from ddim.data.decode import IMAGE_EXTENSIONS, REASONS
from ddim.workdir.layout import DATA_REPORT, Workdir

REPORT_FILE = DATA_REPORT


@dataclass
class Data:
    """The training data of a config: splits as :class:`ImageRows` plus what a user should know about them."""

    kind: str
    """"folder" or "tfds"."""
    name: str
    """The folder's path or the TFDS dataset's name."""
    train: ImageRows | None
    val: ImageRows | None
    class_names: list[str]
    """Names of the class ids of the labels (TFDS ``label`` names; a folder's first-level subfolders)."""
    skipped: list[dict] = field(default_factory=list)
    """``{"path", "reason", "detail"}`` of every skipped file (folders)."""
    candidates: int = 0
    """Image files found (folders) or images in the splits (TFDS)."""
    ignored: dict = field(default_factory=dict)
    """Files that are not images by their extension, by extension (folders)."""
    fingerprint: str = ""
    """Changes when the images, the split or the preprocessing change (resume warns about it)."""
    cache_dirs: list[str] = field(default_factory=list)
    sizes: np.ndarray | None = None
    """``(N, 2)`` width and height of every usable source image (after EXIF orientation)."""
    val_fraction: float | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def train_class_counts(self) -> np.ndarray | None:
        """Training images per class id, ``(num_classes,)`` int64 (unlabelled images not counted);
        None when the train split was not opened."""
        if self.train is None:
            return None
        labels = self.train.label_array()
        return np.bincount(labels[labels >= 0], minlength=self.num_classes)

    @property
    def usable(self) -> int:
        return sum(len(split) for split in (self.train, self.val) if split is not None)

    @property
    def bad_fraction(self) -> float:
        return len(self.skipped) / self.candidates if self.candidates else 0.0

    def skipped_by_reason(self) -> dict[str, int]:
        return dict(Counter(item["reason"] for item in self.skipped).most_common())

    def problem(self, config: Config) -> str | None:
        """Why training would refuse this data (None when it is fine)."""
        if self.kind != "folder":
            return None
        where = f"image folder {self.name}"
        if self.candidates == 0 and not self.skipped:
            extra = f" (found only {sum(self.ignored.values())} other files)" if self.ignored else ""
            return f"no image files in {where}{extra}; expected {', '.join(_extensions())}"
        if self.usable == 0:
            return f"no usable image in {where}: all {len(self.skipped)} were skipped (see {REPORT_FILE})"
        limit = config.data.max_bad_fraction
        if self.bad_fraction > limit:
            return (f"{len(self.skipped)} of {self.candidates} files in {where} are unusable "
                    f"({self.bad_fraction:.0%} > data.max_bad_fraction = {limit:.0%}; see {REPORT_FILE}): "
                    f"{_format_counts(self.skipped_by_reason())}")
        return None

    def describe(self) -> str:
        """``folder photos/, 9,812 train / 2,453 val, 17 skipped`` for the start-of-training line."""
        counts = " / ".join(f"{len(split):,} {name}" for name, split in (("train", self.train), ("val", self.val))
                            if split is not None)
        skipped = f", {len(self.skipped):,} skipped" if self.kind == "folder" else ""
        return f"{self.kind} {self.name}, {counts}{skipped}"

    def report(self) -> dict:
        """The JSON report written to ``<workdir>/data_report.json``."""
        return {
            "source": {"kind": self.kind, "name": self.name},
            "fingerprint": self.fingerprint,
            "candidates": self.candidates,
            "usable": self.usable,
            "train": len(self.train or ()),
            "val": len(self.val) if self.val is not None else None,  # None: not loaded (train.eval_every = 0)
            "val_fraction": self.val_fraction,
            "skipped_count": len(self.skipped),
            "skipped_by_reason": self.skipped_by_reason(),
            "reasons": {key: text for key, text in REASONS.items() if key in self.skipped_by_reason()},
            "skipped": self.skipped,
            "ignored_by_extension": self.ignored,
            "class_names": list(self.class_names),
            "cache": self.cache_dirs,
        }

    def write_report(self, workdir: str | os.PathLike) -> Path:
        return write_report(self, workdir)


def write_report(data: Data, workdir: str | os.PathLike) -> Path:
    """Write ``data``'s report to ``<workdir>/data_report.json`` (atomically); returns the path."""
    path = Workdir(workdir).data_report
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data.report(), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def previous_fingerprint(workdir: str | os.PathLike) -> str | None:
    """The data fingerprint recorded by the last run in ``workdir`` (None if there is none)."""
    try:
        return json.loads(Workdir(workdir).data_report.read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def _extensions() -> list[str]:
    return [ext for ext in IMAGE_EXTENSIONS if ext not in (".jpe", ".dib")]


def _format_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{count} {reason}" for reason, count in counts.items())
