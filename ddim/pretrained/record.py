"""How a bundled model was made and what it scores: its record, the one place these facts live.

``ddim pretrained export`` writes the training record: the step and config come
from the checkpoint, the images seen are ``step x train.batch_size``, the
checkpoint's date is orbax's commit time, and the FID is a line of the work
directory's ``eval.jsonl`` (``ddim eval``) or a value passed in together with how
it was measured. What is not known (the hardware, when not passed in; an FID
never measured) stays ``None``.

A shipped model's record adds what was measured on it after export (the
fields ``ddim pretrained`` and docs/models.md show; nothing is filled in by
guesswork, and a score still to measure has ``"fid": null``)::

    "recipe":   the command that trained it           "data":      the images, in words
    "distilled_from": a distilled student's teacher, in words
    "hardware": what it trained on                    "wall_time": how long, in words
    "defaults": {"steps", "sampler", "spacing", "eta", "guidance"}: its best measured setting,
                what ``ddim sample --pretrained NAME`` uses when no option is given
    "scores":   [{"num", "steps", "sampler", "spacing", "eta", "guidance", "seed", "split", "real_num",
                  "fid", "kid", "class_accuracy", "real_class_accuracy", "source", "measured"}, ...]:
                ``ddim eval --split all`` figures (standard FID Inception, against all the real images at the
                model's size); ``source`` is the raw line's file under docs/results/
    "guidance": why the default scale is the best measured one, in words
    "advice":   which sampler for fewer steps, in words
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
    # A distilled student trains with [distill]'s batch, not [train]'s (the teacher's).
    batch_size = config.distill.batch_size if config.model.distilled_steps else config.train.batch_size
    return {
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


PLAIN = {"steps": 20, "sampler": "ddim", "spacing": "uniform", "eta": 0.0, "guidance": 1.0}
"""The setting of a model with no recorded defaults (a run of your own): 20 deterministic DDIM steps on the uniform
grid, guidance 1. Scores at it compare a bundled model with such runs."""
QUICK_NUM, FULL_NUM = 1000, 5000
"""The two protocols: 1,000 samples (a quick look, minutes) and 5,000 (``ddim eval``'s default, the table's lead)."""
_SETTING = ("steps", "sampler", "spacing", "eta", "guidance")


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


def default_setting(record: dict[str, Any]) -> dict[str, Any]:
    """The setting a model samples with when no option is given: its record's ``defaults``, else :data:`PLAIN`."""
    defaults = record.get("defaults")
    if not defaults:
        return dict(PLAIN)
    return {**PLAIN, **defaults, "guidance": defaults.get("guidance") if defaults.get("guidance") is not None else 1.0}


def best_guidance(record: dict[str, Any], class_conditional: bool) -> float | None:
    """The guidance scale a record names as the model's best (its defaults' scale), else None (never measured)."""
    defaults = record.get("defaults") or {}
    if not class_conditional or defaults.get("guidance") is None:
        return None
    return float(defaults["guidance"])


def score_from_eval(line: dict[str, Any], source: str | None = None) -> dict[str, Any]:
    """A ``"scores"`` entry from one ``eval.jsonl`` line of ``ddim eval --split all`` (``source``: where it is kept)."""
    return {
        "num": line["num"], "steps": line["steps"], "sampler": line.get("sampler", "ddim"),
        "spacing": line.get("spacing", "uniform"), "eta": float(line.get("eta", 0.0)),
        "guidance": float(line["guidance"]) if line.get("guidance") is not None else 1.0,
        "seed": line.get("seed", 0), "split": line.get("split"), "real_num": line.get("real_num"),
        "fid": line.get("fid"), "kid": line.get("kid_mean"), "class_accuracy": line.get("class_accuracy"),
        "real_class_accuracy": line.get("real_val_class_accuracy"), "source": source,
        "measured": str(line.get("time", ""))[:10] or None,
    }


def with_score(record: dict[str, Any], score: dict[str, Any]) -> dict[str, Any]:
    """``record`` with ``score`` in its ``"scores"``, in place of the entry of the same samples and setting."""
    setting = {key: _value(score, key) for key in _SETTING}

    def same(entry: dict[str, Any]) -> bool:
        return find_score({"scores": [entry]}, score["num"], setting) is not None

    scores = list(record.get("scores") or ())
    if any(same(entry) for entry in scores):
        return {**record, "scores": [score if same(entry) else entry for entry in scores]}
    return {**record, "scores": [*scores, score]}


