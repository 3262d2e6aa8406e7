"""The user guide's task pages are guides, not lab notebooks: short, and what to run first.

- **Short.** Each task page stays under 1,500 words of prose: whitespace-separated words of its Markdown outside
  fenced code blocks and outside the sections generated from the bundles' records (docs/models.md's table and
  details between ``<!-- NAME: the output of ... -->`` and ``<!-- end of NAME -->``, which
  tests/test_bundled_models.py keeps equal to ``ddim pretrained``'s output). Studies, long tables and their
  history belong in docs/research/.
- **What to run, first.** The first 25 lines of each hold a whole fenced code block with a ``ddim`` command (or
  Python that uses ddim).
- **No figure the records contradict.** Where a sentence of the README or a guide page (docs/research/ aside:
  its pages are dated studies of the models they name) names a bundled model and gives its best or default
  guidance scale ("at its defaults (20 ddim steps, guidance 2)", "scores best at guidance 1.5", "guidance 1.75
  (its default)") or its FID at its defaults ("FID 29.0 at its defaults"), the figure must be the one in the
  model's record, ``ddim/pretrained/NAME/model.json``: its ``defaults`` guidance, and an FID of its ``scores`` at
  that default setting (rounded to 1 or 2 decimals). "The bundled models" as a subject is every bundled model.
  The check reports what it found and checked, so a test can see that it did not pass for want of statements.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.markdown_blocks import MARKDOWN, markdown_blocks

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs"
SHORT_PAGES = ["models", "distillation", "finetuning", "training", "sampling", "own-images"]
MAX_WORDS = 1500
FIRST_SCREEN_LINES = 25
CHECKED_PAGES = [REPO / "README.md", *sorted(GUIDE.glob("*.md"))]  # not docs/research/
MIN_STATEMENTS = 20  # best or default figures the real pages state (32 today): fewer means the check went blind
MIN_BY_HAND = 4  # of them outside the sections generated from the records (5 today)

GENERATED = re.compile(r"<!-- ([\w-]+): the output of [^>]*-->.*?<!-- end of \1 -->", re.S)


def without_generated(text: str) -> str:
    """``text`` less the sections generated from the bundles' records (their lines kept, empty)."""
    return GENERATED.sub(lambda match: "\n" * match.group(0).count("\n"), text)


def prose_words(text: str) -> int:
    """The words of a Markdown page outside fenced code blocks and generated sections."""
    text = without_generated(text)
    lines = text.splitlines()
    for token in MARKDOWN.parse(text):
        if token.type in ("fence", "code_block") and token.map:
            start, end = token.map
            lines[start:end] = [""] * (end - start)
    return len(" ".join(lines).split())


def first_screen_has_a_command_block(text: str, lines: int = FIRST_SCREEN_LINES) -> bool:
    """Whether a whole fenced code block within the first ``lines`` lines shows a ddim command or ddim's Python."""
    for token in MARKDOWN.parse(text):
        if token.type == "fence" and token.map and token.map[1] <= lines:
            code = token.content
            if re.search(r"^\s*ddim\s", code, re.M) or re.search(r"\b(?:import ddim|from ddim)\b", code):
                return True
    return False


# --- short pages -----------------------------------------------------------------------------------------------


def test_the_word_count_leaves_out_code_and_generated_sections():
    page = ("# T\n\nOne two three.\n\n```bash\nddim sample --out a b c d e f\n```\n\n"
            "<!-- table: the output of `ddim pretrained` -->\n| a | b |\n| - | - |\n| c d e | f |\n"
            "<!-- end of table -->\n\n- four five\n")
    assert prose_words(page) == 2 + 3 + 3  # "# T", the sentence, "- four five": the Markdown, as written
    assert first_screen_has_a_command_block(page)
    assert not first_screen_has_a_command_block(page, lines=5)  # the block closes on line 7
    assert not first_screen_has_a_command_block("# T\n\n```\npip install x\n```\n")


@pytest.mark.parametrize("name", SHORT_PAGES)
def test_a_task_page_stays_short(name):
    words = prose_words((GUIDE / f"{name}.md").read_text(encoding="utf-8"))
    assert words < MAX_WORDS, (f"docs/{name}.md has {words} words of prose (at most {MAX_WORDS - 1}): keep the "
                               "guide's conclusion and a link, and move the study to docs/research/")


@pytest.mark.parametrize("name", SHORT_PAGES)
def test_a_task_page_says_what_to_run_in_its_first_screen(name):
    text = (GUIDE / f"{name}.md").read_text(encoding="utf-8")
    assert first_screen_has_a_command_block(text), (
        f"docs/{name}.md: no code block with a ddim command in its first {FIRST_SCREEN_LINES} lines")


# --- figures the records contradict -----------------------------------------------------------------------------


def bundled_records() -> dict[str, dict]:
    """Each bundled model's record, read from its ``model.json`` in the package."""
    return {path.parent.name: json.loads(path.read_text(encoding="utf-8"))["record"]
            for path in sorted((REPO / "ddim" / "pretrained").glob("*/model.json"))}


