"""The on-disk cache of preprocessed images: one uint8 array file per source, read row by row.

A cache *entry* is a directory (one per data source and image size) under the
cache directory (``data.cache_dir``, default ``<workdir>/data_cache``)::

    index.json               what the entry holds; replaced atomically, names the current files
    images-<version>.u8      uint8 array (rows, H, W, C), C order, no header (np.memmap-able)
    rows-<version>.npz       per row: label, source width/height, validation score, usable flag
    files-<version>.json     (folders) per row: relative path, size, mtime; for incremental rebuilds

A rebuild writes new versioned files beside the old ones, then replaces
``index.json``, then deletes the old files; a process that opened the old files
keeps reading them. Builds take a lock file (:func:`entry_lock`), so the
processes of one host, or of every host when the cache is on shared storage,
build an entry once and the others wait for it and reuse it.

Training reads rows from a memory map of the file (:class:`ImageRows`) and
regularly releases the pages it touched, so the training process's RSS does
not grow with the number of images however long it runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from ddim.workdir.layout import DATA_CACHE

CACHE_VERSION = 1
INDEX = "index.json"
DEFAULT_CACHE_DIRNAME = DATA_CACHE  # <workdir>/data_cache, named by ddim.workdir.layout

# The label of an image without a class (a folder's top-level files, a dataset without labels).
NO_LABEL = -1


def digest(value: Any, length: int = 16) -> str:
    """A short stable hash of a JSON-able value."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8", "surrogateescape")).hexdigest()[:length]


def entry_dir(cache_root: Path, label: str, key: Any) -> Path:
    """The entry directory of a source: readable label plus a hash of what identifies it."""
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._") or "data"
    return Path(cache_root) / f"{label[:40]}-{digest(key, 12)}"


def entry_lock(directory: Path, timeout: float = -1):
    """An exclusive lock on an entry (``filelock``: fcntl on POSIX, works across processes and hosts)."""
    from filelock import FileLock

    directory.mkdir(parents=True, exist_ok=True)
    return FileLock(str(directory / ".lock"), timeout=timeout)


def write_json_atomic(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=False))
    os.replace(tmp, path)


