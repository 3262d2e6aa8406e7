"""The documentation's links: every relative link and ``#anchor`` in README.md and docs/ resolves.

Markdown is parsed with markdown-it-py (CommonMark plus tables, as GitHub renders them), so links in code
blocks are not links and headings are read as rendered text. Anchors follow GitHub's slugs (github-slugger):
the heading's text lowercased, everything but letters, digits, marks, spaces, hyphens and underscores dropped,
spaces turned into hyphens, and a repeated slug suffixed -1, -2, ... External (http, https, mailto) links
are not fetched. The commands shown must parse with the CLI, and the scripts and configs they name must exist.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GUIDE = REPO / "docs"
PAGES = [README, *sorted(GUIDE.rglob("*.md"))]
FRONT_PAGE_MAX_LINES = 250

_MARKDOWN = MarkdownIt("commonmark").enable("table")


def _tokens(page: Path):
    """Every token of ``page``, inline children included, in document order."""
    for token in _MARKDOWN.parse(page.read_text(encoding="utf-8")):
        yield token
        yield from token.children or ()


def github_slug(text: str) -> str:
    """The anchor GitHub gives a heading of this rendered text (before de-duplication)."""
    kept = (c for c in text.lower() if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return "".join(kept).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(page: Path) -> frozenset[str]:
    """The ``#anchors`` of a Markdown page: one per heading, repeats numbered as GitHub numbers them."""
    tokens = list(_MARKDOWN.parse(page.read_text(encoding="utf-8")))
    seen: dict[str, int] = {}
    found = set()
    for opening, inline in zip(tokens, tokens[1:]):
        if opening.type != "heading_open":
            continue
        text = "".join(child.content for child in inline.children if child.type in ("text", "code_inline"))
        base = slug = github_slug(text)
        while slug in seen:
            seen[base] += 1
            slug = f"{base}-{seen[base]}"
        seen.setdefault(slug, 0)
        found.add(slug)
    return frozenset(found)


def links(page: Path) -> list[str]:
    """The targets of ``page``'s links and images, as written."""
    targets = []
    for token in _tokens(page):
        if token.type == "link_open":
            targets.append(token.attrs["href"])
        elif token.type == "image":
            targets.append(token.attrs["src"])
    return targets


def broken(page: Path, target: str) -> str | None:
    """Why ``target``, a link on ``page``, does not resolve; None when it does (or is external)."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return None if parts.scheme in ("http", "https", "mailto") else f"unexpected scheme {parts.scheme!r}"
    path = (page.parent / unquote(parts.path)).resolve() if parts.path else page
    if REPO not in path.parents and path != REPO:
        return "points outside the repository"
    relative = path.relative_to(REPO).as_posix()
    if not path.exists():
        return f"{relative} does not exist"
    if parts.fragment:
        if path.suffix != ".md":
            return f"an anchor into {relative}, which is not a Markdown page"
        if unquote(parts.fragment) not in anchors(path):
            return f"{relative} has no heading with the anchor #{parts.fragment}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    problems = [f"{target}: {why}" for target in links(page) if (why := broken(page, target))]
    assert not problems, f"broken links in {page.relative_to(REPO)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("heading, slug", [
    ("Sampling and samplers", "sampling-and-samplers"),
    ("Measured: which sampler, how many steps", "measured-which-sampler-how-many-steps"),
    ("DDIM's tools: inversion, reconstruction", "ddims-tools-inversion-reconstruction"),
    ("Getting the InceptionV3 weights (for `--kid-net keras` / `--fid-net keras`)",
     "getting-the-inceptionv3-weights-for---kid-net-keras----fid-net-keras"),
    ("Outputs (in the work directory)", "outputs-in-the-work-directory"),
    ("Über_große Blüten 2", "über_große-blüten-2"),
])
def test_slugs_follow_github(heading, slug):
    assert github_slug(heading) == slug


def test_repeated_headings_are_numbered(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Measured\n\n## Measured\n\n### Measured\n\n## `ddim eval`\n")
    assert anchors(page) == {"measured", "measured-1", "measured-2", "ddim-eval"}


def test_links_in_code_are_not_links(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](a.md) `[b](b.md)`\n\n```\n[c](c.md)\n```\n\n| x |\n| - |\n| [d](d.md#e) |\n")
    assert links(page) == ["a.md", "d.md#e"]


def test_every_guide_page_is_in_the_table_of_contents():
    index = GUIDE / "README.md"
    listed = {(index.parent / urlsplit(target).path).resolve() for target in links(index)}
    missing = [page.name for page in GUIDE.glob("*.md") if page != index and page.resolve() not in listed]
    assert not missing, f"pages not linked from docs/README.md: {missing}"
    assert "docs/README.md" in links(README), "the README links the user guide's table of contents"


def test_the_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= FRONT_PAGE_MAX_LINES, f"README.md has {lines} lines; move detail into the user guide (docs/)"


def test_the_readme_test_command_is_the_one_ci_runs():
    """.ci/run runs the README's test command, copied verbatim under a marker comment: they must not drift."""
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    marker = ci.index("# The README's test command, verbatim:")
    command = ci[marker + 1].strip()
    blocks = [token.content for token in _MARKDOWN.parse(README.read_text(encoding="utf-8")) if token.type == "fence"]
    assert any(command in block.splitlines() for block in blocks), f"README.md has no code line {command!r}"


