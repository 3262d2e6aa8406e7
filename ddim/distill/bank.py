"""The trajectory bank of consistency mid-training and of the trajectory phase: the guided teacher's ODE solved
once, stored, and drawn from.

Consistency mid-training (:mod:`ddim.distill.targets_consistency`) regresses the student on the points of the
teacher's trajectories, the trajectory phase of progressive distillation on their points at its student's grid
times (:func:`ddim.distill.targets.trajectory_target`). They are solved once, when that phase starts, in jitted
batches of ``distill.batch_size`` trajectories, and kept in ``<workdir>/trajectories.npz``, so that a resumed run
reads them instead of solving them again. The file holds:

- ``states``: float16 ``(K, N, H, W, C)``, trajectory ``k``'s point at ``t_n = n / N`` at ``[k, n - 1]``, in the
  model's normalised units. float16 halves the file (200 MB for 2048 trajectories of 16 steps at 32x32), and its
  rounding, a thousandth of these unit-variance numbers, is far below the noise in the student's inputs;
- ``ends``: float32 ``(K, H, W, C)``, each trajectory's end, the teacher's DDIM sample of its noise;
- ``labels`` (int32, the teacher's class ids, -1 the null class) and ``guidance`` (float32), ``(K,)`` each;
- ``settings``: what made it (:class:`BankSettings` as JSON). A bank made with other settings is solved again.

A bank is written under a temporary name and renamed into place, so a write that stops half way leaves nothing
to read. While it is solved (at 64x64, an hour or more for 16,384 trajectories on a CPU), its finished rows are
written about every minute as parts (``<workdir>/trajectories.parts/``, with the settings that made them), so a run
stopped while banking (Ctrl-C) solves only the rest when resumed; the parts go when the whole bank is written.

Every draw, the bank's (its noise, images whose classes it takes, guidance scales) and each step's batch, is a
function of ``distill.seed`` (and the step), so a bank solved again, and a resumed run, draw the same.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ddim.config import Config
from ddim.distill import targets
from ddim.distill import targets_consistency as consistency
from ddim.model import DiffusionModel, bind_denoiser
from ddim.train.state import class_condition

FORMAT = 1
"""The layout of the file; a bank of another layout is solved again."""
PART_SECONDS = 60.0
"""Seconds of solving between two parts written while a bank is solved: what a stop loses at most."""
BANK_STREAM = 0x62616E6B
"""Folded into ``distill.seed``'s key for the bank's draws, apart from the steps' own keys."""


@dataclass(frozen=True)
class BankSettings:
    """Everything a bank's contents depend on: a stored bank is used only when all of it matches the run's."""

    teacher: str
    """The teacher as ``distill.jsonl`` names it, and its step."""
    teacher_step: int | None
    size: int
    grid_steps: int
    batch_size: int
    """Trajectories solved together: each batch's noise is drawn with its own key."""
    seed: int
    guidance: tuple[float, ...]
    """``(guidance_min, guidance_max, *focus)``: the range and focus the scales are drawn from."""
    label_dropout: float
    image_shape: tuple[int, ...]
    format: int = FORMAT

    @classmethod
    def of(cls, config: Config, teacher: str, teacher_step: int | None, model: DiffusionModel) -> "BankSettings":
        d = config.distill
        focus = tuple(d.guidance_focus) if d.guidance_sampling == "focused" else ()
        return cls(teacher, teacher_step, d.consistency_bank_size, d.start_steps, d.batch_size, d.seed,
                   (d.guidance_min, d.guidance_max, *focus), d.label_dropout, tuple(model.image_shape))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


class Bank(NamedTuple):
    """Banked trajectories (module docstring): ``states``, ``ends``, ``labels``, ``guidance``."""

    states: np.ndarray
    ends: np.ndarray
    labels: np.ndarray
    guidance: np.ndarray


def draw_keys(seed: int):
    """The keys of the bank's draws: ``(images, guidance, label dropout, noise)``."""
    return jax.random.split(jax.random.fold_in(jax.random.key(seed), BANK_STREAM), 4)


def noise_key(settings: BankSettings, batch_index: int):
    """The key of batch ``batch_index``'s starting noise, ``normal(key, (batch_size, H, W, C))``."""
    return jax.random.fold_in(draw_keys(settings.seed)[3], batch_index)


