"""The README's and the guides' examples run as written, from a fresh clone's root.

Every ``ddim`` command of a code block and every Python block of README.md and docs/*.md that needs no
training run of the reader's, no download and no server runs here, as the page shows it, in a fresh directory
that holds only ``docs/examples/`` (the example inputs shipped with the repository), in the order of the page.
The commands run in this process (the CLI's own entry point, ``ddim.cli.app``), so they share its compiled
programs. What is left out, and why, is :func:`why_not_run`'s: commands that train (hours), serve (until
stopped), score FID (the FID Inception's weights and Oxford Flowers, minutes to hours) or read a run, a folder
or a value the reader fills in. Sampling takes seconds a command on a CPU, so those cases are slow; the
default run checks that what the examples read exists and that each Python block defines what it uses.
"""

from __future__ import annotations

import ast
import builtins
import io
import re
import shlex
import tokenize
from pathlib import Path

import pytest

from tests.docs_helpers import PLACEHOLDER, REPO, block_commands
from tests.markdown_blocks import MARKDOWN

EXAMPLES = REPO / "docs" / "examples"
GUIDES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # the research record's commands are its record
SAMPLING_VERBS = {"sample", "invert", "reconstruct", "interpolate", "edit", "inpaint"}
INPUT_SUFFIXES = (".jpg", ".jpeg", ".png", ".npz", ".toml")


def why_not_run(command: str) -> str | None:
    """Why a ``ddim`` command of the docs is not run here, or None when it runs as written."""
    words = shlex.split(command, comments=True)[1:]
    if any(PLACEHOLDER.fullmatch(word) for word in words):
        return "a value the reader fills in"
    verb = words[0] if words else ""
    if verb in ("train", "distill"):
        return "it trains (minutes to hours)"
    if verb == "serve":
        return "it serves until stopped (tests/test_ui_*.py drive the page)"
    if verb == "eval":
        return "it needs the FID Inception's weights and Oxford Flowers, and takes minutes to hours"
    if verb == "data":
        return "it reads a folder of the reader's images"
    if verb == "pretrained" and "export" in words:
        return "it bundles a run of the reader's"
    if any("runs/" in word for word in words):
        return "it reads a training run of the reader's"
    return None


def code_of(source: str) -> str:
    """Python ``source`` without its comments (an example's comment may name a run it does not read)."""
    kept = [token for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type != tokenize.COMMENT]
    return tokenize.untokenize(kept)


def why_not_run_python(source: str) -> str | None:
    """Why a Python block of the docs is not run here, or None when it runs as written."""
    code = code_of(source)
    if "runs/" in code:
        return "it reads a training run of the reader's"
    if "Client(" in code:
        return "it talks to a running ddim serve"
    if "import ddim" not in code and "from ddim" not in code:
        return "it is not ddim's"
    return None


def examples(page: Path) -> list[tuple[str, str]]:
    """``("command" | "python", text)`` for each code-block example of ``page``, in order."""
    found = []
    for token in MARKDOWN.parse(page.read_text(encoding="utf-8")):
        if token.type != "fence":
            continue
        if token.info.strip() == "python":
            found.append(("python", token.content))
        else:
            found += [("command", command) for command in block_commands(token.content)]
    return found


CASES = [(page, kind, text) for page in GUIDES for kind, text in examples(page)
         if (why_not_run(text) if kind == "command" else why_not_run_python(text)) is None]


def case_id(case) -> str:
    page, kind, text = case
    label = text.split("#")[0].strip() if kind == "command" else "python block"
    return f"{page.relative_to(REPO).as_posix()}: {label[:70]}"


def is_slow(kind: str, text: str) -> bool:
    if kind == "python":
        return True
    words = shlex.split(text, comments=True)[1:]
    return words[0] in SAMPLING_VERBS and "--list-classes" not in words


def inputs_named(kind: str, text: str) -> list[str]:
    """The files an example reads, as written (relative to the repository's root)."""
    if kind == "command":
        words = shlex.split(text, comments=True)
        return [word for before, word in zip(["", *words], words)
                if word.lower().endswith(INPUT_SUFFIXES) and before not in ("--out", "-o")]
    strings = [node.value for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Constant)
               and isinstance(node.value, str)]
    return [value for value in strings if value.lower().endswith(INPUT_SUFFIXES) and "/" in value]


def undefined_names(source: str) -> list[str]:
    """Names a Python block reads but neither defines, imports nor gets from the builtins."""
    tree = ast.parse(source)
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
    return sorted({node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
                   and node.id not in defined})