# --- the commands shown: every `ddim` command in the README and the guides parses -------------------------------

PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")  # N, NAME, DIR, FOLDER, RUN: a value the reader fills in
SYNOPSIS = re.compile(r"\[|\.\.\.|<")  # `ddim train [--config FILE] ...`: a usage line, not a command


def shown_commands(page: Path, inline: bool = True) -> list[str]:
    """The ``ddim`` commands of ``page``: code-block lines (continuations joined, comments dropped, split at
    ``&&``, ``|`` and ``;``), and with ``inline`` the inline code that starts with ``ddim``; synopses left out."""
    found = []
    for token in _tokens(page):
        if token.type == "fence":
            found += block_commands(token.content)
        elif token.type == "code_inline" and inline:
            found += block_commands(token.content)
    return found


def block_commands(block: str) -> list[str]:
    """The ``ddim`` commands of one code block (or inline code), as :func:`shown_commands` reads them."""
    found = []
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        for part in re.split(r"&&|\|\||;|\|", line):
            words = part.strip()
            if words.startswith("ddim ") or words == "ddim":
                found.append(words)
    return [command for command in found if not SYNOPSIS.search(command)]


def command_words(command: str) -> list[str]:
    words = shlex.split(command, comments=True)
    return ["1" if PLACEHOLDER.fullmatch(word) else word for word in words[1:]]


def parse_command(words: list[str]):
    """Parse ``ddim WORDS`` as the CLI does, without running it: ``(the command, its parameters)``; click's own
    error (an unknown command or option, a value of the wrong type, a missing one) when it does not parse."""
    import typer

    from ddim.cli import app

    command = typer.main.get_command(app)
    context = command.make_context("ddim", list(words))
    while hasattr(command, "resolve_command"):  # a group: its subcommand
        rest = [*(getattr(context, "_protected_args", None) or getattr(context, "protected_args", [])), *context.args]
        if not rest:
            break
        name, command, rest = command.resolve_command(context, rest)
        context = command.make_context(name, rest, parent=context)
    return command, context.params


COMMAND_PAGES = PAGES  # the README, the guides and the research record


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_command_shown_parses_with_the_cli(page):
    from ddim.config import ConfigError
    from ddim.config import named as named_config
    from ddim.spec import SAMPLERS, SPACINGS

    problems = []
    complete = set(shown_commands(page, inline=False))  # a code block's command runs as it stands
    for command in shown_commands(page):
        if not command_words(command) or "--help" in command_words(command):
            continue  # `ddim`, `ddim --help`: the help itself
        try:
            _, params = parse_command(command_words(command))
        except Exception as error:  # click's usage errors: what `ddim ... --help` would tell the reader
            # Inline code may name a command or an option without all it needs (`ddim data`, `--data`).
            partial = type(error).__name__ in ("MissingParameter", "BadOptionUsage") and command not in complete
            if not partial:
                problems.append(f"{command}: {error}")
            continue
        config = params.get("config")
        if config is not None and not str(config).endswith(".toml") and str(config) != "1":
            try:  # a name, not a file of the reader's: one of the packaged configs
                named_config.resolve(Path(str(config)).name)
            except ConfigError as error:
                problems.append(f"{command}: {error}")
        for option, names in (("sampler", SAMPLERS), ("spacing", SPACINGS)):
            if params.get(option) is not None and params[option] not in names and params[option] != "1":
                problems.append(f"{command}: --{option} {params[option]} is not one of {', '.join(names)}")
    assert not problems, f"commands in {page.relative_to(REPO)} that ddim would refuse:\n" + "\n".join(problems)


def test_the_command_check_refuses_what_the_cli_refuses(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\npip install -e . && ddim sample --pretrained flowers32 \\\n    --num N --out x/   # ok\n"
                    "ddim sample --bogus\n```\n\nRun `ddim pretrained --markdown`; usage: `ddim eval [--num 5000]`.\n")
    assert shown_commands(page) == ["ddim sample --pretrained flowers32  --num N --out x/   # ok",
                                    "ddim sample --bogus", "ddim pretrained --markdown"]
    parse_command(command_words(shown_commands(page)[0]))
    with pytest.raises(Exception, match="--bogus"):
        parse_command(command_words("ddim sample --bogus"))
    with pytest.raises(Exception, match="No such command"):
        parse_command(command_words("ddim smaple"))