MODEL_NAME = r"(?<![\w/.:-]){}(?![\w.-])"  # flowers32, `flowers32`; not runs/flowers32, flowers32-noise, pretrained:x
ALL_MODELS = re.compile(r"\b(?:the|all|both|every|all four) bundled models?\b(?! of)", re.I)
NUMBER = r"(\d+(?:\.\d+)?)(?![.,]\d)"  # 1.75, 2; not the 1 of 1,000
DECIMAL = r"(\d+\.\d+)(?![.,]\d)"  # an FID is written with its decimals: 29.0, not the 20 of "20 steps"
KEYWORD = r"(?:best|default|defaults)"
# A guidance scale stated as best or default: the keyword just before it ("at its defaults (20 ddim steps,
# guidance 2)", "its default guidance 1.5", "best at guidance 1.5", "best at 1.5") or just after it ("guidance
# 1.75 (its default)", "guidance 1.5, their best scale"). "--guidance 2" is an option, not a claim.
GUIDANCE_CLAIMS = [
    re.compile(rf"\b{KEYWORD}\b[^.;]{{0,60}}?(?<![-\w])guidance(?: scale)?(?: of)? {NUMBER}\b"),
    re.compile(rf"(?<![-\w])guidance(?: scale)? {NUMBER}\b,? \(?(?:its|their|the) (?:\w+ )?{KEYWORD}\b"),
    re.compile(rf"\bbest guidance\W{{0,4}} {NUMBER}"),
    re.compile(rf"\bbest (?:scale )?at {NUMBER}\b(?! *(?:steps?|samples|passes|network|%|x\b|minutes))"),
]
# An FID stated as the model's at its defaults (or best): "FID 29.0 at its defaults", "at its defaults 29.0" in
# a sentence or table row about FID, "its best FID, 29.0".
FID_CLAIMS = [
    re.compile(rf"(?<![-\w])FID(?: of)? {DECIMAL}\b,? (?:at|with) (?:its|their|the) {KEYWORD}\b"),
    re.compile(rf"\b(?:at|with) (?:its|their) defaults?,? (?:FID )?{DECIMAL}\b"),
    re.compile(rf"\bbest FID,? (?:of )?{DECIMAL}\b"),
    re.compile(rf"\((?:its|their|the) {KEYWORD}\):? FID {DECIMAL}\b"),
]


@dataclass(frozen=True)
class Statement:
    page: str
    model: str  # a bundled model's name
    kind: str  # "guidance" or "FID"
    value: str
    text: str  # the sentence
    generated: bool  # in a section generated from the records (docs/models.md's table and details)


@dataclass(frozen=True)
class Sentence:
    text: str
    section: str  # the heading it is under
    generated: bool


def sentences(page: Path) -> list[Sentence]:
    """The sentences of ``page``'s paragraphs, list items and table rows (code left out), each with the heading
    it is under; a table row is one sentence of its cells, each after its column's header."""
    text = page.read_text(encoding="utf-8")
    generated_lines = {line for match in GENERATED.finditer(text)
                       for line in range(text.count("\n", 0, match.start()), text.count("\n", 0, match.end()) + 1)}
    found: list[Sentence] = []
    section = ""
    for block in markdown_blocks(text):
        generated = block.line in generated_lines
        if block.kind == "heading":
            section = _plain(block.text)
        elif block.kind == "row":
            cells = " | ".join(f"{_plain(name)}: {_plain(cell)}" for name, cell in zip(block.header, block.cells))
            found.append(Sentence(cells, section, generated))
        elif block.kind == "text":
            found += [Sentence(part, section, generated)
                      for part in re.split(r"(?<=[.!?])\s+(?=[A-Z`*\[(])", _plain(block.text))]
    return found


def _plain(content: str) -> str:
    """A link's text without its address, white space folded."""
    return re.sub(r"\s+", " ", re.sub(r"\]\([^)]*\)", "]", content))


def named(text: str, records: dict[str, dict]) -> list[tuple[int, str]]:
    """``(position, name)`` of each bundled model ``text`` names, in order."""
    return sorted((match.start(), name) for name in records
                  for match in re.finditer(MODEL_NAME.format(re.escape(name)), text))


def subject(sentence: Sentence, at: int, records: dict[str, dict]) -> list[str]:
    """The bundled models a figure at position ``at`` of a sentence is stated of: the nearest model named before
    it, else the first named after it, else every bundled model where the sentence says "the bundled models",
    else the one model its section's heading names (``### `flowers64` (the default)``); else none."""
    names = named(sentence.text, records)
    before = [name for start, name in names if start < at]
    if before:
        return [before[-1]]
    if names:
        return [names[0][1]]
    if ALL_MODELS.search(sentence.text):
        return sorted(records)
    heading = {name for _, name in named(sentence.section, records)}
    return sorted(heading) if len(heading) == 1 else []


