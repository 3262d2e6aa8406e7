"""The bundled models' records in words: ``ddim pretrained``'s table (:func:`models_table`), ``--details``
(:func:`describe`) and its Markdown (:func:`details_markdown`), what docs/models.md shows.

Each reads a :class:`~ddim.pretrained.bundle.Manifest`'s record as a
:class:`~ddim.pretrained.bundle_record.BundleRecord` and writes nothing that is not in it or in the config.
"""

from __future__ import annotations

import re
import statistics
from typing import Any, Mapping

from ddim.config import Config
from ddim.pretrained.bundle_record import SETTING_KEYS, BundleRecord, Score
from ddim.spec import SamplingSpec, guidance_scale

QUICK_NUM, FULL_NUM = 1000, 5000
"""The two protocols: 1,000 samples (a quick look, minutes) and 5,000 (``ddim eval``'s default, the table's lead)."""
TABLE_COLUMNS = ("model", "size", "classes", "default setting", "passes", "FID ({quick})", "FID ({full})",
                 "class accuracy ({quick})", "class accuracy ({full})", "s / {num} images", "MB")
NOT_MEASURED = "-"
"""A figure column's cell where the model's record has no figure of that column's sample count."""


def _short_setting(setting: SamplingSpec) -> str:
    """``20 dpmpp-2m steps (logsnr), guidance 1.5``: a table cell."""
    text = f"{setting.steps} {setting.sampler} steps ({setting.spacing})"
    if setting.eta:
        text += f", eta {setting.eta:g}"
    return text + f", guidance {guidance_scale(setting.guidance):g}"


def describe_setting(setting: SamplingSpec) -> str:
    """``20 steps of dpmpp-2m (logsnr grid), guidance 1.5``."""
    text = f"{setting.steps} step{'' if setting.steps == 1 else 's'} of {setting.sampler} ({setting.spacing} grid)"
    if setting.eta:
        text += f", eta {setting.eta:g}"
    return text + f", guidance {guidance_scale(setting.guidance):g}"


def eval_command(name: str, num: int, setting: SamplingSpec, defaults: SamplingSpec) -> str:
    """The ``ddim eval`` command that measures ``num`` samples of the bundled model ``name`` at ``setting``."""
    values = [(key, getattr(setting, key)) for key in SETTING_KEYS if getattr(setting, key) != getattr(defaults, key)]
    options = [f"--{key} {value:g}" if isinstance(value, float) else f"--{key} {value}" for key, value in values]
    return " ".join([f"ddim eval --pretrained {name} --num {num} --split all", *options])


def _figures(score: Score | None) -> str:
    if score is None or score.fid is None:
        return "not measured"
    text = f"FID {score.fid:.1f}"
    return text + (f", KID {score.kid:.4f}" if score.kid is not None else ", KID not measured")


def _class_accuracy(score: Score | None, *, samples: bool = True) -> str | None:
    if score is None or score.class_accuracy is None:
        return None
    text = f"{100 * score.class_accuracy:.1f} %" + (f" of {score.num:,}" if samples else "")
    if score.real_class_accuracy is not None:
        text += f" (real {100 * score.real_class_accuracy:.1f} %)"
    return text


def describe_init(config: Config) -> str:
    """Where a fine-tuned model's first weights came from, in words (its ``[init]``)."""
    init = config.init
    learned = ", learning the source's own predictions" if init.targets == "source" else ""
    return (f"from {init.source} (its step {init.source_step:,}, weights sha256 {init.source_sha256[:16]}...)"
            f"{learned}")


def network_passes(model, setting: SamplingSpec) -> int:
    """Network passes per image at ``setting``: one a step, two where guidance other than 1 needs the conditional
    and the unconditional prediction (:meth:`ddim.model.DiffusionModel.guided_outputs`), unless the network takes
    the scale as an input (a distilled student, ``model.guidance_input``)."""
    guided = model.class_conditional and guidance_scale(setting.guidance) != 1.0 and not model.guidance_input
    return setting.steps * (2 if guided else 1)


def _timed_images(timing: Mapping[str, Any]) -> int | None:
    match = re.search(r"--num (\d+)", str(timing.get("command", "")))
    return int(match.group(1)) if match else None


def warm_seconds(timing: Mapping[str, Any]) -> float:
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


def _kind(model) -> str:
    return f"class-conditional, {len(model.class_names)} classes" if model.takes_classes else "unconditional"


