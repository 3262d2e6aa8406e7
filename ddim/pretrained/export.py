"""A checkpoint -> a bundled model: its EMA weights, config and training record (``ddim pretrained export``).

The weights are exactly the checkpoint's (float32, the variables
:func:`ddim.checkpoint.load_ema` gives), so the bundle samples the same pixels;
or rounded to float16 (``weights_dtype``), half the bytes.
Paths of the training machine (the TFDS and cache directories, the KID
weights; a fine-tune's source path is cut to its last two parts) are cleared from the stored config: they mean nothing elsewhere. A model
trained on a copy of a dataset (a folder exported from TFDS on a machine without
TensorFlow) can name the dataset itself as the data ``ddim eval`` scores it against
(``real_data``); where it was trained is kept in the record.

The record written (:func:`training_record`): the step and config come from the checkpoint, the images seen are
``step x`` the run's batch (``Config.step_batch_size``), the checkpoint's date is orbax's commit time, and the FID
is a line of the work directory's ``eval.jsonl`` (``ddim eval``) or a value passed in together with how it was
measured. What is not known (the hardware, when not passed in; an FID never measured) stays ``None``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from pathlib import Path
from typing import Any, Callable

from ddim.checkpoint.ema import load_ema
from ddim.config import Config, DataConfig
from ddim.errors import InputError
from ddim.pretrained.bundle import Manifest, write_bundle
from ddim.pretrained.bundle_record import BundleRecord
from ddim.pretrained.errors import PretrainedError
from ddim.pretrained.registry import bundled_root, check_name, pretrained_name
from ddim.spec import guidance_scale
from ddim.workdir.layout import Workdir
from ddim.workdir.records import read_records

ORBAX_METADATA = "_CHECKPOINT_METADATA"  # orbax writes it into every step directory it commits


def portable_config(config: Config, real_data: DataConfig | None = None) -> Config:
    """``config`` without the paths of the machine it was trained on; its data ``real_data`` when given."""
    data = dataclasses.replace(real_data if real_data is not None else config.data, data_dir="", cache_dir="")
    train = dataclasses.replace(config.train, inception_weights="")
    init = config.init
    if init.source and pretrained_name(init.source) is None:  # a path: its last two parts, as the record's checkpoint
        init = dataclasses.replace(init, source="/".join(Path(init.source).parts[-2:]))
    return dataclasses.replace(config, data=data, train=train, init=init)


def export_checkpoint(
    checkpoint: str | os.PathLike,
    name: str,
    *,
    root: str | os.PathLike | None = None,
    fid: float | None = None,
    fid_protocol: str | None = None,
    eval_file: str | os.PathLike | None = None,
    hardware: str | None = None,
    recipe: str | None = None,
    real_data: DataConfig | None = None,
    overwrite: bool = False,
    warn: Callable[[str], None] | None = None,
    weights_dtype: str = "float32",
) -> Manifest:
    """Bundle the newest intact checkpoint of ``checkpoint`` (a work directory or a step directory) as ``root/name``.

    ``root`` defaults to :func:`~ddim.pretrained.registry.bundled_root` (the
    package's ``ddim/pretrained/``). The FID is ``fid`` with ``fid_protocol``
    (how it was measured) when given, else read from ``eval_file`` (default: the
    work directory's ``eval.jsonl``), else ``None``: never made up.
    ``hardware`` and ``recipe`` are the user's words, recorded as given.
    ``real_data``: the data section the bundle keeps (what ``ddim eval`` of it
    scores against; class ids are matched by name) instead of the checkpoint's;
    the checkpoint's data are then recorded as ``trained_on_data``.
    ``weights_dtype``: ``"float32"`` (exact) or ``"float16"`` (half the bytes; measure the FID of both first).
    """
    check_name(name)
    measured = given_fid(fid, fid_protocol) if fid is not None else None
    loaded = load_ema(checkpoint, warn=warn)
    if measured is None:
        source = Path(eval_file) if eval_file is not None else workdir_eval_file(loaded.path)
        measured = fid_from_eval_file(source, loaded.path, loaded.step, loaded.config.name)
    record = training_record(loaded.config, loaded.step, loaded.path, fid=measured, hardware=hardware, recipe=recipe)
    if real_data is not None:
        trained_on = loaded.config.data
        record = record.replace(trained_on_data={"image_dir": trained_on.image_dir} if trained_on.image_dir else
                                {"dataset": trained_on.dataset, "train_split": trained_on.train_split})
    return write_bundle(root if root is not None else bundled_root(), name, portable_config(loaded.config, real_data),
                        loaded.variables, record.to_dict(), overwrite=overwrite, weights_dtype=weights_dtype)


def training_record(config: Config, step: int, step_dir: Path, *, fid: dict[str, Any] | None,
                    hardware: str | None = None, recipe: str | None = None,
                    today: datetime.date | None = None) -> BundleRecord:
    """The record of a model exported from step ``step`` (directory ``step_dir``) of a run with ``config``: its
    training fields, each written (null where not known)."""
    batch_size = config.step_batch_size
    return BundleRecord.from_dict({
        "config": config.name,
        "recipe": recipe,
        "steps": step,
        "images_seen": step * batch_size,
        "batch_size": batch_size,
        "hardware": hardware,
        "fid": fid,
        # Relative to its work directory: where the machine it was trained on kept runs means nothing elsewhere.
        "checkpoint": f"{step_dir.parent.name}/{step_dir.name}",
        "checkpoint_date": checkpoint_date(step_dir),
        "exported": (today or datetime.datetime.now(datetime.timezone.utc).date()).isoformat(),
    })


def checkpoint_date(step_dir: Path) -> str | None:
    """The UTC date the checkpoint was committed (orbax's metadata; else the directory's modification time)."""
    try:
        nanoseconds = json.loads((step_dir / ORBAX_METADATA).read_text())["commit_timestamp_nsecs"]
        seconds = float(nanoseconds) / 1e9
    except (OSError, ValueError, KeyError, TypeError):
        try:
            seconds = step_dir.stat().st_mtime
        except OSError:
            return None
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).date().isoformat()


def given_fid(value: float, protocol: str | None) -> dict[str, Any]:
    """An FID measured elsewhere: the value and the user's words on how it was measured (both required)."""
    if not protocol or not protocol.strip():
        raise InputError("an FID needs the words saying how it was measured (--fid-protocol), e.g. "
                         "'5000 samples, 20 DDIM steps, against all 8189 Flowers images, standard FID Inception'")
    if not (math.isfinite(value) and value >= 0):
        raise InputError(f"an FID is a finite number >= 0, got {value!r}")
    return {"value": float(value), "protocol": protocol.strip(), "eval": None}


def fid_from_eval_file(eval_file: Path, step_dir: Path, step: int, config_name: str) -> dict[str, Any] | None:
    """The FID ``ddim eval`` measured of this checkpoint, from an ``eval.jsonl``; None when it has none.

    A line counts when its step and config name are the checkpoint's; lines
    naming this very step directory come first (a shared ``eval.jsonl`` may
    hold other runs), then those with ``ddim sample``'s default sampler
    (deterministic DDIM on the uniform grid: what a user of the model gets),
    then the newest. The line is kept whole.
    """
    lines = [line for line in _eval_lines(eval_file)
             if line.get("step") == step and line.get("config") == config_name and line.get("fid") is not None]
    here = [line for line in lines if _same_path(line.get("checkpoint"), step_dir)]
    lines = here or lines
    default = [line for line in lines if _is_default_sampler(line)]
    if not lines:
        return None
    line = (default or lines)[-1]
    return {"value": float(line["fid"]), "protocol": describe_eval(line), "eval": line}


def _same_path(named: Any, path: Path) -> bool:
    try:
        return isinstance(named, str) and Path(named).resolve() == Path(path).resolve()
    except OSError:
        return False


def _eval_lines(eval_file: Path) -> list[dict[str, Any]]:
    try:
        return read_records(eval_file)
    except OSError as error:
        raise PretrainedError(f"cannot read {eval_file}: {error.strerror or error}") from None


def _is_default_sampler(line: dict[str, Any]) -> bool:
    return (line.get("sampler", "ddim") == "ddim" and line.get("spacing", "uniform") == "uniform"
            and not line.get("eta") and guidance_scale(line.get("guidance")) == 1.0)


def describe_eval(line: dict[str, Any]) -> str:
    """How an ``eval.jsonl`` line measured its FID, in words."""
    real = (f"the statistics in {os.path.basename(str(line['real_stats']))}" if line.get("real_stats")
            else f"{line.get('real_num')} real images ({line.get('split')} split)")
    return (f"ddim eval: {line.get('num')} samples of {line.get('steps')} {line.get('sampler', 'ddim')} steps "
            f"({line.get('spacing', 'uniform')} spacing, eta {line.get('eta', 0.0):g}, seed {line.get('seed')}) "
            f"against {real}; {line.get('fid_feature_net')}; measured {line.get('time')}")


def workdir_eval_file(step_dir: Path) -> Path:
    """The ``eval.jsonl`` of the work directory a step directory belongs to."""
    return Workdir.of_checkpoint(Path(step_dir).absolute().parent).eval_file
