"""Damaged checkpoints: finding them, naming what is wrong, and setting them aside.

Storage fails in ways orbax's atomic rename does not cover (a crash of the
disk, a partial copy, a full file system). :func:`problem` checks a step's
files without reading its arrays; :func:`read_error` tells damage apart from
storage that cannot be read right now; :func:`agreed_problem` makes every
process of a multi-process run agree; :func:`set_aside` renames a damaged step
``<step>.damaged`` (never deletes it), which orbax does not list.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import re
from pathlib import Path

from ddim.checkpoint.errors import CheckpointError, DamagedCheckpoint
from ddim.errors import environment_error, first_line, os_error_code
from ddim.workdir.layout import Workdir
from ddim.workdir.lock import live_holder

DAMAGED_SUFFIX = ".damaged"

# Errors that say the storage cannot be read right now, not that the checkpoint is damaged:
# moving a checkpoint aside for them would hide a good checkpoint behind a passing fault.
NOT_DAMAGE = {errno.EACCES, errno.EPERM, errno.EIO, errno.ENOMEM, errno.EMFILE, errno.ENFILE}

_ITEMS = ("state", "config")
_REQUIRED_FILES = ("state/_METADATA", "state/manifest.ocdbt", "config/metadata")


def damage_reason(error: BaseException) -> str | None:
    """Why an orbax/TensorStore restore failure means damaged files, naming the array where it can; else None."""
    chain, cause = [], error
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(e, json.JSONDecodeError) for e in chain):
        return "a metadata file is not valid JSON"
    text = " | ".join(str(e) for e in chain)
    item = re.search(r"Item \"(\w+)\" was not found", text)
    if item:
        return f"its {item.group(1)!r} item is missing"
    array = re.search(r'"([^"/]+)(?:/[^"]*)?" in OCDBT', text)
    where = f" (array {array.group(1)})" if array else ""
    if "OUT_OF_RANGE" in text or "byte range" in text.lower():
        return "a data file is truncated" + where
    if "DATA_LOSS" in text or "corrupt" in text.lower():
        return "a data file is corrupt" + where
    if "NOT_FOUND" in text or "does not exist" in text or "not found" in text.lower():
        return "a file is missing" + where
    return None  # not recognisably damage: reported as it is, and the checkpoint stays where it is


def read_error(path: Path, error: BaseException) -> CheckpointError:
    """The error for a failed read of step directory ``path``: damage (files missing, truncated,
    garbled) or another failure, which must not move anything."""
    if os_error_code(error) in NOT_DAMAGE:
        return CheckpointError(f"cannot read checkpoint {path}: {environment_error(error)}")
    reason = damage_reason(error)
    if reason is None:
        return CheckpointError(f"cannot restore checkpoint {path}: {first_line(error)}")
    return DamagedCheckpoint(path, reason)


def problem(path: Path) -> str | None:
    """What is wrong with the files of step directory ``path``, found without reading its arrays; None if nothing.

    Catches an empty directory, a missing item or manifest, garbled JSON
    metadata and empty data files; truncated or garbled array data only
    shows when restoring. Raises :class:`CheckpointError` when the
    directory cannot be read right now.
    """
    try:
        return _missing_part(path) or _invalid_json(path) or _empty_data_file(path)
    except OSError as error:
        if os_error_code(error) in NOT_DAMAGE:
            raise CheckpointError(f"cannot read checkpoint {path}: {environment_error(error)}") from None
        return environment_error(error) or first_line(error)


def _missing_part(path: Path) -> str | None:
    if not any(path.iterdir()):
        return "the directory is empty"
    for item in _ITEMS:
        if not (path / item).is_dir():
            return f"its {item!r} item is missing"
    for name in _REQUIRED_FILES:
        if not (path / name).is_file():
            return f"{name} is missing"
    return None


def _invalid_json(path: Path) -> str | None:
    json_files = [path / "_CHECKPOINT_METADATA", path / "state" / "_METADATA", path / "state" / "_sharding",
                  path / "config" / "metadata", *(path / "state" / "array_metadatas").glob("*")]
    for file in json_files:
        if file.is_file():
            try:
                json.loads(file.read_bytes())
            except ValueError:
                return f"{file.relative_to(path)} is not valid JSON"
    return None


def _empty_data_file(path: Path) -> str | None:
    for file in [*path.glob("state/**/manifest.ocdbt"), *path.glob("state/**/d/*")]:
        if file.is_file() and file.stat().st_size == 0:
            return f"{file.relative_to(path)} is empty"
    return None


def process_count() -> int:
    import jax  # on first use: the rest of this module needs no JAX

    return jax.process_count()


def agreed_problem(reason: str | None) -> str | None:
    """In a multi-process run a checkpoint damaged for one process is damaged for all."""
    if process_count() == 1:
        return reason
    import numpy as np
    from jax.experimental import multihost_utils

    votes = multihost_utils.process_allgather(np.int32(reason is not None))
    if reason is None and np.any(votes):
        return "another process could not read it"
    return reason


def set_aside(directory: Path, step: int, reason: str, read_only: bool) -> Path | None:
    """Rename the damaged ``step`` of ``directory`` to ``<step>.damaged`` (with a note of why); the new path.

    None, leaving it where it is, when the rename fails or the directory is
    ``read_only`` and a training run owns it (a trainer sets its own damaged
    checkpoints aside). In a multi-process run process 0 renames and the
    others wait for it.
    """
    import jax

    target = None
    if jax.process_index() == 0 and (not read_only or _no_live_trainer(directory)):
        target = _rename_with_note(directory, step, reason)
    if process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"ddim_set_aside_{step}")
    return target


def _rename_with_note(directory: Path, step: int, reason: str) -> Path | None:
    target = directory / f"{step}{DAMAGED_SUFFIX}"
    suffix = 2
    while target.exists():
        target, suffix = directory / f"{step}{DAMAGED_SUFFIX}.{suffix}", suffix + 1
    try:
        (directory / str(step)).rename(target)
    except OSError:
        return None
    stamp = datetime.datetime.now().isoformat(sep=" ", timespec="seconds")
    with contextlib.suppress(OSError):
        (target / "DAMAGED.txt").write_text(f"{stamp}: set aside by ddim: {reason}\n")
    return target


def is_set_aside(path: Path) -> bool:
    """Whether ``path`` names a step directory that :func:`set_aside` renamed."""
    return path.name.endswith(DAMAGED_SUFFIX) or DAMAGED_SUFFIX + "." in path.name


def _no_live_trainer(directory: Path) -> bool:
    """Whether nothing trains in the work directory of checkpoint folder ``directory``."""
    return live_holder(Workdir.of_checkpoint(directory).root) is None
