"""Read PyTorch files without PyTorch: a restricted unpickler that runs no code from the file.

A PyTorch file (``torch.save`` or TorchScript) is a zip archive holding a
pickle and raw tensor storages (or, for files written by PyTorch < 1.6, the
same pieces one after the other). :func:`read_torch_file` reads both with an
unpickler that accepts only tensor rebuilds, ordered dicts, TorchScript's
integer lists and TorchScript module classes (mapped to plain containers):
any other global is refused, so nothing in the file is executed. Tensors come
back as numpy arrays. Nothing here knows which network the tensors belong to.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import re
import struct
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np


class TorchScriptObject:
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
    if isinstance(tree, TorchScriptObject):
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
            return TorchScriptObject.named(f"{module}.{name}")
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
    TorchScript modules come back as :class:`TorchScriptObject` (their
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
    if isinstance(tree, TorchScriptObject):
        return flatten(tree.state, prefix)
    out: dict[str, np.ndarray] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out