def statements(page: Path, records: dict[str, dict]) -> list[Statement]:
    """Every best or default guidance scale and default FID ``page`` states of a bundled model."""
    found = []
    where = page.relative_to(REPO).as_posix() if REPO in page.parents else page.name
    for sentence in sentences(page):
        claims = [("guidance", pattern) for pattern in GUIDANCE_CLAIMS]
        if re.search(r"\bFID\b", sentence.text):
            claims += [("FID", pattern) for pattern in FID_CLAIMS]
        seen = set()
        for kind, pattern in claims:
            for match in pattern.finditer(sentence.text):
                if (kind, match.start(1)) in seen:
                    continue
                seen.add((kind, match.start(1)))
                models = subject(sentence, match.start(1), records)
                if kind == "FID" and len(models) > 1:
                    continue  # one FID is no figure of several models
                found += [Statement(where, model, kind, match.group(1), sentence.text, sentence.generated)
                          for model in models]
    return found


def default_fids(record: dict) -> set[str]:
    """The FIDs of a record's scores at its default setting, as the docs may round them."""
    setting = ("steps", "sampler", "spacing", "eta", "guidance")
    defaults = record["defaults"]
    return {f"{score['fid']:.{digits}f}" for score in record.get("scores") or ()
            if score.get("fid") is not None and all(score.get(key) == defaults.get(key) for key in setting)
            for digits in (1, 2)}


def contradicts(statement: Statement, records: dict[str, dict]) -> str | None:
    """Why ``statement`` disagrees with its model's record; None when it agrees."""
    record = records[statement.model]
    if statement.kind == "guidance":
        default = float(record["defaults"]["guidance"])
        if float(statement.value) != default:
            return f"guidance {statement.value} as {statement.model}'s best or default: its record says {default:g}"
        return None
    if statement.value not in default_fids(record):
        return (f"FID {statement.value} as {statement.model}'s at its defaults: its record's are "
                f"{sorted(default_fids(record)) or 'not measured'}")
    return None


def problems(pages: list[Path], records: dict[str, dict]) -> tuple[list[str], list[Statement]]:
    checked = [statement for page in pages for statement in statements(page, records)]
    wrong = [f"{s.page}: {why} ({s.text[:160]})" for s in checked if (why := contradicts(s, records))]
    return wrong, checked


def test_no_guide_states_a_best_or_default_figure_the_records_contradict():
    records = bundled_records()
    assert {"flowers64", "flowers32", "flowers32-noise", "flowers32-consistency"} <= set(records)
    wrong, checked = problems(CHECKED_PAGES, records)
    assert not wrong, "figures the bundled models' records contradict:\n" + "\n".join(wrong)
    # Not vacuous: the real pages state these figures, and the check found them, in the records' own sections
    # of docs/models.md and in the prose written by hand around the guide.
    found = [(s.page, s.model, s.kind, s.value) for s in checked]
    assert len(checked) >= MIN_STATEMENTS and {s.kind for s in checked} == {"guidance", "FID"}, found
    assert {s.model for s in checked} == set(records), found
    by_hand = [s for s in checked if not s.generated]
    assert len(by_hand) >= MIN_BY_HAND and {s.kind for s in by_hand} == {"guidance", "FID"}, found
    assert len({s.page for s in by_hand}) >= 3, found


def test_the_figure_check_catches_a_planted_wrong_figure(tmp_path):
    records = bundled_records()
    flowers64 = records["flowers64"]["defaults"]["guidance"]
    flowers32 = records["flowers32"]["defaults"]["guidance"]
    page = tmp_path / "page.md"
    page.write_text(
        "# A guide\n\n"
        f"*64 samples of `flowers64` at its defaults (20 ddim steps, guidance {flowers64 + 0.5:g}).*\n\n"
        f"`flowers32` scores best at guidance {flowers32:g}, and `flowers32-noise` scores FID 12.3 at its defaults.\n\n"
        "Scales drawn from 0 to 4 spend most of stage one above 2 (the bundled models score best at 1.5).\n\n"
        "```bash\nddim sample --pretrained flowers64 --guidance 3 --out x/   # best at guidance 3\n```\n\n"
        "| model | FID reached |\n| --- | --- |\n| `flowers64` | 12.3, and at its defaults 99.9 |\n",
        encoding="utf-8")
    wrong, checked = problems([page], records)
    assert sorted((s.model, s.kind, s.value) for s in checked) == sorted([
        ("flowers64", "guidance", f"{flowers64 + 0.5:g}"),
        ("flowers32", "guidance", f"{flowers32:g}"),
        ("flowers32-noise", "FID", "12.3"),
        *[(name, "guidance", "1.5") for name in records],
        ("flowers64", "FID", "99.9"),
    ])
    assert any(f"guidance {flowers64 + 0.5:g} as flowers64's" in line for line in wrong), wrong
    assert any("FID 12.3 as flowers32-noise's" in line for line in wrong), wrong
    assert any("FID 99.9 as flowers64's" in line for line in wrong), wrong
    # "the bundled models score best at 1.5" holds of no model whose default is another scale
    others = [name for name, record in records.items() if record["defaults"]["guidance"] != 1.5]
    assert others and all(any(f"guidance 1.5 as {name}'s" in line for line in wrong) for name in others), wrong
    assert not any(f"guidance {flowers32:g} as flowers32's" in line for line in wrong), wrong  # a true default
    assert len(wrong) == 3 + len(others), wrong