def facts(manifest) -> list[tuple[str, str | list[str]]]:
    """``(label, text)`` rows of one bundled model, how it was made and each figure measured of it with the
    command behind it (a list of lines): what ``ddim pretrained --details`` prints and docs/models.md shows."""
    model, record = manifest.config.model, BundleRecord.from_dict(manifest.record)
    rows: list[tuple[str, str | list[str]]] = [
        ("images", f"{model.image_size}x{model.image_size}, {_kind(model)}"),
        ("network", network_summary(manifest.config, manifest.parameters, manifest.bytes)),
        ("trained", _trained(record))]
    if manifest.config.init.source and not model.distilled_steps:  # a student's [init] is its teacher's history
        rows.append(("fine-tuned", describe_init(manifest.config)))
    if model.distilled_steps:
        rows.append(("distilled", _distilled(model, record)))
    rows += [(label, text) for label, text in (("wall time", record.wall_time), ("recipe", record.recipe),
                                               ("data", record.data)) if text]
    defaults = record.default_setting
    if record.defaults:
        rows.append(("defaults", f"{describe_setting(defaults)}; {network_passes(model, defaults)} network passes"))
    rows += [(label, text) for label, text in (("best guidance", record.guidance), ("sampler advice", record.advice))
             if text]
    weights = f"{_megabytes(manifest.bytes)} in {manifest.weights_dtype}, sha256 {manifest.sha256}"
    if record.weights_note:  # e.g. how storing them rounded moved the figures
        weights += f"; {record.weights_note}"
    rows.append(("weights", weights))
    if record.scores:
        rows.append(("figures", [_score_line(manifest.name, score, defaults, model.class_conditional)
                                 for score in record.scores]))
    else:
        fid = record.fid
        rows.append(("FID", f"{fid['value']:.2f} ({fid['protocol']})" if fid else "not measured"))
    rows.append(("speed", _timing_line(record.sample_time) if record.sample_time else "not measured"))
    return rows


def _trained(record: BundleRecord) -> str:
    trained = f"config {record.config}"
    if isinstance(record.images_seen, int):
        trained += f", {record.steps:,} steps, {record.images_seen:,} images seen"
    return trained + f", on {record.hardware or 'unrecorded hardware'}"


def _distilled(model, record: BundleRecord) -> str:
    teacher = record.distilled_from or model.distilled_from or "an unrecorded teacher"
    counts = model.distilled_step_counts
    if model.distilled_sampler == "consistency":
        listed = " or ".join(filter(None, [", ".join(str(count) for count in counts[:-1]), str(counts[-1])]))
        default = record.default_setting.steps if record.defaults else model.distilled_steps
        how = (f"samples with {listed} steps of consistency sampling (by default {default}), one "
               "network pass each, guidance included")
    else:
        how = (f"samples with {model.distilled_steps} DDIM steps of one network pass each, guidance included, "
               "and no other count")
    return f"from {teacher}; {how}"


def _score_line(name: str, score: Score, defaults: SamplingSpec, class_conditional: bool) -> str:
    """One measured figure in words, with the command that measures it and where its raw line is."""
    setting = score.setting
    figures = _figures(score)
    accuracy = _class_accuracy(score, samples=False) if class_conditional else None
    if accuracy:
        figures += f", class accuracy {accuracy}"
    where = f" (raw line: {score.source})" if score.source else ""
    at = " (the defaults)" if setting == defaults else ""
    return (f"{score.num:,} samples, {describe_setting(setting)}{at}: {figures}; "
            f"`{eval_command(name, score.num, setting, defaults)}`{where}")


def _timing_line(timing: Mapping[str, Any]) -> str:
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
    lines = [f"{manifest.name}: {model.image_size}x{model.image_size} images, {_kind(model)}"]
    for label, text in facts(manifest)[1:]:
        if isinstance(text, list):
            lines += [f"  {label}:"] + [f"    - {line}" for line in text]
        else:
            lines.append(f"  {label}: {text}")
    return [line.replace("`", "") for line in lines]  # code spans are Markdown's


def recipe_markdown(recipe: str) -> str:
    """A recipe as code; one of the repository's benchmarks or tools says that it runs from a clone of the
    repository."""
    where = " (from a clone of the repository)" if recipe.startswith(("python -m benchmarks.", "python tools/")) else ""
    return f"`{recipe}`{where}"


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
                lines.append(f"- **{label}**: " + (recipe_markdown(text) if label == "recipe" else text))
        # A raw line's file is a link there (docs/models.md is beside docs/results/).
        text = re.sub(r"(?<![\w/])docs/(results/[\w.-]+\.jsonl)", r"[docs/\1](\1)", "\n".join(lines))
        sections.append(text + "\n")
    return "\n".join(sections)


