"""How a bundled model was made and what it scores: its record, the one place these facts live.

``ddim pretrained export`` writes the training record: the step and config come
from the checkpoint, the images seen are ``step x`` the run's batch (``Config.step_batch_size``), the
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
    "sample_time": a line of ``benchmarks/cli_timing.py`` (``ddim sample --pretrained NAME --num 16``: the CPU and
                the wall seconds of runs in a row, the first compiling), with ``source``, its file under docs/results/
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import statistics
from pathlib import Path
from typing import Any

from ddim.config import Config
from ddim.errors import InputError
from ddim.pretrained.errors import PretrainedError
from ddim.spec import SamplingSpec
from ddim.workdir.layout import Workdir
from ddim.workdir.records import read_records

ORBAX_METADATA = "_CHECKPOINT_METADATA"  # orbax writes it into every step directory it commits


def training_record(config: Config, step: int, step_dir: Path, *, fid: dict[str, Any] | None,
                    hardware: str | None = None, recipe: str | None = None,
                    today: datetime.date | None = None) -> dict[str, Any]:
    """The record of a model exported from step ``step`` (directory ``step_dir``) of a run with ``config``."""
    batch_size = config.step_batch_size
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


PLAIN = {**SamplingSpec().to_dict(), "guidance": 1.0}
"""The setting of a model with no recorded defaults (a run of your own): :class:`ddim.spec.SamplingSpec`'s defaults
(20 deterministic DDIM steps on the uniform grid), guidance 1 (no guidance is the conditional prediction). Scores
at it compare a bundled model with such runs."""
QUICK_NUM, FULL_NUM = 1000, 5000
"""The two protocols: 1,000 samples (a quick look, minutes) and 5,000 (``ddim eval``'s default, the table's lead)."""
_SETTING = ("steps", "sampler", "spacing", "eta", "guidance")


def sampling_defaults(manifest):
    """The :class:`ddim.spec.SamplingSpec` a bundled model samples with by default: its record's ``"defaults"``
    (its best measured setting: steps, sampler, spacing, guidance), else None (the plain defaults)."""
    from ddim.spec import SpecError

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


def _short_setting(setting: dict[str, Any]) -> str:
    """``20 dpmpp-2m steps (logsnr), guidance 1.5``: a table cell."""
    text = f"{setting['steps']} {setting['sampler']} steps ({setting['spacing']})"
    if setting.get("eta"):
        text += f", eta {setting['eta']:g}"
    return text + f", guidance {setting['guidance']:g}"


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
    text = f"FID {score['fid']:.1f}"
    return text + (f", KID {score['kid']:.4f}" if score.get("kid") is not None else ", KID not measured")


def _class_accuracy(score: dict[str, Any] | None, *, samples: bool = True) -> str | None:
    if score is None or score.get("class_accuracy") is None:
        return None
    text = f"{100 * score['class_accuracy']:.1f} %" + (f" of {score['num']:,}" if samples else "")
    if score.get("real_class_accuracy") is not None:
        text += f" (real {100 * score['real_class_accuracy']:.1f} %)"
    return text


def describe_init(config: Config) -> str:
    """Where a fine-tuned model's first weights came from, in words (its ``[init]``)."""
    init = config.init
    learned = ", learning the source's own predictions" if init.targets == "source" else ""
    return (f"from {init.source} (its step {init.source_step:,}, weights sha256 {init.source_sha256[:16]}...)"
            f"{learned}")


def network_passes(model, setting: dict[str, Any]) -> int:
    """Network passes per image at ``setting``: one a step, two where guidance other than 1 needs the conditional
    and the unconditional prediction (:meth:`ddim.model.DiffusionModel.guided_outputs`), unless the network takes
    the scale as an input (a distilled student, ``model.guidance_input``)."""
    guidance = setting.get("guidance")
    guided = model.class_conditional and guidance is not None and guidance != 1.0 and not model.guidance_input
    return setting["steps"] * (2 if guided else 1)


def sample_time_from_line(line: dict[str, Any], source: str | None = None) -> dict[str, Any]:
    """A ``"sample_time"`` entry: one line of ``benchmarks/cli_timing.py`` (``source``: where it is kept), whole."""
    return {**line, "source": source}


def _timed_images(timing: dict[str, Any]) -> int | None:
    match = re.search(r"--num (\d+)", str(timing.get("command", "")))
    return int(match.group(1)) if match else None


def warm_seconds(timing: dict[str, Any]) -> float:
    """The wall seconds of a timed command once compiled: the median of the runs after the first (which starts
    with an empty compilation cache), or the one run there is."""
    seconds = timing["wall_seconds"]
    return statistics.median(seconds[1:] or seconds)


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


