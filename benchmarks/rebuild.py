"""Rebuild a bundled model from its recipe: data, training, evaluation, the guidance sweep, distillation, export.

Run:  python benchmarks/rebuild.py flowers64 --out runs/rebuild-flowers64
      python benchmarks/rebuild.py flowers64 --out runs/rebuild-flowers64 --until train-1   (the stages up to one)
      python benchmarks/rebuild.py flowers64 --out runs/rebuild-flowers64 --list    (the stages and their commands)
      python benchmarks/rebuild.py flowers64 --out /tmp/smoke --smoke     (the same chain on a tiny model)

A recipe is ``benchmarks/recipes/NAME.toml``: settings, and a list of stages, each one or more commands (``ddim
...`` or ``python benchmarks/SCRIPT.py ...``, run in this process) or one of two steps of the rebuild itself:
``choose`` (a bundle's defaults: the setting of lowest FID among its evaluations at a number of samples, of one
step count with ``steps``) and ``record`` (a bundle's record: its scores from its ``ddim eval`` lines, the chosen
defaults, the guidance sweep in words, the training stages' hardware and wall time (with ``wall_time_from``, a
stage's as its run's own records add it up), and the time of ``ddim sample`` that a ``benchmarks/cli_timing.py``
stage measured). ``{name}`` in a command is a setting of the recipe, ``{out}``
the output directory, ``{STAGE}`` a ``choose`` stage's setting as ``ddim eval`` options. ``--smoke`` replaces the
settings by the recipe's ``[smoke]`` ones (a 16x16 network, a few steps, a few samples): the whole chain in seconds.

Every stage prints its wall time and the device (JAX's backend and device kind). A command's completion is
recorded in ``<out>/stages/STAGE.json`` (written atomically, after it succeeded), so a stopped rebuild resumes at
the first command not done (``ddim train`` and ``ddim distill`` themselves resume from their last checkpoint; the
time of a stopped command still counts in the stage's) and a finished stage is skipped. Bad input (an unknown
model, an unwritable ``--out``, a stage that fails) is one ``error:`` line and a non-zero exit.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import ddim  # noqa: E402  (sets the XLA flags before JAX starts)
from ddim import runtime  # noqa: E402
from ddim.pretrained.bundle_record import BundleRecord, setting_of, setting_values  # noqa: E402
from ddim.pretrained.render import describe_setting  # noqa: E402
from ddim.spec import SamplingSpec  # noqa: E402

if __name__ == "__main__":
    runtime.restart_with_fast_allocator()  # the allocator the `ddim` command runs with

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RECIPES = Path(__file__).resolve().parent / "recipes"
STAGES = "stages"
STATE = "rebuild.json"
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)\}")
KINDS = ("run", "choose", "record")


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


# --- recipes --------------------------------------------------------------------------------------------------


def recipe_names(root: Path | None = None) -> list[str]:
    return sorted(path.stem for path in (root or RECIPES).glob("*.toml"))


def load_recipe(name: str, root: Path | None = None) -> Recipe:
    """The recipe ``root/NAME.toml``, checked: every command a ``ddim`` or ``python benchmarks/...`` one, every
    placeholder a setting, a ``choose`` stage or ``out``."""
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
    names = [stage.name for stage in stages]
    if not names or len(set(names)) != len(names):
        raise RebuildError(f"recipe {path} needs stages of distinct names (got {names})")
    unknown = set(recipe.smoke) - set(recipe.settings)
    if unknown:
        raise RebuildError(f"recipe {path}: [smoke] sets {', '.join(sorted(unknown))}, which [settings] lacks")
    known = set(recipe.settings) | {"out"} | {stage.name for stage in stages if stage.kind == "choose"}
    for stage in stages:
        texts = [*stage.run, *stage.smoke_run, stage.cwd or "", *stage.env.values(), json.dumps(stage.choose or stage.record or {}),
                 *recipe.settings.values()]
        missing = {match for text in texts for match in PLACEHOLDER.findall(text)} - known
        if missing:
            raise RebuildError(f"recipe {path}: {', '.join('{' + m + '}' for m in sorted(missing))} is no setting")
        for command in (*stage.run, *stage.smoke_run):
            words = shlex.split(command)
            if not (words[:1] == ["ddim"] or (words[:1] == ["python"] and len(words) > 1
                                              and words[1].startswith("benchmarks/"))):
                raise RebuildError(f"recipe {path}, stage {stage.name}: a command is `ddim ...` or `python "
                                   f"benchmarks/SCRIPT.py ...`, not {command!r}")
    return recipe


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


# --- where results are kept -----------------------------------------------------------------------------------


def marker_path(out: Path, stage: str) -> Path:
    return out / STAGES / f"{stage}.json"


def read_marker(out: Path, stage: str) -> dict[str, Any] | None:
    try:
        return json.loads(marker_path(out, stage).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise RebuildError(f"cannot read {marker_path(out, stage)}: {error}") from None


def write_atomically(path: Path, values: dict[str, Any]) -> None:
    """Write ``values`` as JSON to ``path`` through a temporary file renamed into place: all or nothing."""
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging.write_text(json.dumps(values, indent=2) + "\n", encoding="utf-8")
        os.replace(staging, path)
    except OSError as error:
        raise RebuildError(f"cannot write {path}: {error.strerror or error}") from None


def prepare_out(out: Path, recipe: Recipe, smoke: bool, overrides: dict[str, str]) -> None:
    """Create ``out`` (or check it), and refuse one that holds a rebuild of another recipe or settings."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test.{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise RebuildError(f"cannot write to --out {out}: {error.strerror or error}") from None
    wanted = {"recipe": recipe.name, "smoke": smoke, "settings": overrides}
    path = out / STATE
    if path.is_file():
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise RebuildError(f"cannot read {path}: {error}") from None
        if found != wanted:
            raise RebuildError(f"{out} holds a rebuild of {found.get('recipe')} "
                               f"({'smoke, ' if found.get('smoke') else ''}settings {found.get('settings')}), not "
                               f"this one; use another --out")
    else:
        write_atomically(path, wanted)


