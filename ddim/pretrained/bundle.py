"""One bundled model on disk: its weights in safetensors and a JSON manifest, checked by SHA-256 on load.

A bundle is a directory named after the model::

    <name>/
      weights.safetensors   the EMA parameters and the normaliser (BatchNorm) statistics, keys
                            "params/..." and "batch_stats/..." (the Flax variable paths), float32
      model.json            {"format", "name", "sha256", "bytes", "parameters", "config", "record"}

safetensors, not pickle: reading a model runs no code from its files. ``config``
is the :class:`ddim.config.Config` that rebuilds the network (its class names
included), ``record`` how the weights were made (:mod:`ddim.pretrained.record`).
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

FORMAT = 1
MANIFEST = "model.json"
WEIGHTS = "weights.safetensors"
MAX_BYTES = 10_000_000
"""The most a bundled model's weights may take: it ships inside every copy of the package (10 MB)."""
_SEPARATOR = "/"  # Flax module and variable names never contain it


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
    if not isinstance(values, dict) or values.get("format") != FORMAT:
        found = values.get("format") if isinstance(values, dict) else None
        raise PretrainedError(f"{path} is not a bundled-model manifest of format {FORMAT} (format {found!r})")
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
        )
    except KeyError as error:
        raise PretrainedError(f"{path} lacks the field {error}") from None
    except (TypeError, ValueError, UserError) as error:
        raise PretrainedError(f"{path} is invalid: {error}") from None


def flatten(variables: dict[str, Any]) -> dict[str, Any]:
    """``{"params/network/Conv_0/kernel": array, ...}``: the Flax variables as safetensors' flat names."""
    from flax import traverse_util

    return traverse_util.flatten_dict(variables, sep=_SEPARATOR)


def write_bundle(root: str | os.PathLike, name: str, config: Config, variables: dict[str, Any],
                 record: dict[str, Any], overwrite: bool = False) -> Manifest:
    """Write ``variables`` (``{"params", "batch_stats"}``) as the bundle ``root/name``; its manifest.

    Written to a temporary directory beside it and renamed into place, so a
    failed export leaves no half bundle. Refuses weights over :data:`MAX_BYTES`
    and an existing bundle unless ``overwrite``.
    """
    import numpy as np
    from safetensors.numpy import save

    root, target = Path(root), Path(root) / name
    if target.exists() and not overwrite:
        raise PretrainedError(f"{target} already exists; use --overwrite to replace it")
    tensors = {key: np.ascontiguousarray(np.asarray(value)) for key, value in flatten(variables).items()}
    data = save(tensors, metadata={"format": f"ddim-pretrained-{FORMAT}", "name": name})
    if len(data) > MAX_BYTES:
        raise PretrainedError(f"the weights of {name} take {len(data) / 1e6:.1f} MB, over the "
                              f"{MAX_BYTES / 1e6:g} MB a bundled model may take")
    manifest = {
        "format": FORMAT,
        "name": name,
        "sha256": sha256_of(data),
        "bytes": len(data),
        "parameters": int(sum(v.size for k, v in tensors.items() if k.startswith("params" + _SEPARATOR))),
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
    """The bundle's variables as numpy arrays, after checking the weights file against its SHA-256."""
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
    return traverse_util.unflatten_dict(flat, sep=_SEPARATOR)
