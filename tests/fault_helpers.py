"""What the fault tests share: a copy of the trained work directory, a checkpoint's state compared bit for bit,
the CLI's one-line error, the tiny training command, and a small disk (a 4 MiB tmpfs) to fill up."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from typer.testing import CliRunner

from benchmarks.faults import inject
from ddim import checkpoint as ckpt
from tests.conftest import CONFIGS, TINY

runner = CliRunner()
QUIET = dict(log=lambda message: None)


def copy_workdir(trained_workdir: Path, tmp_path: Path, name: str = "run") -> Path:
    workdir = tmp_path / name
    shutil.copytree(trained_workdir, workdir)
    return workdir


def saved_state(checkpoints: Path, step: int) -> dict:
    checkpointer = ckpt.Checkpointer(checkpoints, create=False)
    try:
        return checkpointer.restore_state(step)
    finally:
        checkpointer.close()


def assert_same_state(a: dict, b: dict) -> None:
    """Bit for bit: parameters, optimiser state, BatchNorm statistics, EMA weights and step."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def one_line_error(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def tiny_cli(*extra: str) -> list[str]:
    return ["train", "--config", str(CONFIGS / "smoke.toml"), *[a for item in TINY for a in ("--set", item)], *extra]


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (root, as in this project's CI), or None where mounting is not allowed."""
    mount = tmp_path / "small"
    mounted = inject.mount_tmpfs(mount, 4096)
    yield mount if mounted else None
    if mounted:
        inject.unmount(mount)
