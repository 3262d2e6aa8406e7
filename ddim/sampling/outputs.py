"""Writing what the pipeline makes: sample folders (PNGs, a grid, a trajectory GIF)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ddim.images import make_grid, prepare_output_dir, save_gif, save_images
from ddim.sampling.pipeline import Pipeline
from ddim.spec import SamplingSpec

TRAJECTORY_FILE = "trajectory.gif"
# The trajectory GIF holds its final frame this many extra frames so the result can be seen.
_HOLD_FINAL_FRAMES = 4


def sample_file_names(num: int, grid: bool = True, trajectory: bool = False) -> list[str]:
    """``0000.png ...``, then ``grid.png`` and ``trajectory.gif`` when asked for."""
    names = [f"{i:04d}.png" for i in range(num)]
    return names + (["grid.png"] if grid else []) + ([TRAJECTORY_FILE] if trajectory else [])


def check_sample_folder(out: str | Path, num: int, grid: bool, trajectory: bool, overwrite: bool) -> Path:
    """Create ``out`` and check it can take the files (before the model loads; :class:`ddim.images.OutputError`)."""
    return prepare_output_dir(out, sample_file_names(num, grid, trajectory), overwrite)


def sample_to_folder(pipe: Pipeline, out: str | Path, num: int, spec: SamplingSpec, *, seed: int = 0,
                     batch_size: int | None = None, grid: bool = True, trajectory: bool = False,
                     overwrite: bool = False, on_batch: Callable[[int], None] | None = None) -> list[str]:
    """Generate ``num`` images with ``spec`` and write them to ``out``; returns the extra files written.

    ``trajectory`` also writes ``trajectory.gif``, the grid of predicted clean
    images after every step (its last frame is the sample).
    """
    out = Path(out)
    if trajectory:
        frames = pipe.trajectory(num, seed=seed, batch_size=batch_size, on_batch=on_batch, spec=spec)
        images = frames[-1]
    else:
        images = pipe.generate(num, seed=seed, batch_size=batch_size, on_batch=on_batch, spec=spec)
    save_images(images, out, grid=grid, overwrite=overwrite)
    if trajectory:
        grids = [make_grid(frame) for frame in frames] + [make_grid(frames[-1])] * _HOLD_FINAL_FRAMES
        save_gif(grids, out / TRAJECTORY_FILE, duration_ms=250, overwrite=True)
    return [name for name, wanted in (("grid.png", grid), (TRAJECTORY_FILE, trajectory)) if wanted]
