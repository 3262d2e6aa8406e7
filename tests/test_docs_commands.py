"""The commands the documentation shows: every ``ddim`` command in README.md and docs/ parses with the CLI.

A command shown must parse as ``ddim`` would (its subcommand and options exist, its values have the right type,
a named config is a packaged one and its sampler and spacing are ones ddim has), without running it; the
scripts, benchmark modules and configs the pages name must exist; and a command that needs a clone of the
repository (``python -m benchmarks...``, ``python tools/...``) says so where the guides show it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs_helpers import GUIDE, PAGES, PLACEHOLDER, README, REPO, command_words, parse_command, shown_commands
from tests.markdown_blocks import MARKDOWN

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


# --- the scripts, modules and configs named ----------------------------------------------------------------------

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


# --- commands that run only from a clone of the repository ------------------------------------------------------

CHECKOUT_SCRIPT = re.compile(r"python\s+(?:-m\s+benchmarks\.|tools/)")
CHECKOUT_SAID = re.compile(r"clone of (?:the|this) repository|from the repository's root|in a clone", re.IGNORECASE)


def checkout_commands_unsaid(page: Path) -> list[str]:
    """``python -m benchmarks....`` and ``python tools/...`` commands of a page, in a code block or inline, whose
    block, paragraph or the paragraph before it does not say that they run from a clone of the repository (an
    installed package has no benchmarks/ or tools/)."""
    unsaid, previous = [], ""
    for token in MARKDOWN.parse(page.read_text(encoding="utf-8")):
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
