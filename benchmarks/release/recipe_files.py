"""Rebuild recipes: ``recipes/NAME.toml`` read and checked, their settings chosen and expanded.

A recipe is settings, the ``[smoke]`` settings that replace them under ``--smoke``, and a list of stages, each a
``run`` (one or more commands, ``ddim ...`` or ``python -m benchmarks.KIND.NAME ...``), a ``choose`` or a
``record`` (steps of the rebuild itself, :mod:`benchmarks.release.bundle_steps`). ``{name}`` in a command is a
setting, ``{out}`` the output directory, ``{STAGE}`` a ``choose`` stage's result as ``ddim eval`` options.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RECIPES = Path(__file__).resolve().parent / "recipes"
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)\}")
KINDS = ("run", "choose", "record")
MODULE = re.compile(r"benchmarks(\.[a-z_][a-z0-9_]*)+")


class RebuildError(Exception):
    """A bad recipe, output directory or stage: one line for the user."""


@dataclass(frozen=True)
class Stage:
    """One step of a recipe: ``run`` (commands), ``choose`` or ``record`` (steps of the rebuild itself)."""

    name: str
    about: str
    run: tuple[str, ...] = ()
    smoke_run: tuple[str, ...] = ()
    """The commands under ``--smoke`` when they are fewer (a sweep of two settings instead of seven)."""
    choose: dict[str, Any] | None = None
    record: dict[str, Any] | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "choose" if self.choose is not None else "record" if self.record is not None else "run"


@dataclass(frozen=True)
class Recipe:
    name: str
    about: str
    settings: dict[str, str]
    smoke: dict[str, str]
    stages: tuple[Stage, ...]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise RebuildError(f"recipe {self.name} has no stage {name!r} (stages: "
                           f"{', '.join(s.name for s in self.stages)})")


def command_module(command: str) -> tuple[str, list[str]]:
    """The Python module a recipe command runs and its arguments: ``ddim ARGS`` is ``ddim.cli``, ``python -m
    benchmarks.KIND.NAME ARGS`` that module; ValueError for any other command."""
    words = shlex.split(command)
    if words[:1] == ["ddim"]:
        return "ddim.cli", words[1:]
    if words[:2] == ["python", "-m"] and len(words) > 2 and MODULE.fullmatch(words[2]):
        return words[2], words[3:]
    raise ValueError(f"a command is `ddim ...` or `python -m benchmarks.KIND.NAME ...`, not {command!r}")


def recipe_names(root: Path | None = None) -> list[str]:
    return sorted(path.stem for path in (root or RECIPES).glob("*.toml"))


def load_recipe(name: str, root: Path | None = None) -> Recipe:
    """The recipe ``root/NAME.toml``, checked: every command one :func:`command_module` runs, every placeholder
    a setting, a ``choose`` stage or ``out``."""
    root = root or RECIPES
    path = root / f"{name}.toml"
    if not path.is_file():
        raise RebuildError(f"no recipe for {name!r} (recipes: {', '.join(recipe_names(root)) or 'none'})")
    try:
        values = tomllib.loads(path.read_text(encoding="utf-8"))
        stages = tuple(_stage(entry) for entry in values.get("stage", ()))
        recipe = Recipe(str(values.get("name", name)), str(values.get("about", "")),
                        _strings(values.get("settings", {})), _strings(values.get("smoke", {})), stages)
    except (tomllib.TOMLDecodeError, TypeError, KeyError, ValueError) as error:
        raise RebuildError(f"recipe {path} is invalid: {error}") from None
    if recipe.name != name:
        raise RebuildError(f"recipe {path} names the model {recipe.name!r}")
    _check_names(recipe, path)
    for stage in recipe.stages:
        _check_stage(recipe, stage, path)
    return recipe


def _check_names(recipe: Recipe, path: Path) -> None:
    names = [stage.name for stage in recipe.stages]
    if not names or len(set(names)) != len(names):
        raise RebuildError(f"recipe {path} needs stages of distinct names (got {names})")
    unknown = set(recipe.smoke) - set(recipe.settings)
    if unknown:
        raise RebuildError(f"recipe {path}: [smoke] sets {', '.join(sorted(unknown))}, which [settings] lacks")


def _check_stage(recipe: Recipe, stage: Stage, path: Path) -> None:
    """Every placeholder of ``stage`` names something, and each of its commands is one a rebuild runs."""
    known = set(recipe.settings) | {"out"} | {other.name for other in recipe.stages if other.kind == "choose"}
    texts = [*stage.run, *stage.smoke_run, stage.cwd or "", *stage.env.values(),
             json.dumps(stage.choose or stage.record or {}), *recipe.settings.values()]
    missing = {match for text in texts for match in PLACEHOLDER.findall(text)} - known
    if missing:
        raise RebuildError(f"recipe {path}: {', '.join('{' + m + '}' for m in sorted(missing))} is no setting")
    for command in (*stage.run, *stage.smoke_run):
        try:
            module, _ = command_module(command)
        except ValueError as error:
            raise RebuildError(f"recipe {path}, stage {stage.name}: {error}") from None
        if not module_exists(module):
            raise RebuildError(f"recipe {path}, stage {stage.name}: no module {module}")


def module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a package on the way is missing
        return False


def _strings(table: dict) -> dict[str, str]:
    return {str(key): str(value) for key, value in table.items()}


def _stage(entry: dict) -> Stage:
    kinds = [kind for kind in KINDS if kind in entry]
    if len(kinds) != 1:
        raise ValueError(f"stage {entry.get('name')!r} needs one of {', '.join(KINDS)}")
    return Stage(name=str(entry["name"]), about=str(entry.get("about", "")), run=_commands(entry.get("run")),
                 smoke_run=_commands(entry.get("smoke_run")),
                 choose=entry.get("choose"), record=entry.get("record"), cwd=entry.get("cwd"),
                 env=_strings(entry.get("env", {})))


def _commands(value) -> tuple[str, ...]:
    """A stage's ``run``: one command or a list of them."""
    if value is None:
        return ()
    return tuple(str(command) for command in value) if isinstance(value, list) else (str(value),)


def settings_of(recipe: Recipe, out: Path, smoke: bool, overrides: dict[str, str]) -> dict[str, str]:
    """The recipe's settings (its ``[smoke]`` ones with ``smoke``, then ``overrides``), ``out`` included."""
    unknown = set(overrides) - set(recipe.settings)
    if unknown:
        raise RebuildError(f"--set {', '.join(sorted(unknown))}: recipe {recipe.name} has no such setting "
                           f"(settings: {', '.join(sorted(recipe.settings))})")
    return {**recipe.settings, **(recipe.smoke if smoke else {}), **overrides, "out": str(out)}


def expand(text: str, values: dict[str, str], depth: int = 0) -> str:
    """``text`` with every ``{name}`` of ``values`` replaced (settings may name settings); others kept."""
    if depth > 20:
        raise RebuildError(f"the settings name each other in a circle: {text!r}")
    expanded = PLACEHOLDER.sub(lambda match: values.get(match.group(1), match.group(0)), text)
    return expand(expanded, values, depth + 1) if expanded != text and PLACEHOLDER.search(expanded) else expanded
