"""Distilled students beside their teacher: FID, KID and class accuracy per network pass, and what each costs.

Run:  python -m benchmarks.studies.distill --students runs/flowers32-distilled --teacher pretrained:flowers32 \
          --out /tmp/distill32 [--num 1000 5000] [--guidance 1 1.5 2 2.5] [--teacher-guidance 1.5 2]
          [--teacher-num 1000] [--teacher-path 16 32 64] [--student-steps 8 4 2 1] [--clip] [--time]

Every row is ``ddim eval``'s protocol (benchmarks.common: all real images at the model's size, the standard
FID Inception, KID over all samples, class accuracy for a class-conditional model), with ``--num`` samples:

- for every step count N of the students in ``<students>/students/`` (every phase's: stage one's, each round's,
  or the one consistency student's counts; ``--student-steps`` picks some), the teacher at N network passes:
  deterministic DDIM and DPM-Solver++(2M) on the log-SNR grid, unguided (guidance 1, N steps of one pass) and
  guided at the first ``--teacher-guidance`` (N/2 steps of two passes), and the student: its N steps of one
  network pass each (DDIM, or consistency sampling), at every ``--guidance`` scale (the first ``--num``); the
  scale with the lowest FID there is then measured at the other ``--num`` too;
- the path the students are taught: the teacher's guided DDIM steps on the uniform grid at every
  ``--teacher-guidance`` (a student is held to the path at its own best scale), ``--teacher-path`` steps of two
  passes each (the first ``--num``);
- with ``--clip``, every student at its best scale and the teacher's path at the first ``--teacher-guidance`` again,
  each step's image prediction clipped to the pixels' range (``SamplingSpec.clip``);
- the teacher's defaults (a bundled model's best measured setting: for flowers32 20 steps of dpmpp-2m, guidance
  1.75, 40 passes), at every ``--teacher-num`` (default: ``--num``).

``--step-cost CONFIG`` instead measures what one optimiser step of each kind costs with the teacher and the
``[distill]`` settings of CONFIG (stage one, a round, consistency distillation): the process's CPU seconds per
step, each kind's steps interleaved with the others', after one that compiles; to size runs of equal CPU time.

``--time`` adds the seconds 16 images take on this machine once compiled (the median of three calls of
``Pipeline.generate``, after one that compiles): measure them on an otherwise idle machine. The training cost
of each round is read from the students' ``distill.jsonl``. Results go to ``<out>/distill.jsonl`` (a rerun skips
what is done) and a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import ddim  # sets the XLA flags before JAX starts
from ddim import runtime
from ddim.workdir import Workdir
from ddim.workdir.records import append_record, read_records

from benchmarks.common import log, score_fid

if __name__ == "__main__":
    runtime.restart_with_fast_allocator()  # the allocator the `ddim` command runs with

RESULTS = "distill.jsonl"
SOLVERS = (("ddim", "uniform"), ("dpmpp-2m", "logsnr"))
TEACHER_PATH = (16, 32, 64)
KEYS = ("model", "passes", "steps", "sampler", "spacing", "guidance", "num", "clip")


def key(row: dict) -> tuple:
    return tuple(row.get(name, False) if name == "clip" else row[name] for name in KEYS)


def find_students(root: Path) -> dict[int, Path]:
    """The students of a ``ddim distill`` work directory by every step count they sample with."""
    found = {}
    for path in sorted(Workdir(root).students.glob("*")):
        if Workdir(path).checkpoints.is_dir():
            found.update({steps: path for steps in ddim.load(path).rules.step_counts})
    return found


def passes(spec) -> int:
    """Network passes per image: one per step, two with classifier-free guidance (1 needs no second pass)."""
    return spec.steps * (2 if spec.guidance not in (None, 1.0) else 1)


def measure(label: str, source, spec, num: int, out: Path, done: dict, student: bool = False,
            feature_extractor_factory=None) -> dict:

    row = {"model": label, "passes": spec.steps if student else passes(spec), "steps": spec.steps,
           "sampler": spec.sampler, "spacing": spec.spacing, "guidance": spec.guidance, "num": num, "clip": spec.clip}
    if key(row) in done:
        return done[key(row)]
    log(f"{label}: {num} samples, {spec.steps} {spec.sampler}/{spec.spacing} steps, guidance {spec.guidance}"
        + (", clipped" if spec.clip else ""))
    record = score_fid(source, spec, num, out, feature_extractor_factory=feature_extractor_factory)
    row.update(source=str(source), step=record["step"], fid=record["fid"], kid=record["kid_mean"],
               class_accuracy=record.get("class_accuracy"), ceiling=record.get("real_val_class_accuracy"),
               real_num=record["real_num"], fid_feature_net=record["fid_feature_net"],
               eval_seconds=record["wall_time_s"])
    append_record(out / RESULTS, row)
    done[key(row)] = row
    return row


def seconds_for_16(source, spec, repeats: int = 3) -> float:
    """The median seconds of ``Pipeline.generate(16)`` once compiled."""
    pipe = ddim.load(source)
    pipe.generate(16, spec=spec, seed=0)
    times = []
    for seed in range(1, repeats + 1):
        started = time.perf_counter()
        pipe.generate(16, spec=spec, seed=seed)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def training_cost(students: Path) -> list[dict]:
    """Optimiser steps and wall seconds of each phase, summed over the stretches ``distill.jsonl`` records."""
    phases: dict[tuple, dict] = {}
    for record in read_records(Workdir(students).distill_file)[1:]:
        phase = phases.setdefault((record["phase"], record["student_steps"]),
                                  {"phase": record["phase"], "student_steps": record["student_steps"], "steps": 0,
                                   "seconds": 0.0})
        phase["steps"] += record["to_step"] - record["from_step"]
        phase["seconds"] += record["seconds"]
    return list(phases.values())


def random_batch(teacher, batch_size: int) -> dict:
    """A batch of random images of the loaded ``teacher``'s size with its classes in turn: what a step costs does
    not depend on the pixels."""
    import numpy as np

    rng = np.random.default_rng(0)
    return {"image": rng.integers(0, 256, (batch_size, *teacher.image_shape), dtype=np.uint8),
            "label": (np.arange(batch_size) % max(teacher.config.model.num_classes, 1)).astype(np.int32)}


def step_costs(teacher_source: str, config_file: str, repeats: int = 4, steps: int = 3) -> dict[str, float]:
    """The median CPU seconds of one distillation step of each kind (module docstring), on a batch of random
    images of the teacher's size with its classes; a round's teacher is a stage-one student as it starts."""
    import jax

    from ddim.distill import plan as plan_lib
    from ddim.distill.loop import run_config
    from ddim.distill.step import StepSettings, create_student_state, distill_step
    from ddim.model import DiffusionModel

    teacher = ddim.load(teacher_source)
    model = teacher.config.model
    base = run_config(teacher.config, config_file)
    batch_size = base.distill.batch_size
    batch = random_batch(teacher, batch_size)
    jobs = {}
    for method in ("progressive", "consistency"):
        config = run_config(teacher.config, config_file, [f"distill.method={method}"])
        phases = plan_lib.plan(model, config)
        for phase in phases[:2]:
            student = DiffusionModel(plan_lib.student_model(model, config, phase))
            state = create_student_state(student, teacher.variables, config, phase, jax.random.key(0))
            if phase.kind == plan_lib.ROUND and phases[0].kind == plan_lib.GUIDANCE_STAGE:
                first = DiffusionModel(plan_lib.student_model(model, config, phases[0]))
                teacher_model, teacher_variables = first, {"params": state.params, "batch_stats": state.batch_stats}
            else:
                teacher_model, teacher_variables = teacher.model, teacher.variables
            settings = StepSettings.of(student, teacher_model, config, phase)
            step = jax.jit(lambda s, t, b, r, settings=settings: distill_step(s, t, b, r, settings))
            jobs[phase.kind] = [step, state, teacher_variables]
    for job in jobs.values():  # compile
        job[1], metrics = job[0](job[1], job[2], batch, jax.random.key(1))
        jax.block_until_ready(metrics)
    seconds = {kind: [] for kind in jobs}
    for _ in range(repeats):
        for kind, job in jobs.items():
            started = time.process_time()
            for _ in range(steps):
                job[1], metrics = job[0](job[1], job[2], batch, jax.random.key(1))
            jax.block_until_ready(metrics)
            seconds[kind].append((time.process_time() - started) / steps)
    return {kind: statistics.median(values) for kind, values in seconds.items()}


def table(rows: list[dict]) -> str:
    lines = ["| model | passes | steps | sampler | guidance | samples | FID | KID | class acc. | s / 16 images |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in sorted(rows, key=lambda r: (r["passes"], r["model"] != "student", r["num"], r["fid"])):
        accuracy = f"{100 * row['class_accuracy']:.1f} %" if row.get("class_accuracy") is not None else ""
        seconds = f"{row['seconds_16']:.2f}" if row.get("seconds_16") is not None else ""
        sampler = f"{row['sampler']}/{row['spacing']}" + (" clipped" if row.get("clip") else "")
        lines.append(f"| {row['model']} | {row['passes']} | {row['steps']} | {sampler} | "
                     f"{row['guidance'] if row['guidance'] is not None else 1:g} | {row['num']:,} | {row['fid']:.1f} | "
                     f"{row['kid']:.4f} | {accuracy} | {seconds} |")
    return "\n".join(lines)


def parse_args(argv) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=Path, help="the work directory of ddim distill")
    parser.add_argument("--teacher", required=True, help="the teacher: pretrained:NAME or a checkpoint")
    parser.add_argument("--out", type=Path, help="results, eval.jsonl and the real features' cache")
    parser.add_argument("--step-cost", metavar="CONFIG", help="only measure the CPU seconds of a step of each kind "
                        "with CONFIG's [distill] settings")
    parser.add_argument("--num", type=int, nargs="+", default=[1000, 5000], help="samples per measurement")
    parser.add_argument("--guidance", type=float, nargs="+", default=[1.0, 1.5, 2.0, 2.5],
                        help="the students' guidance scales (the first --num; the best also at the others)")
    parser.add_argument("--teacher-guidance", type=float, nargs="+", default=[1.5],
                        help="the scales of the teacher's guided path; its guided rows at the students' passes take "
                        "the first")
    parser.add_argument("--teacher-num", type=int, nargs="+", help="samples of the teacher's defaults (default: "
                        "--num; its 5,000 come from `ddim eval --pretrained NAME --num 5000 --split all` too)")
    parser.add_argument("--student-steps", type=int, nargs="+", help="the students' step counts to score "
                        "(default: every student there is)")
    parser.add_argument("--teacher-path", type=int, nargs="*", default=list(TEACHER_PATH),
                        help="step counts of the teacher's guided DDIM path to score")
    parser.add_argument("--clip", action="store_true", help="also score the students at their best scale and the "
                        "teacher's path at the first --teacher-guidance with the image prediction clipped")
    parser.add_argument("--time", action="store_true", help="also time 16 images per row (on an idle machine)")
    return parser, parser.parse_args(argv)


def print_step_costs(teacher: str, config_file: str) -> list[dict]:
    costs = step_costs(teacher, config_file)
    first = next(iter(costs))
    for kind, seconds in costs.items():
        print(f"- {kind}: {seconds:.2f} CPU s a step, {seconds / costs[first]:.2f} times a {first} step")
    return [{"kind": kind, "cpu_seconds": seconds} for kind, seconds in costs.items()]


def rows_at(steps: int, args, score, students: dict[int, Path]) -> list[dict]:
    """The rows at ``steps`` network passes: the teacher's solvers unguided and guided, then the student's sweep of
    guidance scales, its best scale at the other ``--num`` (and clipped, with ``--clip``)."""
    from ddim.spec import SamplingSpec

    first, *more = args.num
    rows = []
    for sampler, spacing in SOLVERS:
        rows.append(score("teacher", args.teacher,
                          SamplingSpec(steps=steps, sampler=sampler, spacing=spacing, guidance=1.0), first))
        if steps >= 2:
            guided = SamplingSpec(steps=steps // 2, sampler=sampler, spacing=spacing, guidance=args.teacher_guidance[0])
            rows.append(score("teacher", args.teacher, guided, first))
    source = students.get(steps)
    if source is None:
        log(f"no {steps}-step student in {args.students} (yet): only the teacher's rows")
        return rows
    own = ddim.load(source).defaults.replace(steps=steps)  # its own sampler
    sweep = [score("student", source, own.replace(guidance=g), first, True) for g in args.guidance]
    best = own.replace(guidance=min(sweep, key=lambda row: row["fid"])["guidance"])
    rows += sweep
    rows += [score("student", source, best, num, True) for num in more]
    if args.clip:
        rows.append(score("student", source, best.replace(clip=True), first, True))
    return rows


def teacher_path_rows(args, score) -> list[dict]:
    """The path the students are taught: the teacher's guided DDIM steps at every ``--teacher-guidance``."""
    from ddim.spec import SamplingSpec

    rows = []
    for number, scale in enumerate(args.teacher_guidance):
        for steps in args.teacher_path:
            path = SamplingSpec(steps=steps, guidance=scale)
            clipped = args.clip and number == 0  # clipping's effect on the path, at one scale
            rows += [score("teacher", args.teacher, spec, args.num[0])
                     for spec in [path] + [path.replace(clip=True)] * clipped]
    return rows