BENCHMARK_MODULE = re.compile(r"(?<![\w/.])benchmarks(?:\.(?!md\b)[a-z_][a-z0-9_]*)+")  # not the page benchmarks.md


def module_exists(name: str) -> bool:
    """Whether ``benchmarks.KIND.NAME`` is a module (or package) of this repository."""
    path = REPO / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_script_module_and_config_shown_exists(page):
    text = page.read_text(encoding="utf-8")
    named = set(re.findall(r"(?<![\w/])((?:benchmarks|ddim/configs|tools)/[\w./-]+\.(?:py|toml|sh))", text))
    missing = sorted(path for path in named if not (REPO / path).is_file() and not PLACEHOLDER.search(path))
    missing += sorted(name for name in set(BENCHMARK_MODULE.findall(text)) if not module_exists(name))
    assert not missing, f"{page.relative_to(REPO)} names files or modules that do not exist: {missing}"


def test_the_existence_check_sees_a_module_that_is_not_there():
    assert module_exists("benchmarks.speed.bench") and module_exists("benchmarks.release")
    assert not module_exists("benchmarks.speed.nothing") and not module_exists("benchmarks.bench")
    assert BENCHMARK_MODULE.findall("`python -m benchmarks.speed.bench --data x`, benchmarks.studies.curve's "
                                    "score; [Speed](benchmarks.md#runtime-notes)") == ["benchmarks.speed.bench",
                                                                                      "benchmarks.studies.curve"]


def test_the_readme_commands_each_write_to_their_own_folder():
    """Run one after another in a fresh directory, no README command stops on another's output."""
    outs = [words[words.index("--out") + 1] for command in shown_commands(README)
            if "--out" in (words := shlex.split(command, comments=True))]
    assert outs and len(outs) == len(set(outs)), f"README commands share an --out folder: {outs}"


# --- pointers from the program into the guide: `--help`, tips and errors name pages and sections that exist ------

POINTER = re.compile(r"docs/[\w./-]+?\.md(?:#[\w-]+)?")
NAMED_SECTION = re.compile(r"user guide(?:'s|,) '([^']+)'")  # "the user guide's 'Bundled models' page"


def help_texts() -> dict[str, str]:
    """Every command's and option's help, by ``ddim COMMAND [--option]``, as ``--help`` shows it."""
    import typer

    from ddim.cli import app

    texts = {}

    def walk(command, path):
        texts[path] = command.help or ""
        for param in command.params:
            texts[f"{path} {param.opts[0]}"] = getattr(param, "help", None) or ""
        for name, sub in getattr(command, "commands", {}).items():  # a group's subcommands
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "ddim")
    return texts


def source_pointers() -> dict[str, str]:
    """The docs pointers in ddim's own code (tips, errors, docstrings), by file."""
    return {path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8")
            for path in sorted((REPO / "ddim").rglob("*.py"))}


def headings() -> set[str]:
    """The rendered text of every heading of the README and the guides."""
    found = set()
    for page in PAGES:
        tokens = list(_MARKDOWN.parse(page.read_text(encoding="utf-8")))
        for opening, inline in zip(tokens, tokens[1:]):
            if opening.type == "heading_open":
                found.add("".join(child.content for child in inline.children if child.type in ("text", "code_inline")))
    return found


def pointer_problems(texts: dict[str, str]) -> list[str]:
    problems = []
    for where, text in texts.items():
        text = re.sub(r"\s+", " ", text)
        for target in POINTER.findall(text):
            why = broken(README, target)
            if why:
                problems.append(f"{where}: {target}: {why}")
        problems += [f"{where}: the guide has no section {name!r}" for name in NAMED_SECTION.findall(text)
                     if name not in headings()]
    return problems


def test_every_help_pointer_names_an_existing_page_and_section():
    texts = help_texts()
    assert any(POINTER.search(text) for text in texts.values()), "the check sees the help's pointers"
    problems = pointer_problems(texts)
    assert not problems, "`--help` points to pages or sections that do not exist:\n" + "\n".join(problems)


def test_every_pointer_in_the_code_names_an_existing_page_and_section():
    problems = pointer_problems(source_pointers())
    assert not problems, "ddim's code points to pages or sections that do not exist:\n" + "\n".join(problems)


