"""Training data: an image folder or a TFDS dataset, preprocessed once into an on-disk cache.

Modules, one job each:

- :mod:`~ddim.data.preprocess`: the one crop-and-resize both sources use (TensorFlow-exact, numpy only)
- :mod:`~ddim.data.decode`: reading one file with Pillow (formats, modes, EXIF, every bad-file reason)
- :mod:`~ddim.data.folder`: an image folder (scan, parallel decoding, incremental rebuilds, labels)
- :mod:`~ddim.data.tfds`: a TFDS dataset (TensorFlow decodes; imported lazily)
- :mod:`~ddim.data.split`: the hash-based validation split of a folder
- :mod:`~ddim.data.cache`: the uint8 cache files and :class:`ImageRows`, their random-access reader
- :mod:`~ddim.data.loader`: Grain batches; data order a pure function of ``(seed, epoch)``

:func:`load` is the entry point: it returns a :class:`Data` whose ``train``
and ``val`` are :class:`ImageRows` (array-like, read from disk on indexing),
so no split is ever held in memory. Nothing here imports TensorFlow unless
the source is TFDS.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ddim.config import Config
from ddim.data.cache import DEFAULT_CACHE_DIRNAME, ImageRows
from ddim.data.loader import epoch_batches, eval_batches, first_batches, steps_per_epoch, train_batches
from ddim.data.preprocess import center_crop_resize
from ddim.errors import UserError

REPORT_FILE = "data_report.json"

__all__ = [
    "Data", "DataError", "ImageRows", "REPORT_FILE", "cache_root", "center_crop_resize", "epoch_batches",
    "eval_batches", "first_batches", "load", "load_split", "steps_per_epoch", "tensorflow", "train_batches",
]


class DataError(UserError, RuntimeError):
    """The dataset could not be loaded or has unusable images."""


def tensorflow():
    """TensorFlow for the input pipeline only, with every GPU hidden from it (see :mod:`ddim.data.tfds`)."""
    from ddim.data.tfds import tensorflow as _tensorflow

    return _tensorflow()


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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
        from ddim.data.decode import REASONS

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
            "class_names": self.class_names,
            "cache": self.cache_dirs,
        }

    def write_report(self, workdir: str | os.PathLike) -> Path:
        path = Path(workdir) / REPORT_FILE
        tmp = path.with_name(f".{REPORT_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.report(), indent=1) + "\n")
        os.replace(tmp, path)
        return path


def _extensions() -> list[str]:
    from ddim.data.decode import IMAGE_EXTENSIONS

    return [ext for ext in IMAGE_EXTENSIONS if ext not in (".jpe", ".dib")]


def _format_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{count} {reason}" for reason, count in counts.items())


def previous_fingerprint(workdir: str | os.PathLike) -> str | None:
    """The data fingerprint recorded by the last run in ``workdir`` (None if there is none)."""
    try:
        return json.loads((Path(workdir) / REPORT_FILE).read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def cache_root(config: Config, workdir: str | os.PathLike | None = None) -> Path:
    """``data.cache_dir``, else ``<workdir>/data_cache``, else ``$DDIM_DATA_CACHE`` or ``~/.cache/ddim/data``."""
    if config.data.cache_dir:
        return Path(config.data.cache_dir).expanduser()
    if workdir is not None:
        return Path(workdir) / DEFAULT_CACHE_DIRNAME
    if os.environ.get("DDIM_DATA_CACHE"):
        return Path(os.environ["DDIM_DATA_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ddim" / "data"


def _decode_settings(config: Config):
    from ddim.data import folder

    return folder.DecodeSettings(config.model.image_size, min_image_size(config), config.data.max_image_pixels)


def split_fingerprint(config: Config, split: str) -> str | None:
    """For an image folder, a hash that changes with its files, the split and the preprocessing
    (a scan, nothing decoded); None for TFDS, whose splits are fixed by name and version."""
    if not config.data.image_dir:
        return None
    from ddim.data import folder

    scan = folder.scan_folder(Path(config.data.image_dir).expanduser())
    return f"{folder.fingerprint(scan, _decode_settings(config))}-{config.data.val_fraction!r}-{split}"


def min_image_size(config: Config) -> int:
    return config.data.min_image_size or config.model.image_size


def _progress_factory(show: bool):
    if not show:
        return None
    from ddim.summary import Progress

    return lambda total: Progress(total, 0, description="preprocess")


def load(config: Config, workdir: str | os.PathLike | None = None, splits=("train", "val"),
         log: Callable[[str], None] | None = None, show_progress: bool = True, check: bool = True) -> Data:
    """The training data of ``config`` from the cache, building or updating the cache first if needed.

    ``splits``: which of "train" and "val" to open (TFDS decodes each split
    expression separately). Warnings about skipped files go to ``log``. With
    ``check`` (training), a folder that training would refuse (no usable image,
    too many bad files) raises :class:`DataError`; ``ddim data`` reports instead.
    """
    log = log or _stderr
    root = cache_root(config, workdir)
    progress = _progress_factory(show_progress)
    try:
        if config.data.image_dir:
            data = _load_folder(config, root, log, progress)
        else:
            data = _load_tfds(config, root, splits, log, progress)
    except OSError as error:  # an unwritable or full cache directory, a lock on read-only storage
        raise DataError(f"cannot use the data cache in {root}: {error.strerror or error}") from None
    if check:
        problem = data.problem(config)
        if problem:
            raise DataError(problem)
    if "train" not in splits:
        data.train = None
    if "val" not in splits:
        data.val = None
    return data


def _load_folder(config: Config, root: Path, log, progress) -> Data:
    from ddim.data import folder

    if config.model.channels != 3:
        raise DataError(f"image folders give RGB images; model.channels must be 3, not {config.model.channels}")
    settings = _decode_settings(config)
    image_dir = Path(config.data.image_dir).expanduser()
    directory, index, built = folder.build_or_open(image_dir, settings, root, config.data.workers, log, progress)
    rows = _load_rows(directory, index)
    usable, score = rows["usable"], rows["score"]
    fraction = config.data.val_fraction
    train_rows = np.flatnonzero(usable & (score >= fraction))
    val_rows = np.flatnonzero(usable & (score < fraction))
    images = directory / index["images_file"]
    shape = tuple(index["shape"])
    fingerprint = f"{index['fingerprint']}-{fraction!r}"
    skipped = index.get("skipped", [])
    for item in skipped[:MAX_WARNINGS] if built else []:  # once, when the files are decoded
        log(f"warning: skipped {image_dir / item['path']}: {folder.reason_text(item['reason'])}"
            + (f" ({item['detail']})" if item.get("detail") else ""))
    if len(skipped) > MAX_WARNINGS and built:
        log(f"warning: ... and {len(skipped) - MAX_WARNINGS} more skipped files (all are listed in the JSON report)")
    return Data(
        kind="folder",
        name=str(image_dir),
        train=ImageRows(images, shape, train_rows, rows["label"][train_rows], f"{fingerprint}-train"),
        val=ImageRows(images, shape, val_rows, rows["label"][val_rows], f"{fingerprint}-val"),
        class_names=list(index.get("class_names", [])),
        skipped=skipped,
        candidates=int(index["num_rows"]) + int(index.get("unlisted", 0)),
        ignored=index.get("ignored", {}),
        fingerprint=fingerprint,
        cache_dirs=[str(directory)],
        sizes=np.stack([rows["width"][usable], rows["height"][usable]], axis=1),
        val_fraction=fraction,
    )


# Warning lines printed for skipped files when a cache is built (all are in the report).
MAX_WARNINGS = 50


def _load_rows(directory: Path, index: dict) -> dict[str, np.ndarray]:
    from ddim.data import cache as cache_lib

    try:
        return cache_lib.load_rows(directory, index)
    except (OSError, ValueError, KeyError) as error:
        raise DataError(f"the data cache {directory} is damaged ({error}); delete it to rebuild") from None


def _load_tfds(config: Config, root: Path, splits, log, progress) -> Data:
    from ddim.data import tfds

    opened: dict[str, ImageRows] = {}
    class_names: list[str] = []
    fingerprints, directories, sizes = [], [], []
    for split in splits:
        expression = config.data.train_split if split == "train" else config.data.val_split
        if not expression:
            continue
        directory, index = tfds.build_or_open(config, expression, root, log, progress)
        rows = _load_rows(directory, index)
        opened[split] = ImageRows(directory / index["images_file"], tuple(index["shape"]),
                                  np.arange(index["num_rows"]), rows["label"], index["fingerprint"])
        class_names = list(index.get("class_names", []))
        fingerprints.append(index["fingerprint"])
        directories.append(str(directory))
        sizes.append(np.stack([rows["width"], rows["height"]], axis=1))
    return Data(
        kind="tfds",
        name=config.data.dataset,
        train=opened.get("train"),
        val=opened.get("val"),
        class_names=class_names,
        candidates=sum(len(split) for split in opened.values()),
        fingerprint="-".join(fingerprints),
        cache_dirs=directories,
        sizes=np.concatenate(sizes) if sizes else None,
    )


def load_split(config: Config, split: str, cache_dir: str | os.PathLike | None = None,
               log: Callable[[str], None] | None = None, show_progress: bool = False) -> ImageRows:
    """The preprocessed images of one split, ``"train"`` or ``"val"``, as an array-like :class:`ImageRows`.

    For TFDS, ``split`` may also be a split expression (``"train[:10%]"``).
    ``cache_dir``: the cache directory (default: ``data.cache_dir`` or
    ``~/.cache/ddim/data``; training uses ``<workdir>/data_cache``).
    """
    if cache_dir is not None:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, cache_dir=str(cache_dir)))
    root = cache_root(config)
    log = log or (lambda message: None)
    if split not in ("train", "val"):
        if config.data.image_dir:
            raise DataError(f"unknown split {split!r} of an image folder (choose train or val)")
        from ddim.data import tfds

        directory, index = tfds.build_or_open(config, split, root, log, _progress_factory(show_progress))
        rows = _load_rows(directory, index)
        return ImageRows(directory / index["images_file"], tuple(index["shape"]), np.arange(index["num_rows"]),
                         rows["label"], index["fingerprint"])
    data = load(config, None, (split,), log, show_progress, check=True)
    images = data.train if split == "train" else data.val
    if images is None:
        raise DataError(f"the config has no {split} split")
    return images