def facts(manifest) -> list[tuple[str, str | list[str]]]:
    """``(label, text)`` rows of one bundled model, how it was made and each figure measured of it with the
    command behind it (a list of lines): what ``ddim pretrained --details`` prints and docs/models.md shows."""
    model, record = manifest.config.model, manifest.record
    kind = f"class-conditional, {len(model.class_names)} classes" if model.takes_classes else "unconditional"
    rows: list[tuple[str, str | list[str]]] = [
        ("images", f"{model.image_size}x{model.image_size}, {kind}"),
        ("network", network_summary(manifest.config, manifest.parameters, manifest.bytes))]
    images = record.get("images_seen")
    trained = f"config {record.get('config')}"
    if isinstance(images, int):
        trained += f", {record.get('steps'):,} steps, {images:,} images seen"
    trained += f", on {record.get('hardware') or 'unrecorded hardware'}"
    rows.append(("trained", trained))
    if manifest.config.init.source:
        rows.append(("fine-tuned", describe_init(manifest.config)))
    if model.distilled_steps:
        teacher = record.get("distilled_from") or model.distilled_from or "an unrecorded teacher"
        counts = model.distilled_step_counts
        if model.distilled_sampler == "consistency":
            listed = " or ".join(filter(None, [", ".join(str(count) for count in counts[:-1]), str(counts[-1])]))
            how = (f"samples with {listed} steps of consistency sampling (by default {model.distilled_steps}), one "
                   "network pass each, guidance included")
        else:
            how = (f"samples with {model.distilled_steps} deterministic DDIM steps of one network pass each, "
                   "guidance included, and no other count")
        rows.append(("distilled", f"from {teacher}; {how}"))
    for label, field in (("wall time", "wall_time"), ("recipe", "recipe"), ("data", "data")):
        if record.get(field):
            rows.append((label, record[field]))
    defaults = default_setting(record)
    if record.get("defaults"):
        rows.append(("defaults", f"{describe_setting(defaults)}; {network_passes(model, defaults)} network passes"))
    for label in ("guidance", "advice"):
        if record.get(label):
            rows.append(("best guidance" if label == "guidance" else "sampler advice", record[label]))
    weights = f"{_megabytes(manifest.bytes)} in {manifest.weights_dtype}, sha256 {manifest.sha256}"
    if record.get("weights_note"):  # e.g. how storing them rounded moved the figures
        weights += f"; {record['weights_note']}"
    rows.append(("weights", weights))
    if record.get("scores"):
        rows.append(("figures", [_score_line(manifest.name, score, defaults, model.class_conditional)
                                 for score in record["scores"]]))
    else:
        fid = record.get("fid")
        rows.append(("FID", f"{fid['value']:.2f} ({fid['protocol']})" if fid else "not measured"))
    timing = record.get("sample_time")
    rows.append(("speed", _timing_line(timing) if timing else "not measured"))
    return rows


def _score_line(name: str, score: dict[str, Any], defaults: dict[str, Any], class_conditional: bool) -> str:
    """One measured figure in words, with the command that measures it and where its raw line is."""
    setting = {key: _value(score, key) for key in _SETTING}
    figures = _figures(score)
    accuracy = _class_accuracy(score, samples=False) if class_conditional else None
    if accuracy:
        figures += f", class accuracy {accuracy}"
    where = f" (raw line: {score['source']})" if score.get("source") else ""
    at = " (the defaults)" if setting == {key: defaults[key] for key in _SETTING} else ""
    return (f"{score['num']:,} samples, {describe_setting(setting)}{at}: {figures}; "
            f"`{eval_command(name, score['num'], setting, defaults)}`{where}")


def _timing_line(timing: dict[str, Any]) -> str:
    seconds = timing["wall_seconds"]
    text = f"{_timed_images(timing)} images in {warm_seconds(timing):.1f} s once compiled"
    if len(seconds) > 1:
        text += f", {seconds[0]:.1f} s the first time (compiling)"
    where = f"; raw line: {timing['source']}" if timing.get("source") else ""
    return (f"{text}, on a {timing.get('cpu')}: `{timing.get('command')}`, {len(seconds)} runs in a row "
            f"(measured {timing.get('measured')}{where})")


def describe(manifest) -> list[str]:
    """``ddim pretrained --details``'s lines for one bundled model (a :class:`~ddim.pretrained.bundle.Manifest`)."""
    model = manifest.config.model
    size = f"{model.image_size}x{model.image_size}"
    kind = f"class-conditional, {len(model.class_names)} classes" if model.takes_classes else "unconditional"
    lines = [f"{manifest.name}: {size} images, {kind}"]
    for label, text in facts(manifest)[1:]:
        if isinstance(text, list):
            lines += [f"  {label}:"] + [f"    - {line}" for line in text]
        else:
            lines.append(f"  {label}: {text}")
    return [line.replace("`", "") for line in lines]  # code spans are Markdown's


def details_markdown(manifests) -> str:
    """Each bundled model's facts as a Markdown section (the first is the default): what docs/models.md includes
    under its table and ``ddim pretrained --details --markdown`` prints."""
    sections = []
    for number, manifest in enumerate(manifests):
        lines = [f"### `{manifest.name}`" + (" (the default)" if number == 0 else ""), ""]
        for label, text in facts(manifest):
            if isinstance(text, list):
                lines.append(f"- **{label}**:")
                lines += [f"  - {_escape(line)}" for line in text]
            else:
                lines.append(f"- **{label}**: " + (f"`{text}`" if label == "recipe" else text))
        # A raw line's file is a link there (docs/models.md is beside docs/results/).
        text = re.sub(r"(?<![\w/])docs/(results/[\w.-]+\.jsonl)", r"[docs/\1](\1)", "\n".join(lines))
        sections.append(text + "\n")
    return "\n".join(sections)