def test_the_pointer_check_catches_a_missing_section():
    assert pointer_problems({"x": "See docs/sampling.md#which-sampler-how-many-steps and the user guide's "
                                  "'Bundled models' page."}) == []
    assert pointer_problems({"x": "See the user guide, 'Sampling and samplers'."}) == [
        "x: the guide has no section 'Sampling and samplers'"]
    assert pointer_problems({"x": "docs/sampling.md#samplers-and-steps, docs/nowhere.md"}) == [
        "x: docs/sampling.md#samplers-and-steps: docs/sampling.md has no heading with the anchor #samplers-and-steps",
        "x: docs/nowhere.md: docs/nowhere.md does not exist"]


def test_the_guide_states_the_plain_setting_as_the_code_has_it():
    """What a model with no measured best setting samples with is said once, in docs/sampling.md, as
    :class:`ddim.spec.SamplingSpec`'s defaults (guidance 1: no guidance)."""
    from ddim.spec import SamplingSpec

    plain = SamplingSpec()
    text = re.sub(r"\s+", " ", (GUIDE / "sampling.md").read_text(encoding="utf-8"))
    assert f"{plain.steps} steps of `{plain.sampler}` on the `{plain.spacing}` grid, guidance 1" in text


KERAS_EXAMPLE = "https://keras.io/examples/generative/ddim/"
NAMES_KERAS = re.compile(r"Keras(?: DDIM)? (?:example|network|recipe)")


def first_mention_links(page: Path, phrase: re.Pattern, url: str) -> bool | None:
    """Whether the first paragraph, list item or table cell of ``page`` (headings left out) that names ``phrase``
    in its text links ``url``; None when the page never names it."""
    tokens = list(_MARKDOWN.parse(page.read_text(encoding="utf-8")))
    for previous, token in zip([None, *tokens], tokens):
        if token.type != "inline" or (previous is not None and previous.type == "heading_open"):
            continue
        text = "".join(child.content for child in token.children if child.type == "text")
        if phrase.search(text):
            return any(child.type == "link_open" and child.attrs["href"] == url for child in token.children)
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_a_page_links_the_keras_example_where_it_first_names_it(page):
    assert first_mention_links(page, NAMES_KERAS, KERAS_EXAMPLE) is not False, (
        f"{page.relative_to(REPO)} names the Keras example without linking it ({KERAS_EXAMPLE}) the first time")


def test_the_keras_check_sees_an_unlinked_first_mention(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# The Keras example\n\nAs the Keras network does.\n\nThe [Keras example]({KERAS_EXAMPLE}).\n")
    assert first_mention_links(page, NAMES_KERAS, KERAS_EXAMPLE) is False
    page.write_text(f"# The Keras example\n\n`Keras example` and the [Keras example]({KERAS_EXAMPLE}).\n")
    assert first_mention_links(page, NAMES_KERAS, KERAS_EXAMPLE) is True


CHECKOUT_SCRIPT = re.compile(r"python\s+(?:-m\s+benchmarks\.|tools/)")
CHECKOUT_SAID = re.compile(r"clone of (?:the|this) repository|from the repository's root|in a clone", re.IGNORECASE)


def checkout_commands_unsaid(page: Path) -> list[str]:
    """``python -m benchmarks....`` and ``python tools/...`` commands of a page, in a code block or inline, whose
    block, paragraph or the paragraph before it does not say that they run from a clone of the repository (an
    installed package has no benchmarks/ or tools/)."""
    unsaid, previous = [], ""
    for token in _MARKDOWN.parse(page.read_text(encoding="utf-8")):
        if token.type == "inline" or token.type == "fence":
            text = token.content
            found = CHECKOUT_SCRIPT.search(text)
            if found and not (CHECKOUT_SAID.search(text) or CHECKOUT_SAID.search(previous)):
                unsaid.append(text[found.start():found.start() + 48])
            previous = text
    return unsaid


GUIDE_PAGES = [README, *sorted(GUIDE.glob("*.md"))]  # the research record's commands are its record


@pytest.mark.parametrize("page", GUIDE_PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_a_command_that_needs_the_checkout_says_so(page):
    unsaid = checkout_commands_unsaid(page)
    assert not unsaid, (f"{page.relative_to(REPO)}: say that these run from a clone of the repository (a pip "
                        f"install has no benchmarks/ or tools/): {unsaid}")


def test_the_checkout_check_sees_an_unsaid_command(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Measure it:\n\n```bash\npython -m benchmarks.speed.bench --config smoke\n```\n\nFrom a clone of "
                    "the repository:\n\n```bash\npython tools/fid_reference.py compare\n```\n")
    assert checkout_commands_unsaid(page) == ["python -m benchmarks.speed.bench --config smoke\n"]
    page.write_text("Run `python -m\nbenchmarks.speed.bench` to time it.\n")
    assert checkout_commands_unsaid(page) == ["python -m\nbenchmarks.speed.bench` to time it."]
