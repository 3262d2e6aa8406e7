"""One bundled model on disk: its weights in safetensors and a JSON manifest, checked by SHA-256 on load.

A bundle is a directory named after the model::

    <name>/
      weights.safetensors   the EMA parameters and the normaliser (BatchNorm) statistics, keys
                            "params/..." and "batch_stats/..." (the Flax variable paths), float32 or float16
      model.json            {"format", "name", "sha256", "bytes", "parameters", "weights_dtype", "config",
                             "record"}

safetensors, not pickle: reading a model runs no code from its files. ``config``
is the :class:`ddim.config.Config` that rebuilds the network (its class names
included), ``record`` how the weights were made (:class:`ddim.pretrained.bundle_record.BundleRecord`).
Weights stored in float16 take half the bytes; they are read back as float32
arrays, so the network computes as it does with float32 weights (only the
stored values are rounded). The SHA-256 is of the file as stored. Format 1
manifests (before float16) have no ``weights_dtype``: their weights are float32.
Nothing here imports JAX at module level, so listing bundles stays instant.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddim.config import Config, from_dict
from ddim.errors import UserError
from ddim.pretrained.errors import PretrainedError

FORMAT = 2
"""The manifest format written: 2 adds ``weights_dtype``. Format 1 manifests are read as float32 bundles."""
READABLE_FORMATS = (1, 2)
MANIFEST = "model.json"
WEIGHTS = "weights.safetensors"
MAX_BYTES = 10_000_000
"""The most a bundled model's weights may take: it ships inside every copy of the package (10 MB)."""
_SEPARATOR = "/"  # Flax module and variable names never contain it
WEIGHTS_DTYPES = ("float32", "float16")
"""How a bundle may store its floating-point weights: exactly (float32) or rounded to half the bytes (float16)."""


@dataclass(frozen=True)
class Manifest:
    """What ``model.json`` says about one bundled model (its weights are read by :func:`read_variables`)."""

    name: str
    directory: Path
    sha256: str
    bytes: int
    parameters: int
    config: Config
    record: dict[str, Any]
    weights_dtype: str = "float32"
    """How the floating-point weights are stored in the file (they are always read as float32)."""

    @property
    def weights(self) -> Path:
        return self.directory / WEIGHTS


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_manifest(directory: str | os.PathLike) -> Manifest:
    """The manifest of the bundle in ``directory``; :class:`PretrainedError` when it is missing or invalid."""
    directory = Path(directory)
    path = directory / MANIFEST
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PretrainedError(f"{directory} is not a bundled model (no {MANIFEST})") from None
    except (OSError, ValueError) as error:
        raise PretrainedError(f"cannot read {path}: {error}") from None
    if not isinstance(values, dict) or values.get("format") not in READABLE_FORMATS:
        found = values.get("format") if isinstance(values, dict) else None
        readable = " or ".join(str(number) for number in READABLE_FORMATS)
        raise PretrainedError(f"{path} is not a bundled-model manifest of format {readable} (format {found!r})")
    if values.get("name") != directory.name:
        raise PretrainedError(f"{path} names the model {values.get('name')!r} but lies in {directory.name}/")
    try:
        return Manifest(
            name=str(values["name"]),
            directory=directory,
            sha256=str(values["sha256"]),
            bytes=int(values["bytes"]),
            parameters=int(values["parameters"]),
            config=from_dict(values["config"]),
            record=dict(values["record"]),
            weights_dtype=_weights_dtype(values),
        )
    except KeyError as error:
        raise PretrainedError(f"{path} lacks the field {error}") from None
    except (TypeError, ValueError, UserError) as error:
        raise PretrainedError(f"{path} is invalid: {error}") from None


def _weights_dtype(values: dict[str, Any]) -> str:
    """The stored dtype a manifest names (format 1: float32, the only one there was)."""
    if values["format"] == 1:
        return "float32"
    dtype = values["weights_dtype"]
    if dtype not in WEIGHTS_DTYPES:
        raise ValueError(f"weights_dtype {dtype!r} is not one of {', '.join(WEIGHTS_DTYPES)}")
    return dtype


def flatten(variables: dict[str, Any]) -> dict[str, Any]:
    """``{"params/network/Conv_0/kernel": array, ...}``: the Flax variables as safetensors' flat names."""
    from flax import traverse_util

    return traverse_util.flatten_dict(variables, sep=_SEPARATOR)


def stored_tensors(variables: dict[str, Any], weights_dtype: str = "float32") -> dict[str, Any]:
    """The flat numpy arrays a bundle stores: floating-point ones as ``weights_dtype``; :class:`PretrainedError`
    when a value does not fit it (float16 ends at 65,504)."""
    import numpy as np

    if weights_dtype not in WEIGHTS_DTYPES:
        raise PretrainedError(f"weights are stored as {' or '.join(WEIGHTS_DTYPES)}, not {weights_dtype!r}")
    tensors = {}
    for key, value in flatten(variables).items():
        array = np.asarray(value)
        if np.issubdtype(array.dtype, np.floating):
            with np.errstate(over="ignore"):  # an overflow is refused below, in one line
                stored = array.astype(weights_dtype)
            if not np.isfinite(stored).all() and np.isfinite(array).all():
                raise PretrainedError(f"{key} holds values beyond the range of {weights_dtype} "
                                      f"(largest {np.abs(array).max():.4g}); store the weights as float32")
            array = stored
        tensors[key] = np.ascontiguousarray(array)
    return tensors