def test_the_examples_cover_the_readme_and_the_tools():
    """The README's Python block, its quick start and every command of DDIM's tools are among the cases."""
    ran = {(page.name, kind, text) for page, kind, text in CASES}
    assert any(page == "README.md" and kind == "python" for page, kind, _ in ran)
    assert any(page == "README.md" and text.startswith("ddim sample --out") for page, _, text in ran)
    tools = [text for kind, text in examples(REPO / "docs" / "tools.md")]
    assert tools and all((REPO / "docs" / "tools.md", kind, text) in CASES for kind, text in examples(
        REPO / "docs" / "tools.md")), "every example of docs/tools.md runs"
    assert why_not_run("ddim sample --workdir runs/flowers32 --out x/") and why_not_run("ddim eval --num N")
    assert why_not_run_python('pipe = ddim.load("runs/x")\nimport ddim') and not why_not_run_python(
        'import ddim\npipe = ddim.load("pretrained:flowers32")   # or ddim.load("runs/flowers32")')


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_what_an_example_reads_exists_and_its_python_defines_what_it_uses(case):
    page, kind, text = case
    missing = [path for path in inputs_named(kind, text) if not (REPO / path).is_file()]
    assert not missing, f"{page.relative_to(REPO)}: the example reads files a clone does not have: {missing}"
    if kind == "python":
        assert not undefined_names(text), f"{page.relative_to(REPO)}: a Python block uses undefined names"


def test_the_undefined_name_check_sees_one():
    assert undefined_names("import ddim\npipe = ddim.load('x')\nresult = pipe.invert(photos)\n") == ["photos"]
    assert undefined_names("from ddim import load\nfor x in [1]:\n    y = load(x)\nprint(y)\n") == []


def run_command(command: str) -> None:
    from typer.testing import CliRunner

    from ddim.cli import app

    words = shlex.split(command, comments=True)
    result = CliRunner().invoke(app, words[1:])
    assert result.exit_code == 0 and "Traceback" not in result.output, f"{command}\n{result.output}"
    if "--out" in words:
        out = Path(words[words.index("--out") + 1])
        assert out.exists() and (out.is_file() or any(out.iterdir())), f"{command} wrote nothing to {out}"


@pytest.mark.parametrize("case", [pytest.param(case, marks=[pytest.mark.slow] if is_slow(*case[1:]) else [])
                                  for case in CASES], ids=case_id)
def test_an_example_runs_as_written(case, tmp_path, monkeypatch):
    page, kind, text = case
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "examples").symlink_to(EXAMPLES)
    monkeypatch.chdir(tmp_path)  # a fresh directory: no runs/, so the default model is the bundled one
    if kind == "command":
        run_command(text)
    else:
        exec(compile(text, f"{page.relative_to(REPO)} (python block)", "exec"), {"__name__": "__doc_example__"})


SETUP_VERBS = ("train", "data", "distill")


def sets_up(text: str) -> bool:
    """A ``ddim train``, ``data`` or ``distill`` command whose setup needs nothing of the reader's: no value to
    fill in, no run of theirs to start from (a folder of images to read is fine: setup does not read it)."""
    words = shlex.split(text, comments=True)
    starts = [after for before, after in zip(words, words[1:]) if before in ("--init", "--workdir", "-w",
                                                                             "--checkpoint")]
    return (words[1:2] != [] and words[1] in SETUP_VERBS and not any(PLACEHOLDER.fullmatch(w) for w in words)
            and not any(start.startswith("runs/") for start in starts))


SETUP_CASES = [(page, text) for page in GUIDES for kind, text in examples(page) if kind == "command" and sets_up(text)]


def setup_config(words: list[str]):
    """The config a ``ddim train``, ``data`` or ``distill`` command would run with, built as the command builds
    it before it reads any image or trains: :class:`ddim.config.ConfigError` where it would refuse."""
    from ddim.cli.app import with_data
    from ddim.distill.loop import check_settings
    from ddim.train import load_run_config
    from tests.docs_helpers import parse_command

    command, params = parse_command(words)
    overrides = with_data(list(params.get("overrides") or []), params.get("data") or params.get("path"))
    if command.name == "distill":
        return check_settings(params.get("config"), overrides)
    return load_run_config(params.get("config"), overrides, params.get("init"))


def test_the_guides_show_training_commands_to_check():
    verbs = {shlex.split(text)[1] for _, text in SETUP_CASES}
    assert verbs == set(SETUP_VERBS), verbs
    assert any("--init" in text for _, text in SETUP_CASES)


@pytest.mark.parametrize("case", SETUP_CASES, ids=lambda case: f"{case[0].relative_to(REPO).as_posix()}: "
                         f"{case[1].split('#')[0].strip()[:70]}")
def test_a_training_command_of_the_guides_sets_up_outside_the_checkout(case, tmp_path, monkeypatch):
    """Its config (a packaged name or the defaults) and its source model resolve from a directory that holds no
    clone, the way a user who installed the package runs it."""
    page, text = case
    monkeypatch.chdir(tmp_path)
    setup_config(shlex.split(text, comments=True)[1:])