TABLE_COLUMNS = ("model", "size", "classes", "default setting", "passes", "FID ({quick})", "FID ({full})",
                 "class accuracy ({quick})", "class accuracy ({full})", "s / {num} images", "MB")
NOT_MEASURED = "-"
"""A figure column's cell where the model's record has no figure of that column's sample count."""


def models_table(manifests) -> str:
    """The bundled models as one short table, a row per model (the first is the default), at each one's default
    setting, and what its figures are: what ``ddim pretrained`` prints and docs/models.md opens with. Every
    figure column is of one sample count, the same in every row (``-`` where a record lacks it); the notes name
    the CPU each row's seconds were measured on. The columns are padded, so it reads as plain text too."""
    manifests = list(manifests)
    if not manifests:
        return "No model is bundled with this installation.\n"
    timings = [m.record.get("sample_time") for m in manifests]
    nums = {_timed_images(timing) for timing in timings if timing}
    num = nums.pop() if len(nums) == 1 else "N"
    header = [column.format(num=num, quick=f"{QUICK_NUM:,}", full=f"{FULL_NUM:,}") for column in TABLE_COLUMNS]
    rows = [header]
    for number, manifest in enumerate(manifests):
        model, record = manifest.config.model, manifest.record
        defaults = default_setting(record)
        scores = [find_score(record, count, defaults) for count in (QUICK_NUM, FULL_NUM)]
        fids = [f"{score['fid']:.1f}" if score is not None and score.get("fid") is not None else
                "see --details" if not record.get("scores") and record.get("fid") else NOT_MEASURED
                for score in scores]
        accuracies = ["", ""]
        if model.class_conditional:
            accuracies = [_class_accuracy(score, samples=False) or NOT_MEASURED for score in scores]
        timing = record.get("sample_time")
        seconds = NOT_MEASURED
        if timing:
            seconds = f"{warm_seconds(timing):.1f}" + ("" if num != "N" else f" ({_timed_images(timing)} images)")
        rows.append([manifest.name + (" (default)" if number == 0 else ""),
                     f"{model.image_size}x{model.image_size}",
                     f"{len(model.class_names)}" if model.class_conditional else "none",
                     _short_setting(defaults), f"{network_passes(model, defaults)}", *fids, *accuracies, seconds,
                     f"{manifest.bytes / 1e6:.1f}"])
    widths = [max(len(_escape(row[column])) for row in rows) for column in range(len(TABLE_COLUMNS))]
    lines = ["| " + " | ".join(_escape(cell).ljust(width) for cell, width in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "| " + " | ".join("-" * width for width in widths) + " |")
    return "\n".join(lines + ["", *_table_notes(manifests, num)]) + "\n"


def _timing_cpus(manifests) -> str:
    """Where the table's seconds were measured: ``a 2-core AMD EPYC``, or with rows on several CPUs each CPU and
    its rows (``a 2-core AMD EPYC (flowers64, flowers32-4step) and ...``)."""
    rows: dict[str, list[str]] = {}
    for manifest in manifests:
        timing = manifest.record.get("sample_time")
        if timing:
            rows.setdefault(timing.get("cpu") or "CPU not recorded", []).append(manifest.name)
    if len(rows) <= 1:
        return f"a {next(iter(rows))}" if rows else "a CPU"
    named = [f"a {cpu} ({', '.join(names)})" for cpu, names in rows.items()]
    return ", ".join(named[:-1]) + f" and {named[-1]}: compare seconds on one CPU only"


def _table_notes(manifests, num) -> list[str]:
    """What the table's figures are, in words, from the records (a paragraph of one line per sentence)."""
    scores = [score for manifest in manifests for score in manifest.record.get("scores") or ()]
    real = {score.get("real_num") for score in scores}
    against = f"all {real.pop():,} real images" if len(real) == 1 and None not in real else "all the real images"
    return [f"Each model at its default setting, seed 0; passes: network passes per image. FID and class accuracy "
            f"of {QUICK_NUM:,} and of {FULL_NUM:,} samples, as each column's heading says ({NOT_MEASURED}: not "
            f"measured): `ddim eval --split all`, the standard FID Inception against {against} at the model's size. "
            "Class accuracy: how often a classifier on the FID features "
            "finds the asked class in the samples, with its accuracy on real validation images in brackets. "
            "Seconds: the whole command `ddim sample --pretrained NAME "
            f"--num {num} --out DIR` once compiled, on {_timing_cpus(manifests)}. How each was trained, every "
            "figure measured of it and the command behind each: `ddim pretrained --details`."]


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count / 1e3:.1f} kB"