def read_index(directory: Path) -> dict | None:
    """The entry's index, or None when there is none, it is damaged or of another cache version."""
    try:
        index = json.loads((directory / INDEX).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(index, dict) or index.get("cache_version") != CACHE_VERSION:
        return None
    files = [index.get("images_file"), index.get("rows_file")]
    if not all(isinstance(name, str) and (directory / name).is_file() for name in files):
        return None
    shape = index.get("shape")
    expected = int(index.get("num_rows", -1)) * int(np.prod(shape or [0]))
    if (directory / index["images_file"]).stat().st_size != expected:
        return None  # truncated (a crash mid-write before the index was replaced cannot cause this, a disk error can)
    return index


class EntryWriter:
    """Writes a new version of an entry: the image file first, the index last (atomically)."""

    def __init__(self, directory: Path, num_rows: int, shape: tuple[int, int, int]):
        self.directory = directory
        self.version = secrets.token_hex(6)
        self.shape = tuple(int(s) for s in shape)
        self.num_rows = num_rows
        """Rows of the file; writing past them extends it (:meth:`finish` may be given the final count)."""
        self.row_bytes = int(np.prod(self.shape))
        self.images_path = directory / f"images-{self.version}.u8"
        with open(self.images_path, "wb") as file:
            file.truncate(num_rows * self.row_bytes)  # sparse until written

    def write_rows(self, first_row: int, pixels: np.ndarray) -> None:
        """Write consecutive rows starting at ``first_row``."""
        pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
        fd = os.open(self.images_path, os.O_WRONLY)
        try:
            os.pwrite(fd, pixels.data, first_row * self.row_bytes)
        finally:
            os.close(fd)

    def finish(self, index: dict, rows: dict[str, np.ndarray], files: list | None = None,
               num_rows: int | None = None) -> dict:
        """Write the per-row arrays (and file list), then publish the index; delete older versions."""
        if num_rows is not None and num_rows != self.num_rows:
            self.num_rows = num_rows
            os.truncate(self.images_path, num_rows * self.row_bytes)
        rows_name = f"rows-{self.version}.npz"
        np.savez(self.directory / rows_name, **rows)
        index = {
            **index,
            "cache_version": CACHE_VERSION,
            "images_file": self.images_path.name,
            "rows_file": rows_name,
            "num_rows": self.num_rows,
            "shape": list(self.shape),
        }
        if files is not None:
            files_name = f"files-{self.version}.json"
            (self.directory / files_name).write_text(json.dumps(files, separators=(",", ":")))
            index["files_file"] = files_name
        with open(self.images_path, "rb+") as file:
            os.fsync(file.fileno())
        write_json_atomic(self.directory / INDEX, index)
        remove_stale_versions(self.directory, self.version)
        return index

    def abandon(self) -> None:
        remove_stale_versions(self.directory, keep=None, only=self.version)


def remove_stale_versions(directory: Path, keep: str | None, only: str | None = None) -> None:
    """Delete versioned files other than ``keep`` (or only those of version ``only``)."""
    for path in directory.glob("*-*.*"):
        match = re.fullmatch(r"(images|rows|files)-([0-9a-f]{12})\.(u8|npz|json)", path.name)
        if match and match.group(2) != keep and (only is None or match.group(2) == only):
            try:
                path.unlink()
            except OSError:
                pass


def load_rows(directory: Path, index: dict) -> dict[str, np.ndarray]:
    with np.load(directory / index["rows_file"]) as data:
        return {name: data[name] for name in data.files}


def load_files(directory: Path, index: dict) -> list | None:
    name = index.get("files_file")
    if not name:
        return None
    try:
        return json.loads((directory / name).read_text())
    except (OSError, ValueError):
        return None


# Mapped pages a reader may accumulate before it releases them (MADV_DONTNEED): bounds the training
# process's resident memory whatever the size of the cache file.
RELEASE_EVERY_BYTES = 32 * 2**20


class ImageRows:
    """Random access to some rows of a cached image file, as a read-only array of uint8 images.

    ``len()``, ``shape``, ``dtype``, integer/slice/index-array indexing (each
    copied into a fresh array) and ``np.asarray()`` (all rows) behave like an
    ``(N, H, W, C)`` uint8 array. :meth:`batch` adds the labels: it is what the
    batch loader (:mod:`ddim.data.loader`) reads.

    Rows are copied out of a read-only memory map of the file (one per process;
    threads share it). Pages a memory map touches count towards the process's
    resident memory, so after every :data:`RELEASE_EVERY_BYTES` read the reader
    tells the kernel it no longer needs them (``madvise(MADV_DONTNEED)``): they
    stay in the page cache, shared and reclaimable, but the training process's
    RSS stays flat however large the cache is and however long the run.
    """

    dtype = np.dtype(np.uint8)
    ndim = 4

    def __init__(self, path: str | os.PathLike, image_shape: tuple[int, int, int], rows: np.ndarray,
                 labels: np.ndarray | None = None, fingerprint: str | None = None):
        self.path = str(path)
        self.image_shape = tuple(int(s) for s in image_shape)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int32)
        self.fingerprint = fingerprint
        self._row_bytes = int(np.prod(self.image_shape))
        self._mmap = None
        self._array: np.ndarray | None = None
        self._pid = None
        self._since_release = 0

    # -- array protocol ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.rows), *self.image_shape)

    @property
    def nbytes(self) -> int:
        return len(self.rows) * self._row_bytes

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            return self.read(np.array([key]))[0]
        if isinstance(key, slice):
            return self.read(np.arange(len(self.rows))[key])
        return self.read(np.asarray(key))

    def __array__(self, dtype=None, copy=None):
        images = self.read(np.arange(len(self.rows)))
        return images if dtype is None else images.astype(dtype)

    def __repr__(self) -> str:
        return f"ImageRows({len(self)} images of {self.image_shape} from {self.path})"

    def label_array(self) -> np.ndarray:
        """The int32 label of every image: a class id, or :data:`NO_LABEL` (also when none were stored)."""
        if self.labels is None:
            return np.full(len(self.rows), NO_LABEL, np.int32)
        return self.labels

    def batch(self, indices) -> dict[str, np.ndarray]:
        """Images ``indices`` as a batch: ``{"image": uint8 (k, H, W, C), "label": int32 (k,)}``."""
        indices = np.asarray(indices)
        return {"image": self.read(indices), "label": self.label_array()[indices]}

    def subset(self, indices) -> "ImageRows":
        """A view of some of these images (no pixels are read)."""
        indices = np.asarray(indices)
        labels = None if self.labels is None else self.labels[indices]
        return ImageRows(self.path, self.image_shape, self.rows[indices], labels, self.fingerprint)

    def __getstate__(self):
        return {**self.__dict__, "_mmap": None, "_array": None, "_pid": None, "_since_release": 0}

    # -- reading --------------------------------------------------------------------------------------------
    def _mapped(self) -> np.ndarray:
        if self._array is None or self._pid != os.getpid():
            import mmap

            with open(self.path, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                if size < self._row_bytes:
                    return np.empty((0, *self.image_shape), np.uint8)
                self._mmap = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            rows = size // self._row_bytes
            self._array = np.frombuffer(self._mmap, np.uint8, rows * self._row_bytes).reshape(rows, *self.image_shape)
            self._pid = os.getpid()
        return self._array

    def read(self, indices: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Images ``indices`` (positions in this view) as a new ``(k, H, W, C)`` uint8 array."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < -len(self.rows) or indices.max() >= len(self.rows)):
            raise IndexError(f"image index out of range for {len(self.rows)} images")
        file_rows = self.rows[indices]
        array = self._mapped()
        if len(file_rows) and file_rows.max() >= len(array):
            raise OSError(f"the data cache {self.path} is shorter than its index: delete it to rebuild")
        images = np.take(array, file_rows, axis=0, out=out)
        self._since_release += len(file_rows) * self._row_bytes
        if self._since_release >= RELEASE_EVERY_BYTES:
            self.release()
        return images

    def release(self) -> None:
        """Unmap the pages read so far from this process (they stay in the page cache)."""
        import mmap

        self._since_release = 0
        if self._mmap is not None and self._pid == os.getpid() and hasattr(mmap, "MADV_DONTNEED"):
            self._mmap.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        mapping, self._array, self._mmap = self._mmap, None, None
        if mapping is not None and self._pid == os.getpid():
            try:
                mapping.close()
            except BufferError:  # an array still views it; it is unmapped when that goes
                pass

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
