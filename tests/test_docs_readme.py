"""The README as a front page, and what the docs state that another file must agree with.

README.md stays short (its detail belongs in the user guide, docs/); its test command is the one ``.ci/run``
runs, copied verbatim; its ``ddim`` commands, run one after another, each write to a folder of their own; and
docs/sampling.md states the plain sampling setting as :class:`ddim.spec.SamplingSpec` has it.
"""

from __future__ import annotations

import re
import shlex

from tests.docs_helpers import GUIDE, README, REPO, shown_commands
from tests.markdown_blocks import MARKDOWN

FRONT_PAGE_MAX_LINES = 250


def test_the_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= FRONT_PAGE_MAX_LINES, f"README.md has {lines} lines; move detail into the user guide (docs/)"


def test_the_readme_test_command_is_the_one_ci_runs():
    """.ci/run runs the README's test command, copied verbatim under a marker comment: they must not drift."""
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    marker = ci.index("# The README's test command, verbatim:")
    command = ci[marker + 1].strip()
    blocks = [token.content for token in MARKDOWN.parse(README.read_text(encoding="utf-8")) if token.type == "fence"]
    assert any(command in block.splitlines() for block in blocks), f"README.md has no code line {command!r}"


def test_the_readme_commands_each_write_to_their_own_folder():
    """Run one after another in a fresh directory, no README command stops on another's output."""
    outs = [words[words.index("--out") + 1] for command in shown_commands(README)
            if "--out" in (words := shlex.split(command, comments=True))]
    assert outs and len(outs) == len(set(outs)), f"README commands share an --out folder: {outs}"


def test_the_guide_states_the_plain_setting_as_the_code_has_it():
    """What a model with no measured best setting samples with is said once, in docs/sampling.md, as
    :class:`ddim.spec.SamplingSpec`'s defaults (guidance 1: no guidance)."""
    from ddim.spec import SamplingSpec

    plain = SamplingSpec()
    text = re.sub(r"\s+", " ", (GUIDE / "sampling.md").read_text(encoding="utf-8"))
    assert f"{plain.steps} steps of `{plain.sampler}` on the `{plain.spacing}` grid, guidance 1" in text
