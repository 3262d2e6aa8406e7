"""Rebuild a bundled model from its recipe: data, training, evaluation, the guidance sweep, distillation, export.

Run:  python -m benchmarks.release.rebuild flowers64 --out runs/rebuild-flowers64
      python -m benchmarks.release.rebuild flowers64 --out runs/rebuild-flowers64 --until train-1   (up to a stage)
      python -m benchmarks.release.rebuild flowers64 --out runs/rebuild-flowers64 --list    (stages and commands)
      python -m benchmarks.release.rebuild flowers64 --out /tmp/smoke --smoke     (the same chain on a tiny model)

A recipe is ``benchmarks/release/recipes/NAME.toml`` (:mod:`benchmarks.release.recipe_files`): settings, and a
list of stages, each one or more commands (``ddim ...`` or ``python -m benchmarks.KIND.NAME ...``, each run as a
child process in the stage's directory and environment: :mod:`benchmarks.release.stage_commands`) or one of two
steps of the rebuild itself, ``choose`` (a bundle's defaults) and ``record`` (a bundle's record:
:mod:`benchmarks.release.bundle_steps`). ``--smoke`` replaces the settings by the recipe's ``[smoke]`` ones (a
16x16 network, a few steps, a few samples): the whole chain in a few minutes.

Every stage prints its wall time and the device (JAX's backend and device kind, as a child process sees it:
:mod:`benchmarks.release.device`). A command's completion is recorded in ``<out>/stages/STAGE.json`` (written
atomically, after it succeeded: :mod:`benchmarks.release.stage_markers`), so a stopped rebuild resumes at the first
command not done (``ddim train`` and ``ddim distill`` themselves resume from their last checkpoint; the time of a
stopped command still counts in the stage's) and a finished stage is skipped. Bad input (an unknown model, an
unwritable ``--out``, a stage that fails) is one ``error:`` line and a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO
from benchmarks.release import device as devices
from benchmarks.release import recipe_files
from benchmarks.release.bundle_steps import BundleSteps, defaults_options
from benchmarks.release.recipe_files import Recipe, RebuildError, Stage, expand, settings_of
from benchmarks.release.stage_commands import run_command
from benchmarks.release.stage_markers import duration, marker_path, prepare_out, read_marker, write_atomically

COMMAND = "python -m benchmarks.release.rebuild"


class StageFailed(RebuildError):
    def __init__(self, code: int, message: str, printed_error: bool):
        super().__init__(message)
        self.code, self.printed_error = code, printed_error


class Rebuild:
    """One rebuild: the recipe, its settings and ``out``; :meth:`run` runs the stages not done yet."""

    def __init__(self, recipe: Recipe, out: Path, smoke: bool = False, overrides: dict[str, str] | None = None,
                 say=print):
        self.recipe, self.out, self.smoke = recipe, out, smoke
        self.overrides = dict(overrides or {})
        self.settings = settings_of(recipe, out, smoke, self.overrides)
        self.say = say
        self.bundle_steps = BundleSteps(recipe, out, self.settings, self.command(), say)
        self._device: devices.Device | None = None

    def command(self) -> str:
        """The command line of this rebuild (without ``--out``), as a bundle's record gives it."""
        return " ".join([COMMAND, self.recipe.name, *(["--smoke"] if self.smoke else []),
                         *(f"--set {shlex.quote(f'{key}={value}')}" for key, value in self.overrides.items())])

    @property
    def device(self) -> devices.Device:
        if self._device is None:
            self._device = devices.probe()
        return self._device

    def values(self) -> dict[str, str]:
        """The settings, with each finished ``choose`` stage's defaults as ``ddim eval`` options."""
        values = dict(self.settings)
        for stage in self.recipe.stages:
            marker = read_marker(self.out, stage.name) if stage.kind == "choose" else None
            if marker is not None and marker.get("complete"):
                values[stage.name] = " ".join(defaults_options(marker["result"]))
        return values

    def commands(self, stage: Stage) -> list[str]:
        values = self.values()
        commands = stage.smoke_run if self.smoke and stage.smoke_run else stage.run
        # An empty setting leaves two spaces (or one at the end) where its options would be.
        return [re.sub(r"  +", " ", expand(command, values)).strip() for command in commands]

    def status(self, stage: Stage) -> str:
        marker = read_marker(self.out, stage.name)
        if marker is None:
            return "to do"
        if marker.get("complete"):
            return f"done in {duration(marker['seconds'])} ({marker['device']})"
        return f"stopped after {len(marker.get('commands', []))} of its commands"

    def listing(self) -> list[str]:
        """Every stage: its state, then its commands (where and with which environment they run)."""
        lines = [f"{self.recipe.name}: {self.recipe.about}" + (" (smoke)" if self.smoke else "")]
        for stage in self.recipe.stages:
            lines.append(f"- {stage.name} [{self.status(stage)}]: {stage.about}")
            if stage.cwd or stage.env:
                where = [f"in {expand(stage.cwd, self.settings)}"] if stage.cwd else []
                where += [f"{key}={expand(value, self.settings)}" for key, value in stage.env.items()]
                lines.append(f"    ({', '.join(where)})")
            lines += [f"    {command}" for command in self.commands(stage)]
            if stage.kind != "run":
                lines.append(f"    ({stage.kind}: {expand(json.dumps(getattr(stage, stage.kind)), self.settings)})")
        return lines

    def run(self, until: str | None = None) -> int:
        """Run every stage not done (up to ``until``); the number of stages run."""
        if until is not None:
            self.recipe.stage(until)
        ran = 0
        for stage in self.recipe.stages:
            marker = read_marker(self.out, stage.name)
            if marker is not None and marker.get("complete"):
                self.say(f"stage {stage.name}: done earlier, skipped ({duration(marker['seconds'])}, "
                         f"{marker['device']})")
            else:
                self.run_stage(stage, marker)
                ran += 1
            if stage.name == until:
                break
        return ran

    def run_stage(self, stage: Stage, marker: dict[str, Any] | None) -> None:
        done = list((marker or {}).get("commands", []))
        seconds = float((marker or {}).get("seconds", 0.0))
        self.say(f"stage {stage.name}: {stage.about} (device: {self.device})")
        result = None
        if stage.kind == "run":
            seconds = self.run_commands(stage, done, seconds)
        else:
            started = time.perf_counter()
            result = (self.bundle_steps.choose(stage.choose) if stage.kind == "choose"
                      else self.bundle_steps.write_record(stage.record))
            seconds += time.perf_counter() - started
        self._mark(stage, done, seconds, complete=True, result=result)
        self.say(f"stage {stage.name}: done in {duration(seconds)} ({self.device})")

    def run_commands(self, stage: Stage, done: list[dict[str, Any]], seconds: float) -> float:
        """Run the commands of ``stage`` not ``done`` yet (``done`` grows as they finish); the stage's seconds."""
        commands = self.commands(stage)
        cwd = Path(expand(stage.cwd, self.settings)) if stage.cwd else REPO
        env = {key: expand(value, self.settings) for key, value in stage.env.items()}
        for number, command in enumerate(commands):
            if number < len(done) and done[number]["command"] == command:
                self.say(f"  [{number + 1}/{len(commands)}] done earlier: {command}")
                continue
            self.say(f"  [{number + 1}/{len(commands)}] {command}")
            started = time.perf_counter()
            outcome = run_command(command, cwd, env)
            took = time.perf_counter() - started
            if outcome.code != 0:
                # The time a stopped run spent still counts: `ddim train` and `ddim distill` resume from it.
                self._mark(stage, done, seconds + took, complete=False)
                how = "stopped" if outcome.code == 130 else "failed"
                raise StageFailed(outcome.code, f"stage {stage.name} {how} (exit {outcome.code}) after "
                                  f"{duration(took)}: {command}; the same rebuild command resumes it",
                                  outcome.printed_error)
            self.say(f"  took {duration(took)}")
            seconds += took
            done[number:] = [{"command": command, "seconds": round(took, 3)}]
            self._mark(stage, done, seconds, complete=False)
            if outcome.stop_requested:  # it finished as the stop came: stop before the next one
                raise StageFailed(130, f"stopped after {command} in stage {stage.name}; the same rebuild "
                                  "command resumes it", False)
        return seconds

    def _mark(self, stage: Stage, commands: list, seconds: float, complete: bool, result=None) -> None:
        values = {"stage": stage.name, "complete": complete, "seconds": round(seconds, 3),
                  "device": str(self.device), "hardware": self.device.hardware, "commands": commands}
        if result is not None:
            values["result"] = result
        write_atomically(marker_path(self.out, stage.name), values)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("name", help=f"the bundled model to rebuild ({', '.join(recipe_files.recipe_names())})")
    parser.add_argument("--out", type=Path, required=True, help="where everything goes (data, runs, bundles)")
    parser.add_argument("--smoke", action="store_true", help="the whole chain on a tiny model, in minutes")
    parser.add_argument("--until", metavar="STAGE",
                        help="stop after this stage (to run a long chain a stage at a time)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="replace a setting of the recipe, e.g. dtype=bfloat16 (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the stages, their state and commands; run none")
    return parser.parse_args(argv)


def overrides_of(items: list[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` options as a dictionary."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise RebuildError(f"--set {item!r} is not of the form KEY=VALUE")
        overrides[key.strip()] = value
    return overrides


def rebuild(args: argparse.Namespace) -> None:
    """Run (or list) the rebuild ``args`` ask for; one rebuild at a time in an output directory."""
    from filelock import FileLock, Timeout

    overrides = overrides_of(args.overrides)
    recipe = recipe_files.load_recipe(args.name)
    out = args.out.expanduser().absolute()
    build = Rebuild(recipe, out, args.smoke, overrides)
    if args.list:
        print("\n".join(build.listing()))
        return
    prepare_out(out, recipe, args.smoke, overrides)
    try:
        with FileLock(str(out / ".rebuild.lock"), timeout=0):
            started = time.perf_counter()
            ran = build.run(args.until)
    except Timeout:
        raise RebuildError(f"another rebuild is running in {out}") from None
    print(f"{recipe.name}: {ran} stage(s) run in {duration(time.perf_counter() - started)}; bundles in "
          f"{out / 'bundles'}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rebuild(args)
        return 0
    except StageFailed as error:
        # The stage's own `error:` line said what went wrong: one more would make two.
        print(f"{'' if error.printed_error else 'error: '}{error}", file=sys.stderr)
        return error.code
    except RebuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
