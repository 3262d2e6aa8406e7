"""Consistency tuning part by part, and mid-training, against the 2023 recipe at equal CPU time: FID, KID, accuracy.

Run:  python -m benchmarks.studies.consistency_ablation --out runs/consistency-ablation
          [--teacher pretrained:flowers32] [--config consistency32] [--steps 1000] [--stage-steps 250]
          [--variants tune cd2023 ...] [--passes 1 2 4] [--guidance 1.5 2] [--num 1000]

Every variant distils the same teacher from the same ``[distill]`` config (``--config``) with a few settings
changed (:data:`VARIANTS`): consistency tuning (:data:`TUNING`), Song et al. 2023's recipe (``cd2023``: the
teacher's grid, the squared error, equal weights; ``ddim distill --method consistency``'s defaults), and the tuning
recipe with one part switched back at a time, continuous-time consistency distillation (``scd``, Lu & Song 2024),
and the 2023 recipe after consistency mid-training (``cmt``, Hu et al. 2025). Each trains ``--steps`` optimiser
steps with gaps shrinking every ``--stage-steps``, except where a step costs another CPU time: ECT's own pairs
(``tune-data``: no teacher in the step) and ``scd`` (a Jacobian-vector product through the student) train for the
steps the same CPU seconds buy, from the CPU seconds per step measured here first (``<out>/step-costs.json``). ``cmt`` spends the same
CPU seconds as ``--steps`` steps of the 2023 recipe in all: banking :data:`CMT_BANK_SIZE` trajectories of the
teacher (the CPU seconds of one, measured by solving a batch as the run does), :data:`CMT_MIDTRAINING_STEPS` steps
of mid-training (measured as the other steps), and the consistency steps that what is left buys
(:func:`cmt_steps`; by a count of network passes about 700 of 1,000 are left, a trajectory's 16 guided passes
costing a sixth of a consistency step and a mid-training step half of one). Its table row counts both phases'
steps.

Then each student is scored at every ``--passes`` count and ``--guidance`` scale with ``--num`` samples, ``ddim
eval``'s protocol (benchmarks.common: all real images at the model's size, the standard FID Inception, KID over all
samples, class accuracy); ``tune-data`` learns no guidance (it is trained at scale 1), so it is scored at 1.
Results go to ``<out>/distill.jsonl`` (a rerun skips what is done: ``ddim distill`` resumes its run, a scored row
is not scored again) and a Markdown table is printed. Ctrl-C stops; the same command goes on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import ddim  # sets the XLA flags before JAX starts
from ddim.pretrained.registry import pretrained_name
from ddim.spec import SamplingSpec
from ddim.workdir import Workdir
from ddim.workdir.records import read_records

from benchmarks.common import ddim_command, log
from benchmarks.studies.distill import RESULTS, key, measure, random_batch, training_cost

COSTS = "step-costs.json"
TUNING = ['distill.consistency_times="continuous"', 'distill.consistency_loss="pseudo-huber"',
          'distill.consistency_weighting="inverse-gap"']
"""Consistency tuning's settings; the ``consistency_*`` defaults are Song et al. 2023's recipe."""
CD2023 = ['distill.consistency_times="grid"', 'distill.consistency_loss="squared"',
          'distill.consistency_weighting="uniform"']
"""Song et al. 2023's recipe, spelled out."""
SCD = ['distill.consistency_times="tangent"', "distill.consistency_time_mean=-0.31",
       "distill.consistency_time_std=1.4"]
"""Continuous-time consistency distillation (Lu & Song 2024, sCD): the tangent along the guided teacher's path, its
angles' ``tan`` log-normal with sCM's P_mean -1.0 and P_std 1.4, rescaled to unit-variance data (-1.0 + ln 2)."""
CMT_BANK_SIZE = 1024
"""The cmt variant's banked trajectories: 16 points each on consistency32's grid, twice the points its
mid-training draws (250 steps of 32), so most trajectories are drawn from several times and few points twice."""
CMT_MIDTRAINING_STEPS = 250
"""The cmt variant's steps of mid-training, a quarter of the 2023 recipe's 1,000."""
VARIANTS = {
    "tune": ("consistency tuning: continuous levels, shrinking gap, pseudo-Huber, 1 / (t - r), teacher's pairs",
             TUNING),
    "cd2023": ("Song et al. 2023: the teacher's grid, squared error, equal weights", CD2023),
    "tune-schedule": ("tuning with first levels uniform in the schedule's time instead of log-normal",
                      [*TUNING, 'distill.consistency_levels="schedule"']),
    "tune-data": ("tuning with ECT's own pairs: the same image and noise, no teacher",
                  [*TUNING, 'distill.consistency_pair="data"']),
    "tune-squared": ("tuning with the squared error", [*TUNING, 'distill.consistency_loss="squared"']),
    "tune-uniform": ("tuning with equal weights", [*TUNING, 'distill.consistency_weighting="uniform"']),
    "tune-grid": ("tuning's loss and weights on the teacher's grid", [*TUNING, 'distill.consistency_times="grid"']),
    "scd": ("continuous-time consistency distillation: the tangent along the guided teacher's path", SCD),
    "cmt": ("Song et al. 2023 after consistency mid-training on banked trajectories of the teacher",
            [*CD2023, f"distill.consistency_midtraining_steps={CMT_MIDTRAINING_STEPS}",
             f"distill.consistency_bank_size={CMT_BANK_SIZE}"]),
}
UNGUIDED = {"tune-data"}
"""Variants trained at guidance 1 alone: scored there."""


