"""An image folder as a data source: recursive scan, parallel decoding into the cache, the bad-file report.

Every file below the folder whose extension is an image format
(:data:`ddim.data.decode.IMAGE_EXTENSIONS`, any case) is a candidate; hidden
files and folders (name starting with ``.``, e.g. macOS' ``._photo.jpg``) and
other extensions are ignored (and counted). A candidate that cannot be used is
skipped with a reason (:data:`ddim.data.decode.REASONS`) and listed in the
report. The label of an image is its first-level subfolder, as torchvision's
``ImageFolder`` has it (classes sorted by name); images directly in the folder
have no label (-1).

Decoding runs in a pool of worker processes (``data.workers``, default all
cores) that write rows straight into the cache file. A rebuild after the
folder changed decodes only new and changed files and copies the rows of the
others from the previous cache.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import ddim.data.cache as cache_lib
from ddim.data.decode import IMAGE_EXTENSIONS, REASONS, read_image
from ddim.data.errors import DataError
from ddim.data.preprocess import PREPROCESS_VERSION
from ddim.data.split import validation_score

# Files per task sent to a worker process: large enough to amortise the round trip, small enough
# for a smooth progress bar.
CHUNK = 32
# Below this many files to decode, decode in this process (starting workers costs about a second).
MIN_PARALLEL = 64


@dataclass
class Scan:
    """The candidate image files of a folder, sorted by relative path."""

    root: Path
    files: list[tuple[str, int, int]] = field(default_factory=list)
    """``(relative posix path, size in bytes, mtime in ns)`` of each candidate."""
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    """``(relative path, what the OS said)`` of folders and links that could not be listed or followed."""
    ignored: Counter = field(default_factory=Counter)
    """Files that are not images by their extension, counted by extension."""


def scan_folder(root: str | os.PathLike) -> Scan:
    """Walk ``root`` recursively (following links to folders once), collecting candidate images."""
    root = Path(root)
    scan = Scan(root)
    seen: set[tuple[int, int]] = set()

    def walk(directory: Path, relative: str) -> None:
        try:
            info = directory.stat()
            if (info.st_dev, info.st_ino) in seen:
                return  # a link back up the tree
            seen.add((info.st_dev, info.st_ino))
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as error:
            scan.unreadable.append((relative or ".", error.strerror or str(error)))
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = f"{relative}{entry.name}"
            try:
                is_dir = entry.is_dir()  # follows links
                if not is_dir:
                    extension = os.path.splitext(entry.name)[1].lower()
                    if extension not in IMAGE_EXTENSIONS:
                        scan.ignored[extension or "(none)"] += 1
                        continue
                    stat = entry.stat()
            except OSError as error:
                scan.unreadable.append((path, error.strerror or str(error)))
                continue
            if is_dir:
                walk(Path(entry.path), path + "/")
            elif entry.is_file():
                scan.files.append((path, stat.st_size, stat.st_mtime_ns))
            else:
                scan.unreadable.append((path, "broken link or not a regular file"))

    if not root.is_dir():
        raise DataError(f"image folder not found: {root}" if not root.exists() else f"not a folder: {root}")
    walk(root, "")
    scan.files.sort()
    return scan


@dataclass(frozen=True)
class DecodeSettings:
    """What the pixels and the usable/skipped decision depend on (besides each file)."""

    image_size: int
    min_size: int
    max_pixels: int

    def key(self) -> dict:
        return {"image_size": self.image_size, "min_size": self.min_size, "max_pixels": self.max_pixels,
                "preprocess_version": PREPROCESS_VERSION}


def class_of(relative_path: str) -> str | None:
    """The first-level subfolder of a file (its class), or None for files directly in the folder."""
    head, sep, _ = relative_path.partition("/")
    return head if sep else None


def fingerprint(scan: Scan, settings: DecodeSettings) -> str:
    """Hash of the file list (paths, sizes, mtimes) and the decode settings: the cache's validity key."""
    h = hashlib.sha256(repr(sorted(settings.key().items())).encode())
    for path, size, mtime in scan.files:
        h.update(f"{path}\0{size}\0{mtime}\n".encode("utf-8", "surrogateescape"))
    for path, reason in scan.unreadable:
        h.update(f"!{path}\0{reason}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:24]


def _decode_chunk(images_path: str, row_bytes: int, tasks: list[tuple[int, str]], settings: DecodeSettings):
    """Worker: decode files and write their rows into the cache file; returns what each one was."""
    results = []
    fd = os.open(images_path, os.O_WRONLY)
    try:
        for row, path in tasks:
            decoded = read_image(path, settings.image_size, settings.min_size, settings.max_pixels)
            if decoded.pixels is not None:
                os.pwrite(fd, np.ascontiguousarray(decoded.pixels).data, row * row_bytes)
            results.append((row, decoded.reason, decoded.detail, decoded.width, decoded.height))
    finally:
        os.close(fd)
    return results


def _worker_count(workers: int) -> int:
    if workers > 0:
        return workers
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def _decode_all(writer: cache_lib.EntryWriter, tasks, settings, workers: int, on_done: Callable[[int], None]):
    """Decode ``tasks`` (row, absolute path) into ``writer``'s file, in parallel when worth it."""
    workers = min(_worker_count(workers), max(1, len(tasks) // CHUNK))
    chunks = [tasks[i : i + CHUNK] for i in range(0, len(tasks), CHUNK)]
    args = (str(writer.images_path), writer.row_bytes)
    if workers <= 1 or len(tasks) < MIN_PARALLEL:
        for chunk in chunks:
            yield from _decode_chunk(*args, chunk, settings)
            on_done(len(chunk))
        return
    import multiprocessing

    # "spawn": the parent has JAX's threads running, and forking a multithreaded process is unsafe.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_decode_chunk, *args, chunk, settings) for chunk in chunks]
        for future, chunk in zip(futures, chunks):
            yield from future.result()
            on_done(len(chunk))


def _why_rebuild(index: dict | None, settings: DecodeSettings, scan: Scan, old_files: dict) -> str:
    if index is None:
        return "no cache yet"
    if index.get("settings") != settings.key():
        changed = [f"{k} {index.get('settings', {}).get(k)} -> {v}" for k, v in settings.key().items()
                   if index.get("settings", {}).get(k) != v]
        return "the decode settings changed (" + ", ".join(changed) + "); decoding every file"
    current = {path: (size, mtime) for path, size, mtime in scan.files}
    added = sum(1 for path in current if path not in old_files)
    changed = sum(1 for path, stamp in current.items() if path in old_files and old_files[path][:2] != stamp)
    removed = sum(1 for path in old_files if path not in current)
    parts = [f"{count} {what}" for count, what in ((added, "new"), (changed, "changed"), (removed, "removed"))
             if count]
    return "the folder changed: " + (", ".join(parts) + " files" if parts else "unreadable folders changed")


def build_or_open(root: Path, settings: DecodeSettings, cache_root: Path, workers: int,
                  log: Callable[[str], None], progress_factory=None) -> tuple[Path, dict, bool]:
    """The folder's cache entry, built or updated if the folder or the settings changed.

    Returns ``(entry directory, index, whether it was built now)``. Holds the entry's lock while
    checking and building, so concurrent processes build it once.
    """
    root = Path(root).absolute()
    scan = scan_folder(root)
    directory = cache_lib.entry_dir(cache_root, f"folder-{root.name}", {"root": str(root),
                                                                          "size": settings.image_size})
    current = fingerprint(scan, settings)
    with cache_lib.entry_lock(directory):
        index = cache_lib.read_index(directory)
        if index is not None and index.get("fingerprint") == current:
            return directory, index, False
        old_files: dict[str, tuple[int, int, int]] = {}
        if index is not None and index.get("settings") == settings.key():
            for row, item in enumerate(cache_lib.load_files(directory, index) or []):
                old_files[item[0]] = (item[1], item[2], row)
        reason = _why_rebuild(index, settings, scan, old_files)
        index = _build(directory, root, scan, settings, current, index, old_files, workers, log, reason,
                       progress_factory)
    return directory, index, True


@dataclass
class _RowResults:
    """What a build learns about each row: why it was skipped ("" if usable), and the source size."""

    reasons: np.ndarray
    details: np.ndarray
    widths: np.ndarray
    heights: np.ndarray

    @classmethod
    def empty(cls, num: int) -> "_RowResults":
        return cls(np.full(num, "", dtype=object), np.full(num, "", dtype=object), np.zeros(num, np.int32),
                   np.zeros(num, np.int32))

    def set(self, row: int, reason: str, detail: str, width: int, height: int) -> None:
        self.reasons[row], self.details[row], self.widths[row], self.heights[row] = reason, detail, width, height


def _plan(directory: Path, root: Path, scan: Scan, old_index: dict | None, old_files: dict, results: _RowResults):
    """Split the rows into ``reuse`` (row, old row) of unchanged usable files and ``tasks`` (row, path) to
    decode; unchanged bad files keep their reason in ``results`` without being read again."""
    reuse, tasks = [], []
    old_rows = cache_lib.load_rows(directory, old_index) if old_files else None
    old_skipped = {item["path"]: item for item in (old_index or {}).get("skipped", [])} if old_files else {}
    for row, (path, size, mtime) in enumerate(scan.files):
        old = old_files.get(path)
        if old is None or old[:2] != (size, mtime):
            tasks.append((row, str(root / path)))
            continue
        old_row = old[2]
        results.widths[row], results.heights[row] = old_rows["width"][old_row], old_rows["height"][old_row]
        if old_rows["usable"][old_row]:
            reuse.append((row, old_row))
        else:
            previous = old_skipped.get(path, {"reason": "truncated", "detail": ""})
            results.reasons[row], results.details[row] = previous["reason"], previous.get("detail", "")
    return reuse, tasks


def _decode_with_progress(writer, tasks, settings, workers: int, results: _RowResults, progress_factory) -> None:
    """Decode ``tasks`` into ``writer``'s file, recording each row in ``results``, with a progress bar."""
    progress = progress_factory(len(tasks)) if progress_factory and tasks else None
    done = 0

    def on_done(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress.update(done, "")

    try:
        for row, why, detail, width, height in _decode_all(writer, tasks, settings, workers, on_done):
            results.set(row, why, detail, width, height)
    finally:
        if progress is not None:
            progress.close()


def _labels(paths: list[str]) -> tuple[list[str], np.ndarray]:
    """Class names (sorted first-level subfolders) and each path's class id (-1: directly in the folder)."""
    class_names = sorted({name for name in map(class_of, paths) if name is not None})
    class_index = {name: i for i, name in enumerate(class_names)}
    return class_names, np.array([class_index.get(class_of(path), -1) for path in paths], np.int32)


def _skipped(paths: list[str], results: _RowResults, scan: Scan) -> list[dict]:
    skipped = [{"path": path, "reason": results.reasons[row], "detail": results.details[row]}
               for row, path in enumerate(paths) if results.reasons[row]]
    return skipped + [{"path": path, "reason": "unreadable", "detail": detail} for path, detail in scan.unreadable]


def _build_stats(decoded: int, reused: int, seconds: float) -> dict:
    return {"decoded": decoded, "reused": reused, "seconds": round(seconds, 3),
            "images_per_second": round(decoded / seconds, 1) if seconds > 0 else None}


def _build(directory, root, scan, settings, current, old_index, old_files, workers, log, reason, progress_factory):
    """Write a new version of the entry: reuse unchanged rows, decode the rest, publish the index."""
    started = time.perf_counter()
    num = len(scan.files)
    writer = cache_lib.EntryWriter(directory, num, (settings.image_size, settings.image_size, 3))
    results = _RowResults.empty(num)
    reuse, tasks = _plan(directory, root, scan, old_index, old_files, results)
    log(f"data cache: {reason}; decoding {len(tasks):,} of {num:,} images"
        + (f", reusing {len(reuse):,}" if reuse else "") + f" into {directory}")
    try:
        if reuse:
            _copy_rows(directory, old_index, writer, reuse)
        _decode_with_progress(writer, tasks, settings, workers, results, progress_factory)
    except BaseException:
        writer.abandon()
        raise
    usable = results.reasons == ""
    paths = [path for path, _, _ in scan.files]
    class_names, labels = _labels(paths)
    skipped = _skipped(paths, results, scan)
    scores = np.array([validation_score(path) for path in paths], np.float64)
    seconds = time.perf_counter() - started
    index = writer.finish(
        {
            "source": {"kind": "folder", "root": str(root)},
            "fingerprint": current,
            "content": _content_digest(writer.images_path, usable, labels, scores),
            "settings": settings.key(),
            "class_names": class_names,
            "skipped": skipped,
            "ignored": dict(sorted(scan.ignored.items())),
            "unlisted": len(scan.unreadable),
            "build": _build_stats(len(tasks), len(reuse), seconds),
        },
        {"label": labels, "width": results.widths, "height": results.heights, "usable": usable, "score": scores},
        files=[[path, size, mtime] for path, size, mtime in scan.files],
    )
    rate = f" ({len(tasks) / seconds:,.0f} images/s)" if tasks and seconds > 0 else ""
    log(f"data cache: {int(usable.sum()):,} usable images, {len(skipped):,} skipped, built in {seconds:.1f}s{rate}")
    return index


def _content_digest(images_path: Path, usable: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> str:
    """Hash of what training reads: the decoded pixels, which rows are usable, their labels and split scores.

    Unlike :func:`fingerprint` (file metadata, cheap to check before decoding), it stays the same when a folder
    is copied or touched without changing its images, so a resumed run does not warn that its data changed."""
    h = hashlib.sha256()
    with open(images_path, "rb") as file:
        for block in iter(lambda: file.read(1 << 24), b""):
            h.update(block)
    for array in (usable, labels, scores):
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:24]


def _copy_rows(directory: Path, old_index: dict, writer: cache_lib.EntryWriter, pairs) -> None:
    """Copy preprocessed rows from the previous version of the entry (in chunks, in file order)."""
    old = cache_lib.ImageRows(directory / old_index["images_file"], tuple(old_index["shape"]),
                              np.arange(old_index["num_rows"]))
    pairs = np.asarray(pairs, np.int64)
    for start in range(0, len(pairs), 4096):
        chunk = pairs[start : start + 4096]
        pixels = old.read(chunk[:, 1])
        runs = np.flatnonzero(np.diff(chunk[:, 0]) != 1) + 1
        for part_rows, part_pixels in zip(np.split(chunk[:, 0], runs), np.split(pixels, runs)):
            writer.write_rows(int(part_rows[0]), part_pixels)
    old.close()


def reason_text(reason: str) -> str:
    return REASONS.get(reason, reason)