def add_times(rows: list[dict], args, students: dict[int, Path]) -> None:
    """Each row's seconds for 16 images on this machine, where it has none yet (recorded as it is measured)."""
    from ddim.spec import SamplingSpec

    for row in rows:
        if row.get("seconds_16") is None:
            source = students[row["steps"]] if row["model"] == "student" else args.teacher
            spec = SamplingSpec(steps=row["steps"], sampler=row["sampler"], spacing=row["spacing"],
                                guidance=row["guidance"], clip=row.get("clip", False))
            row["seconds_16"] = seconds_for_16(source, spec)
            append_record(args.out / RESULTS, row)


def main(argv=None, feature_extractor_factory=None) -> list[dict]:
    """Measure what is missing, print the table and the training cost; returns the rows. ``feature_extractor_factory``
    replaces the FID Inception (tests only)."""
    parser, args = parse_args(argv)
    if args.step_cost:
        return print_step_costs(args.teacher, args.step_cost)
    if args.students is None or args.out is None:
        parser.error("--students and --out are needed (all but --step-cost)")
    args.out.mkdir(parents=True, exist_ok=True)
    done = {key(row): row for row in read_records(args.out / RESULTS)}

    def score(label, source, spec, num, student=False):
        return measure(label, source, spec, num, args.out, done, student, feature_extractor_factory)

    students = find_students(args.students)
    rows = [row for steps in args.student_steps or sorted(students, reverse=True)
            for row in rows_at(steps, args, score, students)]
    rows += teacher_path_rows(args, score)
    rows += [score("teacher", args.teacher, ddim.load(args.teacher).defaults, num)
             for num in args.teacher_num or args.num]
    rows = list({key(row): row for row in rows}.values())  # a path row can be a row at some passes too
    if args.time:
        add_times(rows, args, students)
    print(table(rows))
    print()
    for phase in training_cost(args.students):
        student = "" if phase["phase"] == "consistency" else \
            f" {phase['student_steps']} step" + ("s" if phase["student_steps"] != 1 else "")
        print(f"- {phase['phase']}{student}: {phase['steps']:,} optimiser steps, {phase['seconds'] / 60:.1f} min")
    return rows


if __name__ == "__main__":
    main()