def models_table(manifests) -> str:
    """The bundled models as one short table, a row per model (the first is the default), at each one's default
    setting, and what its figures are: what ``ddim pretrained`` prints and docs/models.md opens with. Every
    figure column is of one sample count, the same in every row (``-`` where a record lacks it); the notes name
    the CPU each row's seconds were measured on. The columns are padded, so it reads as plain text too."""
    manifests = list(manifests)
    if not manifests:
        return "No model is bundled with this installation.\n"
    records = [BundleRecord.from_dict(manifest.record) for manifest in manifests]
    nums = {_timed_images(record.sample_time) for record in records if record.sample_time}
    num = nums.pop() if len(nums) == 1 else "N"
    header = [column.format(num=num, quick=f"{QUICK_NUM:,}", full=f"{FULL_NUM:,}") for column in TABLE_COLUMNS]
    rows = [header] + [_table_row(manifest, record, num, number == 0)
                       for number, (manifest, record) in enumerate(zip(manifests, records))]
    widths = [max(len(_escape(row[column])) for row in rows) for column in range(len(TABLE_COLUMNS))]
    lines = ["| " + " | ".join(_escape(cell).ljust(width) for cell, width in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "| " + " | ".join("-" * width for width in widths) + " |")
    return "\n".join(lines + ["", *_table_notes(manifests, records, num)]) + "\n"


def _table_row(manifest, record: BundleRecord, num: int | str, default: bool) -> list[str]:
    """One model's cells (``num``: the images every row's seconds are of, or ``N`` where they differ)."""
    model = manifest.config.model
    defaults = record.default_setting
    scores = [record.find_score(count, defaults) for count in (QUICK_NUM, FULL_NUM)]
    fids = [f"{score.fid:.1f}" if score is not None and score.fid is not None else
            "see --details" if not record.scores and record.fid else NOT_MEASURED
            for score in scores]
    accuracies = ["", ""]
    if model.class_conditional:
        accuracies = [_class_accuracy(score, samples=False) or NOT_MEASURED for score in scores]
    timing = record.sample_time
    seconds = NOT_MEASURED
    if timing:
        seconds = f"{warm_seconds(timing):.1f}" + ("" if num != "N" else f" ({_timed_images(timing)} images)")
    return [manifest.name + (" (default)" if default else ""), f"{model.image_size}x{model.image_size}",
            f"{len(model.class_names)}" if model.class_conditional else "none",
            _short_setting(defaults), f"{network_passes(model, defaults)}", *fids, *accuracies, seconds,
            f"{manifest.bytes / 1e6:.1f}"]


def _timing_cpus(manifests, records: list[BundleRecord]) -> str:
    """Where the table's seconds were measured: ``a 2-core AMD EPYC``, or with rows on several CPUs each CPU and
    its rows (``a 2-core AMD EPYC (flowers64, flowers32-consistency) and ...``)."""
    rows: dict[str, list[str]] = {}
    for manifest, record in zip(manifests, records):
        if record.sample_time:
            rows.setdefault(record.sample_time.get("cpu") or "CPU not recorded", []).append(manifest.name)
    if len(rows) <= 1:
        return f"a {next(iter(rows))}" if rows else "a CPU"
    named = [f"a {cpu} ({', '.join(names)})" for cpu, names in rows.items()]
    return ", ".join(named[:-1]) + f" and {named[-1]}: compare seconds on one CPU only"


def _table_notes(manifests, records: list[BundleRecord], num) -> list[str]:
    """What the table's figures are, in words, from the records (a paragraph of one line per sentence)."""
    real = {score.real_num for record in records for score in record.scores or ()}
    against = f"all {real.pop():,} real images" if len(real) == 1 and None not in real else "all the real images"
    return [f"Each model at its default setting, seed 0; passes: network passes per image. FID and class accuracy "
            f"of {QUICK_NUM:,} and of {FULL_NUM:,} samples, as each column's heading says ({NOT_MEASURED}: not "
            f"measured): `ddim eval --split all`, the standard FID Inception against {against} at the model's size. "
            "Class accuracy: how often a classifier on the FID features "
            "finds the asked class in the samples, with its accuracy on real validation images in brackets. "
            "Seconds: the whole command `ddim sample --pretrained NAME "
            f"--num {num} --out DIR` once compiled, on {_timing_cpus(manifests, records)}. How each was trained, "
            "every figure measured of it and the command behind each: `ddim pretrained --details`."]


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count / 1e3:.1f} kB"
