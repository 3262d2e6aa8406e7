"""What a measurement adds to a bundled model's record: a ``ddim eval`` line as a :class:`Score`, merged in place
of the score of the same samples and setting, and a ``benchmarks.speed.cli_timing`` line as its ``sample_time``.

``benchmarks.release.rebuild`` writes a rebuilt bundle's record with these; a measurement made by hand goes in the
same way (``with_score(record, score_from_eval(line, source))``).
"""

from __future__ import annotations

from typing import Any, Mapping

from ddim.pretrained.bundle_record import BundleRecord, Score, setting_of, setting_values


def score_from_eval(line: Mapping[str, Any], source: str | None = None) -> Score:
    """The score of one ``eval.jsonl`` line of ``ddim eval --split all`` (``source``: where the line is kept)."""
    return Score.from_dict({
        "num": line["num"], **setting_values(setting_of(line)),
        "seed": line.get("seed", 0), "split": line.get("split"), "real_num": line.get("real_num"),
        "fid": line.get("fid"), "kid": line.get("kid_mean"), "class_accuracy": line.get("class_accuracy"),
        "real_class_accuracy": line.get("real_val_class_accuracy"), "source": source,
        "measured": str(line.get("time", ""))[:10] or None,
    })


def with_score(record: BundleRecord, score: Score) -> BundleRecord:
    """``record`` with ``score`` among its scores, in place of the score of the same samples and setting."""
    def same(entry: Score) -> bool:
        return entry.num == score.num and entry.setting == score.setting

    scores = tuple(record.scores or ())
    if any(same(entry) for entry in scores):
        return record.replace(scores=tuple(score if same(entry) else entry for entry in scores))
    return record.replace(scores=(*scores, score))


def sample_time_from_line(line: Mapping[str, Any], source: str | None = None) -> dict[str, Any]:
    """A record's ``sample_time``: one line of ``benchmarks.speed.cli_timing`` (``source``: where it is kept), whole."""
    return {**line, "source": source}
