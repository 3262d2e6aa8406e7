"""How a bundled model was made: its training record, built from the checkpoint and the work directory.

Only facts go in: the step and config come from the checkpoint, the images seen
are ``step x train.batch_size``, the checkpoint's date is orbax's commit time,
and the FID is a line of the work directory's ``eval.jsonl`` (``ddim eval``) or
a value passed in together with how it was measured. What is not known (the
hardware, when not passed in; an FID never measured) stays ``None``.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from pathlib import Path
from typing import Any

from ddim.config import Config
from ddim.errors import InputError
from ddim.pretrained.errors import PretrainedError
from ddim.workdir.layout import Workdir
from ddim.workdir.records import read_records

ORBAX_METADATA = "_CHECKPOINT_METADATA"  # orbax writes it into every step directory it commits


def training_record(config: Config, step: int, step_dir: Path, *, fid: dict[str, Any] | None,
                    hardware: str | None = None, recipe: str | None = None,
                    today: datetime.date | None = None) -> dict[str, Any]:
    """The record of a model exported from step ``step`` (directory ``step_dir``) of a run with ``config``."""
    return {
        "config": config.name,
        "recipe": recipe,
        "steps": step,
        "images_seen": step * config.train.batch_size,
        "batch_size": config.train.batch_size,
        "hardware": hardware,
        "fid": fid,
        "checkpoint": str(step_dir),
        "checkpoint_date": checkpoint_date(step_dir),
        "exported": (today or datetime.datetime.now(datetime.timezone.utc).date()).isoformat(),
    }


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
            and not line.get("eta") and line.get("guidance") in (None, 1.0))


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


def sampling_defaults(manifest):
    """The :class:`ddim.spec.SamplingSpec` a bundled model samples with by default: its record's ``"defaults"``
    (its best measured setting: steps, sampler, spacing, guidance), else None (the plain defaults)."""
    from ddim.spec import SamplingSpec, SpecError

    values = manifest.record.get("defaults")
    if values is None:
        return None
    try:
        return SamplingSpec(**values)
    except (TypeError, SpecError) as error:
        raise PretrainedError(f"the record of {manifest.name} has invalid sampling defaults {values!r}: {error}") from None


def describe(manifest) -> list[str]:
    """``ddim pretrained``'s lines for one bundled model (a :class:`~ddim.pretrained.bundle.Manifest`)."""
    model, record = manifest.config.model, manifest.record
    size = f"{model.image_size}x{model.image_size}"
    kind = f"class-conditional, {len(model.class_names)} classes" if model.class_conditional else "unconditional"
    images = record.get("images_seen")
    trained = (f"trained: config {record.get('config')}, {record.get('steps')} steps, "
               f"{images:,} images seen" if isinstance(images, int) else f"trained: config {record.get('config')}")
    trained += f", on {record.get('hardware') or 'unrecorded hardware'}"
    if record.get("checkpoint_date"):
        trained += f"; checkpoint of {record['checkpoint_date']}"
    if record.get("recipe"):
        trained += f"; recipe: {record['recipe']}"
    fid = record.get("fid")
    measured = f"FID {fid['value']:.2f} ({fid['protocol']})" if fid else "FID: not measured"
    return [
        f"{manifest.name}: {size} images, {manifest.parameters:,} parameters, {kind}",
        f"  {trained}",
        f"  {measured}",
        f"  weights {_megabytes(manifest.bytes)}, sha256 {manifest.sha256}",
    ]


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count / 1e3:.1f} kB"