# --- the device and the clock ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    backend: str
    kind: str
    hardware: str
    """In the words of the records: ``1x NVIDIA H100 80GB HBM3 (JAX 0.7.2)``, ``a 2-core CPU (AMD EPYC, JAX ...)``."""

    def __str__(self) -> str:
        return self.backend if self.kind.lower() == self.backend else f"{self.backend}, {self.kind}"


def current_device() -> Device:
    import jax

    devices = jax.devices()
    kind = devices[0].device_kind
    if jax.default_backend() == "cpu":
        hardware = f"a {os.cpu_count()}-core CPU ({_cpu_model()}JAX {jax.__version__})"
    else:
        hardware = f"{len(devices)}x {kind} (JAX {jax.__version__})"
    return Device(jax.default_backend(), kind, hardware)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + ", "
    except OSError:
        pass
    return ""


def duration(seconds: float) -> str:
    """``4.2 s``, ``5 min 26 s``, ``1 h 59 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


# --- running a command in this process ------------------------------------------------------------------------


class _Watch:
    """A text stream that passes everything on and notes whether an ``error:`` line went through."""

    def __init__(self, stream):
        self._stream = stream
        self.saw_error = False

    def write(self, text: str) -> int:
        if text.startswith("error:") or "\nerror:" in text:
            self.saw_error = True
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def place(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """Run in ``cwd`` with ``env`` set, both restored afterwards."""
    before_cwd, before_env = Path.cwd(), {name: os.environ.get(name) for name in env}
    try:
        cwd.mkdir(parents=True, exist_ok=True)
        os.chdir(cwd)
    except OSError as error:
        raise RebuildError(f"cannot work in {cwd}: {error.strerror or error}") from None
    os.environ.update(env)
    try:
        yield
    finally:
        os.chdir(before_cwd)
        for name, value in before_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_command(command: str) -> tuple[int, bool]:
    """Run ``ddim ...`` or ``python benchmarks/SCRIPT.py ...`` here; its exit status and whether it printed an
    ``error:`` line."""
    words = shlex.split(command)
    watch = _Watch(sys.stderr)
    with contextlib.redirect_stderr(watch):
        if words[0] == "ddim":
            code = _run_ddim(words[1:])
        else:
            code = _run_script(REPO / words[1], words[2:])
    return code, watch.saw_error


def _run_ddim(args: list[str]) -> int:
    """``ddim ARGS`` as the console script runs it (its errors printed as it prints them); the exit status."""
    from ddim.cli import app

    try:
        app(args=args, prog_name="ddim")
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
    return 0


def _run_script(path: Path, args: list[str]) -> int:
    spec = importlib.util.spec_from_file_location(f"_rebuild_{path.stem}", path)
    if spec is None or not path.is_file():
        raise RebuildError(f"no script {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.main(args)
    except SystemExit as error:
        if isinstance(error.code, str):
            print(error.code if error.code.startswith("error:") else f"error: {error.code}", file=sys.stderr)
            return 1
        return error.code or 0
    return 0


# --- the stages -----------------------------------------------------------------------------------------------


class Rebuild:
    """One rebuild: the recipe, its settings and ``out``; :meth:`run` runs the stages not done yet."""

    def __init__(self, recipe: Recipe, out: Path, smoke: bool = False, overrides: dict[str, str] | None = None,
                 say=print):
        self.recipe, self.out, self.smoke = recipe, out, smoke
        self.overrides = dict(overrides or {})
        self.settings = settings_of(recipe, out, smoke, self.overrides)
        self.say = say
        self._device: Device | None = None

    @property
    def device(self) -> Device:
        if self._device is None:
            self._device = current_device()
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
            commands = self.commands(stage)
            cwd = Path(expand(stage.cwd, self.settings)) if stage.cwd else REPO
            env = {key: expand(value, self.settings) for key, value in stage.env.items()}
            for number, command in enumerate(commands):
                if number < len(done) and done[number]["command"] == command:
                    self.say(f"  [{number + 1}/{len(commands)}] done earlier: {command}")
                    continue
                self.say(f"  [{number + 1}/{len(commands)}] {command}")
                started = time.perf_counter()
                with place(cwd, env):
                    code, printed_error = run_command(command)
                took = time.perf_counter() - started
                if code != 0:
                    # The time a stopped run spent still counts: `ddim train` and `ddim distill` resume from it.
                    self._mark(stage, done, seconds + took, complete=False)
                    how = "stopped" if code == 130 else "failed"
                    message = (f"stage {stage.name} {how} (exit {code}) after {duration(took)}: {command}; the "
                               "same rebuild command resumes it")
                    raise StageFailed(code, message, printed_error)
                self.say(f"  took {duration(took)}")
                seconds += took
                done = [*done[:number], {"command": command, "seconds": round(took, 3)}]
                self._mark(stage, done, seconds, complete=False)
        else:
            started = time.perf_counter()
            result = (self.choose(stage.choose) if stage.kind == "choose" else self.write_record(stage.record))
            seconds += time.perf_counter() - started
        self._mark(stage, done, seconds, complete=True, result=result)
        self.say(f"stage {stage.name}: done in {duration(seconds)} ({self.device})")

    def _mark(self, stage: Stage, commands: list, seconds: float, complete: bool, result=None) -> None:
        values = {"stage": stage.name, "complete": complete, "seconds": round(seconds, 3),
                  "device": str(self.device), "hardware": self.device.hardware, "commands": commands}
        if result is not None:
            values["result"] = result
        write_atomically(marker_path(self.out, stage.name), values)

    # --- the rebuild's own steps ------------------------------------------------------------------------------

    def bundle(self, name: str):
        from ddim.pretrained import PretrainedError, find

        try:
            return find(name, self.out / "bundles")
        except PretrainedError as error:
            raise RebuildError(str(error)) from None

    def eval_lines(self, name: str) -> list[dict[str, Any]]:
        """The ``ddim eval --pretrained NAME`` lines of this rebuild's bundle (its directory, its step)."""
        from ddim.workdir.records import read_records

        manifest = self.bundle(name)
        path = self.out / "runs" / f"pretrained-{name}" / "eval.jsonl"
        return [line for line in read_records(path)
                if Path(str(line.get("checkpoint"))).resolve() == manifest.directory.resolve()
                and line.get("step") == manifest.record.get("steps") and line.get("fid") is not None]

    def candidates(self, options: dict[str, Any], lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The evaluations a ``choose`` stage chooses among: those of its ``num`` samples (and ``steps``)."""
        num = int(expand(str(options["num"]), self.settings))
        steps = int(expand(str(options["steps"]), self.settings)) if "steps" in options else None
        return [line for line in lines if line.get("num") == num and (steps is None or line.get("steps") == steps)]

    def choose(self, options: dict[str, Any]) -> dict[str, Any]:
        """The setting of lowest FID among the bundle's evaluations of ``num`` samples (of ``steps`` steps, when
        given: a consistency student's best guidance at each step count it samples with)."""
        name, num = options["model"], int(expand(str(options["num"]), self.settings))
        steps = int(expand(str(options["steps"]), self.settings)) if "steps" in options else None
        lines = self.candidates(options, self.eval_lines(name))
        if not lines:
            raise RebuildError(f"no ddim eval of {name} with {num} samples" + (f" of {steps} steps" if steps else "")
                               + " to choose its defaults from")
        best = min(lines, key=lambda line: line["fid"])
        defaults = setting_of(best)
        self.say(f"  defaults of {name}: {describe_setting(defaults)}, FID {best['fid']:.2f}, the lowest of "
                 f"{len(lines)} settings at {num:,} samples")
        return setting_values(defaults)

    def write_record(self, options: dict[str, Any]) -> dict[str, Any]:
        """The bundle's record: its scores, defaults, the sweep in words, its training's hardware and wall time."""
        from ddim.pretrained.bundle import write_record
        from ddim.pretrained.scores import score_from_eval, with_score

        name = options["model"]
        manifest = self.bundle(name)
        lines = self.eval_lines(name)
        source = expand(str(options.get("results", f"docs/results/{name}-eval.jsonl")), self.settings)
        record = BundleRecord.from_dict(manifest.record)
        for line in lines:
            record = with_score(record, score_from_eval(line, source))
        chosen = read_marker(self.out, options["defaults"]) if options.get("defaults") else None
        if chosen is not None:
            best = setting_of(chosen["result"])
            # The settings the defaults were chosen among (one step count's, for a consistency student), no others.
            record = record.with_defaults(best).replace(
                guidance=sweep_words(best, self.candidates(self.recipe.stage(options["defaults"]).choose, lines)))
        record = record.replace(**self.trained_words(options))
        if options.get("sample_time"):
            record = record.replace(sample_time=self.sample_time(name, options["sample_time"]))
        record = record.replace(recipe=" ".join([
            "python benchmarks/rebuild.py", self.recipe.name, *(["--smoke"] if self.smoke else []),
            *(f"--set {shlex.quote(f'{key}={value}')}" for key, value in self.overrides.items())]))
        record = record.replace(**{key: expand(str(value), self.settings)
                                   for key, value in (options.get("words") or {}).items()})
        results = self.out / "results" / Path(source).name
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
        write_record(manifest, record.to_dict())
        self.say(f"  record of {name}: {len(lines)} scores, the raw lines in {results} (ship it as {source})")
        return {"scores": len(lines), "results": str(results)}

    def trained_words(self, options: dict[str, Any]) -> dict[str, str]:
        """The record's ``hardware`` and ``wall_time``: of the ``trained`` stages' markers (none without them)."""
        trained = [read_marker(self.out, stage) or {} for stage in options.get("trained", ())]
        for stage, marker in zip(options.get("trained", ()), trained):
            records = (options.get("wall_time_from") or {}).get(stage)
            if records:  # the run's own account of its time, across every stop and resume
                marker["seconds"] = run_seconds(Path(expand(str(records), self.settings)))
        if not trained:
            return {}
        total = sum(float(m.get("seconds", 0.0)) for m in trained)
        parts = ", ".join(f"{stage} {duration(float(m.get('seconds', 0.0)))}"
                          for stage, m in zip(options["trained"], trained))
        return {"hardware": " and ".join(dict.fromkeys(m.get("hardware", "unrecorded") for m in trained)),
                "wall_time": f"{duration(total)} ({parts}; compilation, data cache and evaluations included)"}

    def sample_time(self, name: str, options: dict[str, Any]) -> dict[str, Any]:
        """The record's ``sample_time``: the newest ``benchmarks/cli_timing.py`` line of the bundle in ``lines``
        (this rebuild's timing file), noted as kept in ``results`` (where the project ships the line)."""
        from ddim.pretrained.scores import sample_time_from_line
        from ddim.workdir.records import read_records

        path = Path(expand(str(options["lines"]), self.settings))
        command = f"ddim sample --pretrained {name} "
        lines = [line for line in read_records(path) if str(line.get("command", "")).startswith(command)]
        if not lines:
            raise RebuildError(f"no timing of ddim sample --pretrained {name} in {path}")
        return sample_time_from_line(lines[-1], str(options.get("results", "docs/results/cli-timing.jsonl")))


def run_seconds(path: Path) -> float:
    """The wall seconds a run's records add up to (``ddim distill``'s ``distill.jsonl``: one line per stretch of
    steps between two starts or stops)."""
    from ddim.workdir.records import read_records

    if not path.is_file():
        raise RebuildError(f"no run records at {path} to take the wall time from")
    return float(sum(float(line.get("seconds", 0.0)) for line in read_records(path)))


class StageFailed(RebuildError):
    def __init__(self, code: int, message: str, printed_error: bool):
        super().__init__(message)
        self.code, self.printed_error = code, printed_error


def defaults_options(defaults: dict[str, Any]) -> list[str]:
    """``ddim eval`` options that sample with ``defaults`` (a ``choose`` stage's result, as a record writes a
    setting) whatever the model's own defaults are."""
    return setting_of(defaults).cli_options(skip_defaults=False)


def sweep_words(best: SamplingSpec, lines: list[dict[str, Any]]) -> str:
    """How the defaults were chosen, for the record: the best setting, then every other one measured."""
    num = lines[0]["num"]
    fid = {setting_of(line): line["fid"] for line in lines}
    others = "; ".join(f"{describe_setting(setting)}: {value:.1f}" for setting, value in
                       sorted(fid.items(), key=lambda item: item[1]) if setting != best)
    text = (f"{best.guidance:g}, the lowest FID of {len(fid)} settings ({num:,} samples each): "
            f"{describe_setting(best)}, FID {fid[best]:.1f}")
    return text + (f"; against {others}" if others else "")


# --- the command ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help=f"the bundled model to rebuild ({', '.join(recipe_names())})")
    parser.add_argument("--out", type=Path, required=True, help="where everything goes (data, runs, bundles)")
    parser.add_argument("--smoke", action="store_true", help="the whole chain on a tiny model, in seconds")
    parser.add_argument("--until", metavar="STAGE", help="stop after this stage (to run a long chain a stage at a time)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="replace a setting of the recipe, e.g. dtype=bfloat16 (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the stages, their state and commands; run none")
    args = parser.parse_args(argv)
    try:
        overrides = {}
        for item in args.overrides:
            key, sep, value = item.partition("=")
            if not sep:
                raise RebuildError(f"--set {item!r} is not of the form KEY=VALUE")
            overrides[key.strip()] = value
        recipe = load_recipe(args.name)
        out = args.out.expanduser().absolute()
        rebuild = Rebuild(recipe, out, args.smoke, overrides)
        if args.list:
            print("\n".join(rebuild.listing()))
            return 0
        prepare_out(out, recipe, args.smoke, overrides)
        from filelock import FileLock, Timeout

        try:
            with FileLock(str(out / ".rebuild.lock"), timeout=0):
                started = time.perf_counter()
                ran = rebuild.run(args.until)
        except Timeout:
            raise RebuildError(f"another rebuild is running in {out}") from None
        print(f"{recipe.name}: {ran} stage(s) run in {duration(time.perf_counter() - started)}; bundles in "
              f"{out / 'bundles'}")
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
