"""Where things live in a work directory: the one place that names its files and folders.

A work directory (``runs/<name>``) holds everything one training run makes and
everything later commands add to it::

    <workdir>/
      checkpoints/<step>/   orbax checkpoints (the newest few; damaged ones renamed <step>.damaged)
      best/<step>/          the checkpoint with the lowest KID so far
      samples/              the sample grid of every evaluation (step_<step>.png)
      tensorboard/          TensorBoard event files
      data_cache/           preprocessed training images (data.cache_dir moves it)
      data_report.json      what the data loader used and skipped
      eval_cache/           real-image features and statistics of ddim eval
      eval.jsonl            one line per ddim eval
      train.jsonl           one line per start of training: where it runs, which kernels ran its convolutions
      train.lock            held while ddim train runs
      students/<N>/         ddim distill's students, each a work directory of its own
      distill.jsonl         ddim distill's teacher and stretches of training
      trajectories.npz      ddim distill's banked teacher trajectories (mid-training, trajectory phase)
      trajectories.parts/   the parts of a bank being solved, until the whole is written
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CHECKPOINTS = "checkpoints"
BEST = "best"
SAMPLES = "samples"
TENSORBOARD = "tensorboard"
DATA_CACHE = "data_cache"
DATA_REPORT = "data_report.json"
EVAL_CACHE = "eval_cache"
EVAL_FILE = "eval.jsonl"
TRAIN_FILE = "train.jsonl"
LOCK_FILE = "train.lock"
STUDENTS = "students"
DISTILL_FILE = "distill.jsonl"
TRAJECTORIES = "trajectories.npz"
TRAJECTORY_PARTS = "trajectories.parts"


@dataclass(frozen=True)
class Workdir:
    """The paths of one work directory (nothing is created or read here)."""

    root: Path

    def __init__(self, root: str | os.PathLike):
        object.__setattr__(self, "root", Path(root))

    @classmethod
    def of_checkpoint(cls, path: str | os.PathLike) -> "Workdir":
        """The work directory of a step directory (``<workdir>/checkpoints/<step>`` or ``best/<step>``),
        of a ``checkpoints`` folder, or the directory itself."""
        path = Path(path).absolute()
        if path.name in (CHECKPOINTS, BEST):
            return cls(path.parent)
        if path.parent.name in (CHECKPOINTS, BEST):
            return cls(path.parent.parent)
        return cls(path)

    @property
    def checkpoints(self) -> Path:
        return self.root.absolute() / CHECKPOINTS

    @property
    def best(self) -> Path:
        return self.root / BEST

    @property
    def samples(self) -> Path:
        return self.root / SAMPLES

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD

    @property
    def data_cache(self) -> Path:
        return self.root / DATA_CACHE

    @property
    def data_report(self) -> Path:
        return self.root / DATA_REPORT

    @property
    def eval_cache(self) -> Path:
        return self.root / EVAL_CACHE

    @property
    def eval_file(self) -> Path:
        return self.root / EVAL_FILE

    @property
    def train_file(self) -> Path:
        return self.root / TRAIN_FILE

    @property
    def lock_file(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def students(self) -> Path:
        return self.root / STUDENTS

    def student(self, name: int | str) -> Path:
        """The work directory of a distillation run's student of ``name`` steps (or ``"consistency"``)."""
        return self.students / str(name)

    @property
    def distill_file(self) -> Path:
        return self.root / DISTILL_FILE

    @property
    def trajectories(self) -> Path:
        return self.root / TRAJECTORIES

    @property
    def trajectory_parts(self) -> Path:
        return self.root / TRAJECTORY_PARTS
