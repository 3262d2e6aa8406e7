"""The campaign's ``ddim`` processes, what they leave in a work directory, and the table's rows."""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import REPO, ddim_command

CAMPAIGN_SETTINGS = [
    "train.num_epochs=8",  # 200 steps of the smoke model: a few seconds of training per run
    "train.max_steps=0",
    "train.checkpoint_every=4",
    "train.log_every=1",
    "train.eval_every=4",
]


@dataclass
class Row:
    """One fault's line of the table: how often it was injected, and what the runs after it lost."""

    fault: str
    injected: int = 0
    resumed: int = 0
    steps_lost: int = 0
    data_lost: int = 0
    ok: bool = True
    notes: list[str] = field(default_factory=list)

    def check(self, condition: bool, note: str) -> None:
        if not condition:
            self.ok = False
            self.notes.append("FAILED: " + note)


@dataclass
class Context:
    """Where the campaign works, and what every training run of it is."""

    root: Path
    logs: Path
    cache: Path
    config: str
    settings: list[str]
    kills: int
    seed: int
    kill_log: list = field(default_factory=list)

    def train_args(self, workdir: Path, *settings: str) -> list[str]:
        """``ddim train``'s arguments for ``workdir``: the campaign's config and settings, then ``settings``."""
        args = ["train", "--config", self.config, "--workdir", str(workdir), "--compilation-cache", str(self.cache)]
        for setting in (*self.settings, *settings):
            args += ["--set", setting]
        return args


class Run:
    """One ``ddim`` process, its output in a log file."""

    def __init__(self, args: list[str], log: Path, env: dict | None = None):
        self.log = log
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.first_step_at = None
        self._file = open(log, "w")
        self.process = subprocess.Popen(ddim_command(*args), cwd=REPO, stdout=self._file, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})})

    @property
    def pid(self) -> int:
        return self.process.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def last_step(self) -> int | None:
        steps = re.findall(r"^step (\d+)/", self.text(), re.M)
        if steps and self.first_step_at is None:
            self.first_step_at = time.monotonic()
        return int(steps[-1]) if steps else None

    def wait(self, timeout: float = 1200) -> int:
        try:
            code = self.process.wait(timeout)
        finally:
            self._file.close()
        return code

    def kill(self) -> None:
        self.process.kill()
        self.wait()


def resumed_from(text: str) -> int:
    match = re.search(r"resuming from step (\d+)", text)
    return int(match.group(1)) if match else 0


def checkpoints_of(workdir: Path) -> Path:
    """The checkpoints folder of ``workdir``, as ddim names it."""
    from ddim.workdir.layout import Workdir  # here: importing ddim sets XLA_FLAGS, which every run inherits

    return Workdir(workdir).checkpoints


def complete_steps(checkpoints: Path) -> list[int]:
    if not checkpoints.is_dir():
        return []
    return sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def final_state(workdir: Path):
    import jax

    from ddim.checkpoint import Checkpointer

    checkpointer = Checkpointer(checkpoints_of(workdir), create=False)
    step = checkpointer.latest_step()
    state = checkpointer.restore_state(step)
    checkpointer.close()
    return step, jax.tree.leaves(state)


def identical(a: Path, b: Path) -> bool:
    """Whether the newest checkpoints of two work directories are of one step and bit-identical."""
    import numpy as np

    (step_a, leaves_a), (step_b, leaves_b) = final_state(a), final_state(b)
    return step_a == step_b and len(leaves_a) == len(leaves_b) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(leaves_a, leaves_b)
    )
