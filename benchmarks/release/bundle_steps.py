"""The rebuild's own steps: ``choose`` (a bundle's defaults) and ``record`` (a bundle's record).

``choose`` takes the setting of lowest FID among the bundle's ``ddim eval`` lines at a number of samples (of one
step count with ``steps``). ``record`` writes into the bundle its scores from those lines, the chosen defaults,
the guidance sweep in words, the training stages' hardware and wall time (with ``wall_time_from``, a stage's as
its run's own records add it up), and the time of ``ddim sample`` that a ``benchmarks.speed.cli_timing`` stage
measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from ddim.pretrained.bundle_record import BundleRecord, setting_of, setting_values
from ddim.pretrained.render import describe_setting
from ddim.spec import SamplingSpec

from benchmarks.release.recipe_files import Recipe, RebuildError, expand
from benchmarks.release.stage_markers import duration, read_marker


class BundleSteps:
    """The ``choose`` and ``record`` steps of one rebuild (its recipe, ``out`` and settings)."""

    def __init__(self, recipe: Recipe, out: Path, settings: dict[str, str], recipe_command: str,
                 say: Callable[[str], None] = print):
        self.recipe, self.out, self.settings = recipe, out, settings
        self.recipe_command = recipe_command
        """The command that rebuilds this bundle, for its record."""
        self.say = say

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
        record = self.with_defaults(record, options, lines)
        record = record.replace(**self.trained_words(options))
        if options.get("sample_time"):
            record = record.replace(sample_time=self.sample_time(name, options["sample_time"]))
        record = record.replace(recipe=self.recipe_command)
        record = record.replace(**{key: expand(str(value), self.settings)
                                   for key, value in (options.get("words") or {}).items()})
        results = self.out / "results" / Path(source).name
        results.parent.mkdir(parents=True, exist_ok=True)
        # The shipped lines name the bundle, not where this machine kept it.
        shipped = [{**line, "checkpoint": f"pretrained:{name}"} for line in lines]
        results.write_text("".join(json.dumps(line) + "\n" for line in shipped), encoding="utf-8")
        write_record(manifest, record.to_dict())
        self.say(f"  record of {name}: {len(lines)} scores, the raw lines in {results} (ship it as {source})")
        return {"scores": len(lines), "results": str(results)}

    def with_defaults(self, record: BundleRecord, options: dict[str, Any], lines: list[dict[str, Any]]):
        """``record`` with the defaults the ``defaults`` stage chose, and the sweep they were chosen from in words."""
        chosen = read_marker(self.out, options["defaults"]) if options.get("defaults") else None
        if chosen is None:
            return record
        best = setting_of(chosen["result"])
        # The settings the defaults were chosen among (one step count's, for a consistency student), no others.
        among = self.candidates(self.recipe.stage(options["defaults"]).choose, lines)
        return record.with_defaults(best).replace(guidance=sweep_words(best, among))

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
        """The record's ``sample_time``: the newest ``benchmarks.speed.cli_timing`` line of the bundle in ``lines``
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
