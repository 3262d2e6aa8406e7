"""The bundled models' facts live in their records: the docs show them, and never disagree with them.

docs/models.md includes the table ``ddim pretrained`` prints from the records, and docs/model-cards.md the details
``ddim pretrained --details --markdown`` prints, verbatim; a record's figures are lines of the files under docs/results/ it names,
not typed in. Every other
page of the user guide (the research record aside: its pages are dated studies of the models they name) may
quote a bundled model's FID, KID or class accuracy only as one of the figures in that model's record. The check
reads each paragraph, list item and table row on its own: where it names a bundled model, every decimal number
after "FID", "KID" or "class accuracy" (and "the asked class in") must be a figure of that model's record, as
the record rounds it or to one more digit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ddim.pretrained import PACKAGE_ROOT, available
from ddim.pretrained.render import details_markdown, models_table
from tests.markdown_blocks import markdown_blocks

REPO = Path(__file__).resolve().parents[1]
MODELS_PAGE = REPO / "docs" / "models.md"
CARDS_PAGE = REPO / "docs" / "model-cards.md"
TABLE = ("<!-- bundled-models:", "<!-- end of bundled-models -->")
DETAILS = ("<!-- bundled-model-details:", "<!-- end of bundled-model-details -->")
GUIDES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MODEL_NAME = r"(?<![\w/.:-]){}(?![\w.-])"  # flowers32, `flowers32`, pretrained:flowers32; not runs/flowers32 or flowers64-fast
FIGURE = re.compile(r"\b(?:FID|KID|class accuracy|asked class in)\b[^.\d|]{0,16}?(\d+\.\d+)")
FIGURE_COLUMN = re.compile(r"\b(?:FID|KID|class accuracy)\b")


@pytest.fixture(autouse=True)
def package_models(monkeypatch):
    monkeypatch.delenv("DDIM_PRETRAINED_DIR", raising=False)


def shipped() -> dict:
    return {manifest.name: manifest for manifest in available(PACKAGE_ROOT)}


def recorded_figures(record: dict) -> set[str]:
    """Every figure of a record as the docs may write it: scores rounded as the table rounds them (and one digit
    finer), and the numbers its sentences quote."""
    figures = set()
    for score in record.get("scores") or ():
        for key, digits in (("fid", (1, 2)), ("kid", (4, 3)), ("class_accuracy", (1,)), ("real_class_accuracy", (1,))):
            value = score.get(key)
            if value is None:
                continue
            value = 100 * value if "class" in key else value
            figures.update(f"{value:.{n}f}" for n in digits)
    words = " ".join(str(record.get(field) or "") for field in ("guidance", "advice", "wall_time"))
    figures.update(re.findall(r"\d+\.\d+", words))
    return figures


def blocks(page: Path):
    """``(text, figures)`` of each paragraph, list item and table row of ``page`` (code blocks left out): the
    figures are the decimals after "FID", "KID" or "class accuracy", and in a table every decimal of a column
    whose header names one of them."""
    for block in markdown_blocks(page.read_text(encoding="utf-8")):
        columns = [FIGURE_COLUMN.search(name) is not None for name in block.header]
        numbers = [n for cell, figure in zip(block.cells, columns) if figure for n in re.findall(r"\d+\.\d+", cell)]
        yield block.text, [match.group(1) for match in FIGURE.finditer(block.text)] + numbers


def between(text: str, markers: tuple[str, str]) -> str:
    """The lines of ``text`` between a begin marker's line and its end marker."""
    begin, end = markers
    start = text.index("\n", text.index(begin)) + 1
    return text[start:text.index(end)]


def test_the_models_pages_show_the_table_and_the_details_the_records_print():
    models = shipped().values()
    assert between(MODELS_PAGE.read_text(encoding="utf-8"), TABLE) == models_table(models), (
        "docs/models.md's table differs from the records: paste the output of `ddim pretrained` between its markers")
    assert between(CARDS_PAGE.read_text(encoding="utf-8"), DETAILS) == details_markdown(models), (
        "docs/model-cards.md's details differ from the records: paste the output of `ddim pretrained --details "
        "--markdown` between their markers")


def raw_lines(source: str) -> list[dict]:
    return [json.loads(line) for line in (REPO / source).read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize("name", sorted(shipped()))
def test_a_records_figures_are_lines_of_the_files_it_names(name):
    """Every measured FID is that of a line of the same number of samples in its ``source`` (the files differ in
    format: ``ddim eval``'s and ``benchmarks.release.fid_of_samples``'s), and the sampling time a line of
    ``benchmarks.speed.cli_timing``'s, whole: nothing in the table is typed in."""
    from ddim.pretrained.scores import sample_time_from_line

    record = shipped()[name].record
    for score in record["scores"]:
        if score["fid"] is None:
            assert score["source"] is None, f"{name}: an unmeasured score names no raw line"
            continue
        measured = {(line.get("num"), line.get("fid")) for line in raw_lines(score["source"])}
        assert (score["num"], score["fid"]) in measured, f"{name}: FID {score['fid']}: no line of {score['source']}"
    timing = record["sample_time"]
    made = [sample_time_from_line(line, timing["source"]) for line in raw_lines(timing["source"])]
    assert timing in made and f"--pretrained {name} " in timing["command"], timing


@pytest.mark.parametrize("page", GUIDES,
                         ids=lambda page: page.relative_to(REPO).as_posix())
def test_a_guide_quotes_a_bundled_models_figures_as_its_record_has_them(page):
    models = shipped()
    figures = {name: recorded_figures(manifest.record) for name, manifest in models.items()}
    problems = []
    for block, quoted in blocks(page):
        named = [name for name in models if re.search(MODEL_NAME.format(re.escape(name)), block)]
        if not named:
            continue
        allowed = set().union(*(figures[name] for name in named))
        problems += [f"{figure} beside {', '.join(named)}: not in the record ({block[:120]}...)"
                     for figure in quoted if figure not in allowed]
    assert not problems, f"{page.relative_to(REPO)} quotes figures its bundled models' records do not hold:\n" + \
        "\n".join(problems)


def test_the_check_catches_a_figure_the_record_does_not_hold(tmp_path):
    record = json.loads((PACKAGE_ROOT / "flowers32-noise" / "model.json").read_text())["record"]
    figures = recorded_figures(record)
    assert {"29.3", "19.6", "0.0070", "76.2", "30.6"} <= figures  # the table's, and its guidance sentence's
    page = tmp_path / "page.md"
    page.write_text("`flowers32-noise` scores FID 33.0 at its defaults.\n\n| model | FID |\n| --- | --- |\n"
                    "| `flowers64` | 39.2 (40.4 at 5,000) |\n")
    found = [figure for _, quoted in blocks(page) for figure in quoted]
    assert found == ["33.0", "39.2", "40.4"] and "33.0" not in figures
    assert not re.search(MODEL_NAME.format("flowers64"), "ddim/configs/flowers64-fast.toml and runs/flowers64")