def find_score(record: dict[str, Any], num: int, setting: dict[str, Any]) -> dict[str, Any] | None:
    """The record's score of ``num`` samples at ``setting`` (steps, sampler, spacing, eta, guidance), else None."""
    wanted = {**PLAIN, **setting}
    for score in record.get("scores") or ():
        if score.get("num") == num and all(_same(_value(score, key), wanted[key]) for key in _SETTING):
            return score
    return None


def _value(score: dict[str, Any], key: str) -> Any:
    return PLAIN[key] if score.get(key) is None else score[key]  # an unconditional model's guidance is null


def _same(a: Any, b: Any) -> bool:
    return float(a) == float(b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else a == b


def describe_setting(setting: dict[str, Any]) -> str:
    """``20 steps of dpmpp-2m (logsnr grid), guidance 1.5``."""
    text = f"{setting['steps']} steps of {setting['sampler']} ({setting['spacing']} grid)"
    if setting.get("eta"):
        text += f", eta {setting['eta']:g}"
    return text + f", guidance {setting['guidance']:g}"


def eval_command(name: str, num: int, setting: dict[str, Any], defaults: dict[str, Any]) -> str:
    """The ``ddim eval`` command that measures ``num`` samples of the bundled model ``name`` at ``setting``."""
    options = [f"--{key} {setting[key]:g}" if isinstance(setting[key], float) else f"--{key} {setting[key]}"
               for key in _SETTING if not _same(setting[key], defaults[key])]
    return " ".join([f"ddim eval --pretrained {name} --num {num} --split all", *options])


def _figures(score: dict[str, Any] | None) -> str:
    if score is None or score.get("fid") is None:
        return "not measured"
    text = f"{score['fid']:.1f}"
    return text + (f" / {score['kid']:.4f}" if score.get("kid") is not None else " / KID not measured")


def _class_accuracy(score: dict[str, Any] | None) -> str | None:
    if score is None or score.get("class_accuracy") is None:
        return None
    text = f"{100 * score['class_accuracy']:.1f} % of {score['num']:,} samples"
    if score.get("real_class_accuracy") is not None:
        text += f" (real images: {100 * score['real_class_accuracy']:.1f} %)"
    return text


def network_summary(config: Config, parameters: int, weights_bytes: int) -> str:
    """The network in words, from the config that rebuilds it."""
    model = config.model
    parts = [f"UNet, widths {'/'.join(str(w) for w in model.widths)}, {model.block_depth} residual blocks per level"]
    if model.embedding_injection == "every-block":
        parts.append("noise level in every block")
    if model.class_conditional:
        parts.append("ADM class embedding" if model.class_embedding == "adm" else "class in the noise features")
    if model.attention_resolutions:
        parts.append(f"attention at {', '.join(f'{s}x{s}' for s in model.attention_resolutions)}")
    if model.prediction != "noise":
        parts.append(f"{model.prediction} prediction")
    if model.guidance_input:
        low, high = model.guidance_range
        parts.append(f"guidance scale ({low:g} to {high:g}) as an input")
    return ", ".join(parts) + f"; {parameters:,} parameters ({_megabytes(weights_bytes)})"


def facts(manifest) -> list[tuple[str, str]]:
    """``(label, text)`` rows of one bundled model: what ``ddim pretrained`` prints and docs/models.md shows."""
    model, record = manifest.config.model, manifest.record
    kind = f"class-conditional, {len(model.class_names)} classes" if model.class_conditional else "unconditional"
    rows = [("images", f"{model.image_size}x{model.image_size}, {kind}"),
            ("network", network_summary(manifest.config, manifest.parameters, manifest.bytes))]
    images = record.get("images_seen")
    trained = f"config {record.get('config')}"
    if isinstance(images, int):
        trained += f", {record.get('steps'):,} steps, {images:,} images seen"
    trained += f", on {record.get('hardware') or 'unrecorded hardware'}"
    rows.append(("trained", trained))
    if model.distilled_steps:
        teacher = record.get("distilled_from") or "an unrecorded teacher"
        rows.append(("distilled", f"from {teacher}; samples with {model.distilled_steps} deterministic DDIM steps "
                                  "of one network pass each, guidance included, and no other count"))
    if record.get("wall_time"):
        rows.append(("wall time", record["wall_time"]))
    for label in ("recipe", "data"):
        if record.get(label):
            rows.append((label, record[label]))
    defaults = default_setting(record)
    scored = bool(record.get("scores"))
    if record.get("defaults"):
        rows.append(("defaults", describe_setting(defaults)))
    if scored:
        for num in (FULL_NUM, QUICK_NUM):
            rows.append((f"FID / KID, {num:,} samples at the defaults", _figures(find_score(record, num, defaults))))
        accuracy = _class_accuracy(find_score(record, FULL_NUM, defaults)) or _class_accuracy(
            find_score(record, QUICK_NUM, defaults))
        if model.class_conditional:
            rows.append(("class accuracy at the defaults", accuracy or "not measured"))
        if defaults != PLAIN:
            plain = [f"{_figures(score)} ({num:,} samples)" for num in (FULL_NUM, QUICK_NUM)
                     if (score := find_score(record, num, PLAIN)) is not None]
            if plain:
                rows.append((f"FID / KID, {describe_setting(PLAIN)}", "; ".join(plain)))
    else:
        fid = record.get("fid")
        rows.append(("FID", f"{fid['value']:.2f} ({fid['protocol']})" if fid else "not measured"))
    for label in ("guidance", "advice"):
        if record.get(label):
            rows.append(("best guidance" if label == "guidance" else "sampler advice", record[label]))
    rows.append(("weights", f"{_megabytes(manifest.bytes)} in {manifest.weights_dtype}, sha256 {manifest.sha256}"))
    return rows


def describe(manifest) -> list[str]:
    """``ddim pretrained``'s lines for one bundled model (a :class:`~ddim.pretrained.bundle.Manifest`)."""
    model = manifest.config.model
    size = f"{model.image_size}x{model.image_size}"
    kind = f"class-conditional, {len(model.class_names)} classes" if model.class_conditional else "unconditional"
    lines = [f"{manifest.name}: {size} images, {kind}"]
    lines += [f"  {label}: {text}" for label, text in facts(manifest)[1:]]
    return lines


def protocol_lines(manifests) -> list[str]:
    """How the table's figures were measured, and the command that measures each (Markdown)."""
    real = {score.get("real_num") for manifest in manifests for score in manifest.record.get("scores") or ()}
    against = (f"all {real.pop():,} real images" if len(real) == 1 and None not in real else "all the real images")
    lines = [f"FID and KID: `ddim eval --split all`, the standard FID Inception against {against} at the "
             "model's size, seed 0, with the number of samples and the setting of each row. The command behind "
             "each figure:", ""]
    for manifest in manifests:
        record = manifest.record
        defaults = default_setting(record)
        for score in record.get("scores") or ():
            setting = {key: _value(score, key) for key in _SETTING}
            where = f"; raw line in `{score['source']}`" if score.get("source") else ""
            figure = _figures(score)
            lines.append(f"- `{manifest.name}`, {score['num']:,} samples, {describe_setting(setting)} ({figure}"
                         f"{where}): `{eval_command(manifest.name, score['num'], setting, defaults)}`")
    return lines


def markdown_table(manifests) -> str:
    """The bundled models as one Markdown table, a column per model (the first is the default), then how its
    figures were measured: what docs/models.md includes and ``ddim pretrained --markdown`` prints."""
    manifests = list(manifests)
    if not manifests:
        return "No model is bundled with this installation.\n"
    columns = [facts(manifest) for manifest in manifests]
    labels = list(dict.fromkeys(label for rows in columns for label, _ in rows))
    names = [f"`{m.name}`" + (" (the default)" if number == 0 else "") for number, m in enumerate(manifests)]
    lines = ["| | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(manifests)]
    for label in labels:
        cells = []
        for rows in columns:
            text = dict(rows).get(label, "")
            cells.append(f"`{text}`" if label == "recipe" and text else _escape(text))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + protocol_lines(manifests)) + "\n"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count / 1e3:.1f} kB"