def write_bundle(root: str | os.PathLike, name: str, config: Config, variables: dict[str, Any],
                 record: dict[str, Any], overwrite: bool = False, weights_dtype: str = "float32") -> Manifest:
    """Write ``variables`` (``{"params", "batch_stats"}``) as the bundle ``root/name``; its manifest.

    ``weights_dtype``: how the floating-point arrays are stored (:data:`WEIGHTS_DTYPES`; float16 rounds them
    to half the bytes). Written to a temporary directory beside it and renamed
    into place, so a failed export leaves no half bundle. Refuses weights over
    :data:`MAX_BYTES` and an existing bundle unless ``overwrite``.
    """
    from safetensors.numpy import save

    root, target = Path(root), Path(root) / name
    if target.exists() and not overwrite:
        raise PretrainedError(f"{target} already exists; use --overwrite to replace it")
    tensors = stored_tensors(variables, weights_dtype)
    # One metadata entry: safetensors writes several in no fixed order, and the same weights must give the same
    # file (and SHA-256) every time they are written.
    data = save(tensors, metadata={"ddim-pretrained": json.dumps(
        {"format": FORMAT, "name": name, "dtype": weights_dtype}, sort_keys=True)})
    if len(data) > MAX_BYTES:
        raise PretrainedError(f"the weights of {name} take {len(data) / 1e6:.1f} MB, over the "
                              f"{MAX_BYTES / 1e6:g} MB a bundled model may take")
    manifest = {
        "format": FORMAT,
        "name": name,
        "sha256": sha256_of(data),
        "bytes": len(data),
        "parameters": int(sum(v.size for k, v in tensors.items() if k.startswith("params" + _SEPARATOR))),
        "weights_dtype": weights_dtype,
        "config": config.to_dict(),
        "record": record,
    }
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
        try:
            staging.chmod(0o755)  # mkdtemp's 0700 would hide the bundle from other users
            (staging / WEIGHTS).write_bytes(data)
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as error:
        raise PretrainedError(f"cannot write {target}: {error.strerror or error}") from None
    return read_manifest(target)


def read_variables(manifest: Manifest) -> dict[str, Any]:
    """The bundle's variables as numpy arrays, after checking the weights file against its SHA-256; weights stored
    in float16 come back as float32 (what the network computes with)."""
    from flax import traverse_util
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        data = manifest.weights.read_bytes()
    except OSError as error:
        raise PretrainedError(f"cannot read the weights of {manifest.name}: {error.strerror or error}: "
                              f"{manifest.weights}") from None
    digest = sha256_of(data)
    if digest != manifest.sha256:
        raise PretrainedError(
            f"the weights of {manifest.name} ({manifest.weights}) do not match their SHA-256 (expected "
            f"{manifest.sha256[:16]}..., got {digest[:16]}...): the file is damaged or was changed"
        )
    try:
        flat = load(data)
    except SafetensorError as error:
        raise PretrainedError(f"cannot read {manifest.weights}: {error}") from None
    flat = {key: value.astype("float32") if value.dtype.kind == "f" and value.dtype.itemsize < 4 else value
            for key, value in flat.items()}
    return traverse_util.unflatten_dict(flat, sep=_SEPARATOR)


def store_as(manifest: Manifest, weights_dtype: str, root: str | os.PathLike | None = None,
             overwrite: bool = False) -> Manifest:
    """The bundle of ``manifest`` written again with its weights stored as ``weights_dtype``, into ``root``
    (default: where it is, replacing it); its config and record are kept, its SHA-256 and size follow the file."""
    root = Path(root) if root is not None else manifest.directory.parent
    same_place = (root / manifest.name).resolve() == manifest.directory.resolve()
    return write_bundle(root, manifest.name, manifest.config, read_variables(manifest), manifest.record,
                        overwrite=overwrite or same_place, weights_dtype=weights_dtype)


def write_record(manifest: Manifest, record: dict[str, Any]) -> Manifest:
    """``manifest``'s bundle with ``record`` in place of its record (the weights untouched), written atomically."""
    path = manifest.directory / MANIFEST
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        values["record"] = record
        staging = path.with_name(f".{MANIFEST}.{os.getpid()}")
        staging.write_text(json.dumps(values, indent=2) + "\n", encoding="utf-8")
        os.replace(staging, path)
    except (OSError, ValueError) as error:
        raise PretrainedError(f"cannot write {path}: {getattr(error, 'strerror', None) or error}") from None
    return read_manifest(manifest.directory)
