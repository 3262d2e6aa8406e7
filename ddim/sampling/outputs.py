"""Writing what the pipeline makes: sample folders (PNGs, a grid, a trajectory GIF)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ddim.images import make_grid, prepare_output_dir, save_gif, save_images
from ddim.sampling.pipeline import Pipeline
from ddim.spec import SamplingSpec

TRAJECTORY_FILE = "trajectory.gif"
CLASSES_FILE = "classes.json"
# The trajectory GIF holds its final frame this many extra frames so the result can be seen.
_HOLD_FINAL_FRAMES = 4


def sample_file_names(num: int, grid: bool = True, trajectory: bool = False) -> list[str]:
    """``0000.png ...``, then ``grid.png`` and ``trajectory.gif`` when asked for (and ``classes.json``, which
    sampling rewrites whenever it writes the images of a class-conditional model)."""
    names = [f"{i:04d}.png" for i in range(num)]
    return names + (["grid.png"] if grid else []) + ([TRAJECTORY_FILE] if trajectory else [])


def check_sample_folder(out: str | Path, num: int, grid: bool, trajectory: bool, overwrite: bool) -> Path:
    """Create ``out`` and check it can take the files (before the model loads; :class:`ddim.images.OutputError`)."""
    return prepare_output_dir(out, sample_file_names(num, grid, trajectory), overwrite)


def sample_to_folder(pipe: Pipeline, out: str | Path, num: int, spec: SamplingSpec, *, seed: int = 0,
                     batch_size: int | None = None, grid: bool = True, trajectory: bool = False,
                     overwrite: bool = False, on_batch: Callable[[int], None] | None = None,
                     classes=None) -> list[str]:
    """Generate ``num`` images with ``spec`` and write them to ``out``; returns the extra files written.

    ``trajectory`` also writes ``trajectory.gif``, the grid of predicted clean
    images after every step (its last frame is the sample). ``classes`` (ids,
    one per image, for a class-conditional model) are written to ``classes.json``.
    """
    out = Path(out)
    options = dict(seed=seed, batch_size=batch_size, on_batch=on_batch, spec=spec, classes=classes)
    if trajectory:
        frames = pipe.trajectory(num, **options)
        images = frames[-1]
    else:
        images = pipe.generate(num, **options)
    save_images(images, out, grid=grid, overwrite=overwrite)
    if trajectory:
        grids = [make_grid(frame) for frame in frames] + [make_grid(frames[-1])] * _HOLD_FINAL_FRAMES
        save_gif(grids, out / TRAJECTORY_FILE, duration_ms=250, overwrite=True)
    if classes is not None:
        write_classes(out / CLASSES_FILE, sample_file_names(num, grid=False), classes, pipe.classes)
    return [name for name, wanted in (("grid.png", grid), (TRAJECTORY_FILE, trajectory),
                                      (CLASSES_FILE, classes is not None)) if wanted]


def write_classes(path: Path, names: list[str], ids, class_names) -> Path:
    """``{"0000.png": {"class": id, "name": ...}, ...}``: which class each image was asked to be."""
    record = {name: {"class": int(i), "name": class_names[int(i)]} for name, i in zip(names, ids)}
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path