def median_cpu_seconds(call: Callable[[], Any], repeats: int, calls: int) -> float:
    """The median over ``repeats`` of the CPU seconds of one of ``calls`` calls of ``call`` (which returns what to
    wait for), after one that compiles."""
    import statistics

    import jax

    jax.block_until_ready(call())
    seconds = []
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(calls):
            result = call()
        jax.block_until_ready(result)
        seconds.append((time.process_time() - started) / calls)
    return statistics.median(seconds)


def step_cost(teacher: str, config: str, settings: list[str], repeats: int = 3, steps: int = 3) -> float:
    """The median CPU seconds of one step of the run's first phase with ``settings``: consistency distillation's,
    or mid-training's where they turn it on (on a batch of random banked points)."""
    import jax
    import numpy as np

    from ddim import parallel
    from ddim.distill import plan as plan_lib
    from ddim.distill.loop import run_config
    from ddim.distill.step import StepSettings, compiled_step, create_student_state
    from ddim.model import DiffusionModel

    loaded = ddim.load(teacher)
    model = loaded.config.model
    run = run_config(loaded.config, config, ["distill.method=consistency", *settings])
    phase = plan_lib.plan(model, run)[0]
    student = DiffusionModel(plan_lib.student_model(model, run, phase))
    state = create_student_state(student, loaded.variables, run, phase, jax.random.key(0))
    step = compiled_step(StepSettings.of(student, loaded.model, run, phase), parallel.data_mesh())
    batch = random_batch(loaded, run.distill.batch_size)
    if phase.kind == plan_lib.MIDTRAINING:
        rng, size = np.random.default_rng(0), run.distill.batch_size
        batch = {"state": rng.standard_normal((size, *loaded.image_shape), np.float32),
                 "index": rng.integers(1, phase.grid_steps + 1, size).astype(np.int32),
                 "end": rng.standard_normal((size, *loaded.image_shape), np.float32), "label": batch["label"],
                 "guidance": np.full(size, 1.5, np.float32)}
    holder = [state]

    def one_step():
        holder[0], metrics = step(holder[0], loaded.variables, batch, jax.random.key(1))
        return metrics

    return median_cpu_seconds(one_step, repeats, steps)


def bank_cost(teacher: str, config: str, repeats: int = 3) -> float:
    """The median CPU seconds of banking one trajectory: the teacher's guided DDIM path on the ``start_steps`` grid,
    solved ``batch_size`` at a time as a run solves them (:func:`ddim.distill.bank.trajectory_solver`)."""
    import jax
    import numpy as np

    from ddim.distill import bank as bank_lib
    from ddim.distill.loop import run_config

    loaded = ddim.load(teacher)
    d = run_config(loaded.config, config, ["distill.method=consistency"]).distill
    solver = bank_lib.trajectory_solver(loaded.model, d.start_steps)
    labels = random_batch(loaded, d.batch_size)["label"]
    guidance = np.full(d.batch_size, 1.5, np.float32)
    return median_cpu_seconds(lambda: solver(loaded.variables, jax.random.key(0), labels, guidance), repeats,
                              1) / d.batch_size


def cmt_steps(steps: int, costs: dict[str, float]) -> int:
    """The cmt variant's consistency steps: what is left of ``steps`` steps of the 2023 recipe in CPU seconds after
    banking :data:`CMT_BANK_SIZE` trajectories and :data:`CMT_MIDTRAINING_STEPS` steps of mid-training."""
    budget = steps * costs["teacher"]
    left = budget - CMT_BANK_SIZE * costs["bank"] - CMT_MIDTRAINING_STEPS * costs["midtraining"]
    if left < costs["teacher"]:
        raise SystemExit(f"error: {steps} steps' CPU seconds ({budget:.0f}) do not cover the cmt variant's banking "
                         f"and mid-training; give more --steps")
    return round(left / costs["teacher"] / 10) * 10


