"""A bundled model's record as types: every shipped record read and written again is the same JSON, and a setting
is read from a record (or an ``eval.jsonl`` line) and written to one in one place."""

from __future__ import annotations

import json

import pytest

from ddim.pretrained import PACKAGE_ROOT
from ddim.pretrained.bundle_record import PLAIN, BundleRecord, Score, setting_of, setting_values
from ddim.pretrained.scores import score_from_eval, with_score
from ddim.spec import SamplingSpec, guidance_scale

MANIFESTS = sorted(PACKAGE_ROOT.glob("*/model.json"))


def test_the_package_ships_records_to_check():
    assert len(MANIFESTS) >= 4


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.parent.name)
def test_every_shipped_record_reads_and_writes_back_exactly(path):
    text = path.read_text(encoding="utf-8")
    manifest = json.loads(text)
    record = BundleRecord.from_dict(manifest["record"])
    assert record.to_dict() == manifest["record"]
    assert all(isinstance(score, Score) for score in record.scores or ())
    # The same keys in the same order, down to the scores: the file written again is the same bytes.
    assert json.dumps({**manifest, "record": record.to_dict()}, indent=2) + "\n" == text


def test_keys_no_field_names_and_nulls_are_kept_and_a_new_key_goes_last():
    values = {"steps": 3, "fid": None, "someday": {"a": 1}, "scores": [{"num": 8, "fid": 1.5, "note": "x"}]}
    record = BundleRecord.from_dict(values)
    assert record.extra == {"someday": {"a": 1}} and record.fid is None and record.scores[0].extra == {"note": "x"}
    assert list(record.to_dict()) == ["steps", "fid", "someday", "scores"] and record.to_dict() == values
    changed = record.replace(wall_time="1 h", steps=4, words="w")
    assert list(changed.to_dict()) == ["steps", "fid", "someday", "scores", "wall_time", "words"]
    assert changed.steps == 4 and changed.extra["words"] == "w"


def test_no_guidance_is_a_scale_of_1_in_a_record_and_nowhere_else():
    assert guidance_scale(None) == 1.0 and guidance_scale(2) == 2.0
    assert setting_of({"steps": 20, "guidance": None}) == setting_of({"guidance": 1}) == PLAIN
    assert setting_of({}) == SamplingSpec(guidance=1.0)
    written = setting_values(SamplingSpec(steps=4, sampler="dpmpp-2m", spacing="logsnr"))
    assert written == {"steps": 4, "sampler": "dpmpp-2m", "spacing": "logsnr", "eta": 0.0, "guidance": 1.0}
    # What a bundle samples with is its defaults as written: a model without classes takes no scale at all.
    assert BundleRecord.from_dict({"defaults": {"steps": 4, "guidance": None}}).sampling_spec("m").guidance is None
    assert BundleRecord.from_dict({}).sampling_spec("m") is None


def test_defaults_written_are_read_back_as_the_spec_written():
    spec = SamplingSpec(steps=12, sampler="dpmpp-2m", spacing="karras", guidance=1.75)
    record = BundleRecord.from_dict({"config": "c"}).with_defaults(spec)
    assert record.sampling_spec("m") == spec == record.default_setting
    assert list(record.to_dict()) == ["config", "defaults"] and record.best_guidance(True) == 1.75
    assert record.best_guidance(False) is None and BundleRecord().default_setting == PLAIN


def test_a_new_score_replaces_the_one_of_the_same_samples_and_setting():
    line = {"num": 1000, "steps": 20, "guidance": 1.0, "fid": 30.0, "kid_mean": 0.01, "time": "2026-01-02T03:04"}
    first = score_from_eval(line, "docs/results/a.jsonl")
    assert list(first.to_dict())[:6] == ["num", "steps", "sampler", "spacing", "eta", "guidance"]
    assert (first.kid, first.measured, first.setting) == (0.01, "2026-01-02", PLAIN)
    record = with_score(BundleRecord.from_dict({"config": "c"}), first)
    unguided = score_from_eval({**line, "guidance": None, "fid": 29.0})  # no guidance: the same setting
    again = with_score(record, unguided)
    assert [score.fid for score in again.scores] == [29.0]
    other = with_score(again, score_from_eval({**line, "guidance": 2.0}))
    assert [score.fid for score in other.scores] == [29.0, 30.0]
    assert other.find_score(1000, PLAIN).fid == 29.0 and other.find_score(5000, PLAIN) is None