@functools.cache
def trajectory_solver(teacher: DiffusionModel, steps: int):
    """``solve(variables, key, labels, guidance) -> (states (B, steps, H, W, C) float16, ends float32)``, jitted:
    the teacher's guided DDIM paths from ``normal(key)`` (:func:`~ddim.distill.targets_consistency.teacher_trajectory`);
    ``labels`` and ``guidance`` are ignored by an unconditional teacher."""
    conditional = teacher.config.class_conditional

    def solve(variables, key, labels, guidance):
        noise = jax.random.normal(key, (labels.shape[0], *teacher.image_shape), jnp.float32)
        cond = {"label": labels, "guidance": guidance} if conditional else None
        denoise = bind_denoiser(teacher, variables)
        states, ends = consistency.teacher_trajectory(lambda z, noise_rates, signal_rates: denoise(
            z, noise_rates, signal_rates, cond), teacher.objective.schedule, noise, steps)
        return jnp.moveaxis(states, 0, 1).astype(jnp.float16), ends

    return jax.jit(solve)


def solve(teacher: DiffusionModel, variables, settings: BankSettings, class_ids: Callable[[np.ndarray], np.ndarray],
          num_images: int, parts: Path | None = None, write_parts: bool = True,
          on_batch: Callable[[int, float], None] | None = None) -> Bank:
    """Solve the bank: ``settings.size`` trajectories, each with the class of a training image drawn uniformly (so
    the classes come as often as in the data, as in the batches of consistency distillation; ``class_ids(indices)``
    gives those images' classes as the teacher's ids), a ``label_dropout`` share of them the null class, and a
    guidance scale drawn as consistency distillation draws them (:func:`ddim.distill.targets.guidance_scales`).

    With ``parts`` (a folder), the rows solved before by the same settings are read from it and only the rest are
    solved; with ``write_parts``, the rows solved here are written to it about every :data:`PART_SECONDS`.
    ``on_batch(rows_done, seconds)`` is called once with the rows read, then after each batch; ``seconds`` is the
    solving time of all the rows done, earlier parts' included.
    """
    size, batch = settings.size, settings.batch_size
    image_key, guidance_key, dropout_key, _ = draw_keys(settings.seed)
    labels = np.zeros(size, np.int32)
    guidance = np.ones(size, np.float32)
    if teacher.config.class_conditional:
        images = np.asarray(jax.random.randint(image_key, (size,), 0, num_images))
        dropped = class_condition({"label": jnp.asarray(class_ids(images), jnp.int32)}, dropout_key,
                                  settings.label_dropout)
        labels = np.asarray(dropped["label"])
        low, high, *focus = settings.guidance
        guidance = np.asarray(targets.guidance_scales(guidance_key, size, low, high, tuple(focus)))
    solver = trajectory_solver(teacher, settings.grid_steps)
    states = np.empty((size, settings.grid_steps, *settings.image_shape), np.float16)
    ends = np.empty((size, *settings.image_shape), np.float32)
    done, earlier_seconds = read_parts(parts, settings, states, ends) if parts is not None else (0, 0.0)
    started = part_started = time.perf_counter()
    part_start = done
    if on_batch is not None:
        on_batch(done, earlier_seconds)
    for index, start in enumerate(range(0, size, batch)):
        if start < done:  # read from the parts (they end at batch boundaries)
            continue
        rows = np.arange(start, start + batch) % size  # the last batch is padded with the first rows: one shape
        batch_states, batch_ends = solver(variables, noise_key(settings, index), labels[rows], guidance[rows])
        kept = min(batch, size - start)
        states[start:start + kept] = np.asarray(batch_states)[:kept]
        ends[start:start + kept] = np.asarray(batch_ends)[:kept]
        done, now = start + kept, time.perf_counter()
        if parts is not None and write_parts and (now - part_started >= PART_SECONDS or done == size):
            write_part(parts, settings, part_start, done, states, ends, now - part_started)
            part_start, part_started = done, now
        if on_batch is not None:
            on_batch(done, earlier_seconds + now - started)
    return Bank(states, ends, labels, guidance)


def write_part(parts: Path, settings: BankSettings, start: int, end: int, states: np.ndarray, ends: np.ndarray,
               seconds: float) -> None:
    """Write rows ``start:end`` as one part (``part-<start>-<end>.npz``), after the settings that make them; a
    folder of other settings is emptied first."""
    settings_file = parts / "settings.json"
    if parts.is_dir() and not parts_match(parts, settings):
        shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    if not settings_file.is_file():
        settings_file.write_text(settings.to_json())
    write_arrays(parts / f"part-{start:07d}-{end:07d}.npz", states=states[start:end], ends=ends[start:end],
                 seconds=np.float64(seconds))


def parts_match(parts: Path, settings: BankSettings) -> bool:
    """Whether the parts in the folder ``parts`` were written by ``settings``."""
    settings_file = parts / "settings.json"
    return settings_file.is_file() and settings_file.read_text() == settings.to_json()