def steps_of(args, out: Path) -> dict[str, int]:
    """Each variant's optimiser steps (the consistency phase's): ``--steps``, or what the same CPU seconds buy where
    a step costs more or less, or what is left of them after banking and mid-training (costs measured once, kept in
    ``<out>/step-costs.json``: CPU seconds per step, and per banked trajectory)."""
    costs_file = out / COSTS
    costs = json.loads(costs_file.read_text()) if costs_file.is_file() else {}
    kinds = {"teacher": ("a step with the teacher's pairs", []),
             "data": ("a step with the data's pairs", ['distill.consistency_pair="data"']),
             "tangent": ("a step with the tangent", ['distill.consistency_times="tangent"']),
             "midtraining": ("a step of mid-training", ["distill.consistency_midtraining_steps=1"])}
    for kind, (words, settings) in kinds.items():
        if kind not in costs:
            costs[kind] = step_cost(args.teacher, args.config, settings)
            log(f"{words}: {costs[kind]:.2f} CPU seconds")
            costs_file.write_text(json.dumps(costs, indent=2) + "\n")
    if "bank" not in costs:
        costs["bank"] = bank_cost(args.teacher, args.config)
        log(f"a banked trajectory: {costs['bank']:.3f} CPU seconds")
        costs_file.write_text(json.dumps(costs, indent=2) + "\n")
    steps = {}
    for name, (_, settings) in VARIANTS.items():
        kind = ("data" if 'distill.consistency_pair="data"' in settings else
                "tangent" if 'distill.consistency_times="tangent"' in settings else "teacher")
        steps[name] = round(args.steps * costs["teacher"] / costs[kind] / 10) * 10
    steps["cmt"] = cmt_steps(args.steps, costs)
    return steps


def teacher_options(teacher: str) -> list[str]:
    """``ddim distill``'s options naming ``teacher`` (``pretrained:NAME`` or a work directory)."""
    name = pretrained_name(teacher)
    return ["--pretrained", name] if name is not None else ["--workdir", teacher]


def distill(args, name: str, steps: int, out: Path) -> Path:
    """Run (or resume) variant ``name``'s distillation; its student's work directory."""
    workdir = out / name
    student = Workdir(workdir).student("consistency")
    if not Workdir(student).checkpoints.is_dir():
        settings = [f"distill.consistency_steps={steps}", f"distill.consistency_stage_steps={args.stage_steps}",
                    "train.eval_every=0", f"train.checkpoint_every={args.stage_steps}", *VARIANTS[name][1]]
        command = ddim_command("distill", *teacher_options(args.teacher), "--config", args.config, "--out", str(workdir),
                               *[word for setting in settings for word in ("--set", setting)])
        log(f"{name}: {' '.join(command[2:])}")
        if subprocess.run(command).returncode != 0:
            raise SystemExit(f"error: the distillation of {name} failed (the same command resumes it)")
    return student


def score(args, name: str, student: Path, steps: int, out: Path, done: dict) -> list[dict]:
    rows = []
    cost = training_cost(out / name)
    guidance = [1.0] if name in UNGUIDED else args.guidance
    for passes in args.passes:
        for scale in guidance:
            spec = SamplingSpec(steps=passes, sampler="consistency", guidance=scale)
            row = measure(name, student, spec, args.num, out, done, student=True)
            row.update(optimizer_steps=steps, train_seconds=sum(phase["seconds"] for phase in cost))
            if name == "cmt":
                row.update(midtraining_steps=CMT_MIDTRAINING_STEPS, banked_trajectories=CMT_BANK_SIZE)
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| variant | steps | passes | guidance | samples | FID | KID | class acc. |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        accuracy = f"{100 * row['class_accuracy']:.1f} %" if row.get("class_accuracy") is not None else ""
        steps = f"{row['optimizer_steps']:,}"
        if row.get("midtraining_steps"):
            steps = f"{row['midtraining_steps']:,} + {steps}"
        lines.append(f"| {row['model']} | {steps} | {row['passes']} | {row['guidance']:g} | "
                     f"{row['num']:,} | {row['fid']:.1f} | {row['kid']:.4f} | {accuracy} |")
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the runs, results and the real features' cache")
    parser.add_argument("--teacher", default="pretrained:flowers32", help="pretrained:NAME or a checkpoint")
    parser.add_argument("--config", default="consistency32", help="the [distill] config every variant starts from")
    parser.add_argument("--steps", type=int, default=1000, help="optimiser steps of a variant with the teacher's pairs")
    parser.add_argument("--stage-steps", type=int, default=250, help="optimiser steps per stage of the gap")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--passes", type=int, nargs="+", default=[1, 2, 4], help="network passes to score")
    parser.add_argument("--guidance", type=float, nargs="+", default=[1.5, 2.0], help="guidance scales to score")
    parser.add_argument("--num", type=int, default=1000, help="samples per score")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    steps = steps_of(args, out)
    done = {key(row): row for row in read_records(out / RESULTS)}
    rows = []
    for name in args.variants:
        student = distill(args, name, steps[name], out)
        rows += score(args, name, student, steps[name], out, done)
    print(table(rows))


if __name__ == "__main__":
    sys.exit(main())
