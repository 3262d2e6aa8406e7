"""What the evaluation tests share: a copy of the tiny trained run to write into, mock Flowers, no Inception
weights anywhere, ``ddim eval`` in this process and the records it appended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddim import evaluation
from ddim.evaluation import keras_inception
from tests.conftest import mock_flowers


MOCK_EXAMPLES = 32  # what tests.conftest.mock_flowers() gives per split


def mock_data():
    return mock_flowers(MOCK_EXAMPLES)


@pytest.fixture(scope="module")
def smoke_workdir(trained_workdir, tmp_path_factory) -> Path:
    """A copy of the session's tiny trained run (checkpoints 4 and 6), which these tests write into."""
    import shutil

    workdir = tmp_path_factory.mktemp("eval_smoke") / "run"
    shutil.copytree(trained_workdir, workdir)
    return workdir


@pytest.fixture
def no_weights_anywhere(monkeypatch, tmp_path):
    """No --inception-weights, no $DDIM_INCEPTION_WEIGHTS, an empty Keras cache and no network."""
    monkeypatch.delenv(evaluation.WEIGHTS_ENV, raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))

    def offline():
        raise Exception(f"URL fetch failure on {evaluation.WEIGHTS_URL}: None -- [Errno -2] Name or service not known")

    monkeypatch.setattr(keras_inception, "_download_weights", offline)


def run_cli(*args: str):
    from typer.testing import CliRunner

    from ddim.cli import app

    return CliRunner().invoke(app, ["eval", *args])


def eval_lines(workdir: Path) -> list[dict]:
    path = workdir / evaluation.EVAL_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