def read_parts(parts: Path, settings: BankSettings, states: np.ndarray, ends: np.ndarray) -> tuple[int, float]:
    """Fill ``states`` and ``ends`` from the parts written by ``settings`` (those that follow on from row 0);
    returns the rows read and their solving seconds. Parts of other settings, or unreadable, are not used."""
    if not parts_match(parts, settings):
        return 0, 0.0
    done, seconds = 0, 0.0
    for path in sorted(parts.glob("part-*-*.npz")):
        start, end = (int(number) for number in path.stem.split("-")[1:])
        if start != done or end > settings.size:
            break
        try:
            with np.load(path) as part:
                states[start:end], ends[start:end] = part["states"], part["ends"]
                seconds += float(part["seconds"])
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            break
        done = end
    return done, seconds


def write_arrays(path: Path, **arrays) -> None:
    """``np.savez`` to ``path`` through a temporary file renamed into place: never a half-written file."""
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as file:
        np.savez(file, **arrays)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


def save(path: Path, bank: Bank, settings: BankSettings, parts: Path | None = None) -> None:
    """Write ``bank`` to ``path`` (:func:`write_arrays`); then the folder of its ``parts``, if given, is removed."""
    write_arrays(path, **bank._asdict(), settings=np.array(settings.to_json()))
    if parts is not None:
        shutil.rmtree(parts, ignore_errors=True)


def load(path: Path, settings: BankSettings) -> tuple[Bank | None, str]:
    """The bank stored at ``path`` if it was made with ``settings``; else ``(None, why)``, ``why`` empty when there
    is no file."""
    if not path.is_file():
        return None, ""
    try:
        with np.load(path) as stored:
            if str(stored["settings"]) != settings.to_json():
                return None, "was made with other settings"
            bank = Bank(*(stored[name] for name in Bank._fields))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        return None, f"cannot be read ({error})"
    return bank, ""


def batches(bank: Bank, seed: int, batch_size: int, start_step: int) -> Iterator[dict[str, np.ndarray]]:
    """Mid-training's batches from global step ``start_step + 1`` on: ``batch_size`` pairs of a trajectory and a
    grid point ``n`` drawn uniformly with the generator of ``(seed, step)`` (so a resumed run draws the same), as
    ``{"state", "index" (n), "end", "label", "guidance"}``."""
    size, steps = bank.states.shape[:2]
    for step in itertools.count(start_step + 1):
        rng = np.random.default_rng((seed % 2**63, step))
        trajectories = rng.integers(0, size, batch_size)
        index = rng.integers(1, steps + 1, batch_size)
        yield {"state": bank.states[trajectories, index - 1].astype(np.float32), "index": index.astype(np.int32),
               "end": bank.ends[trajectories], "label": bank.labels[trajectories],
               "guidance": bank.guidance[trajectories]}


def grid_batches(bank: Bank, seed: int, batch_size: int, start_step: int,
                 student_steps: int) -> Iterator[dict[str, np.ndarray]]:
    """The trajectory phase's batches from global step ``start_step + 1`` on: ``batch_size`` pairs of a trajectory
    and a time ``i / student_steps`` of the student's grid (``i`` in ``1..student_steps``, drawn uniformly with the
    generator of ``(seed, step)``), as ``{"state"`` (the path's point there), ``"next"`` (its point at the grid's
    next time, the end after the last), ``"index"`` (``i``), ``"noise"`` (the path's start, its point at ``t = 1``),
    ``"end"``, ``"label", "guidance"}``. The student's grid must be part of the bank's: ``student_steps`` divides
    its steps."""
    size, steps = bank.states.shape[:2]
    if steps % student_steps:
        raise ValueError(f"a {student_steps}-step grid is not part of the bank's {steps}-step grid")
    stride = steps // student_steps
    for step in itertools.count(start_step + 1):
        rng = np.random.default_rng((seed % 2**63, step))
        trajectories = rng.integers(0, size, batch_size)
        index = rng.integers(1, student_steps + 1, batch_size)
        states = bank.states[trajectories, index * stride - 1].astype(np.float32)
        inner = np.maximum(index - 1, 1) * stride - 1  # the path's point at t - 1/N (unused at the last time)
        following = np.where((index == 1)[:, None, None, None], bank.ends[trajectories],
                             bank.states[trajectories, inner].astype(np.float32))
        yield {"state": states, "next": following, "index": index.astype(np.int32),
               "noise": bank.states[trajectories, steps - 1].astype(np.float32), "end": bank.ends[trajectories],
               "label": bank.labels[trajectories], "guidance": bank.guidance[trajectories]}
