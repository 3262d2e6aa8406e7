"""Checkpoints (ddim/checkpoint/): round trip, stored config, and clear errors."""

import shutil

import jax
import numpy as np
import pytest

from ddim import checkpoint as ckpt
from ddim.train import state as train_lib
from ddim.workdir import Workdir
from tests.conftest import tiny_config


def test_round_trip_restores_the_exact_state(tmp_path):
    config = tiny_config()
    state = train_lib.create_train_state(config, jax.random.key(0))
    state = state.replace(step=state.step + 5)
    checkpointer = ckpt.Checkpointer(Workdir(tmp_path).checkpoints, keep=2)
    checkpointer.save(5, train_lib.state_to_dict(state), config)
    checkpointer.wait()
    template = train_lib.create_train_state(config, jax.random.key(1))  # other values, same structure
    restored = train_lib.restore_train_state(checkpointer, 5, template)
    assert int(restored.step) == 5
    jax.tree.map(np.testing.assert_array_equal, train_lib.state_to_dict(restored), train_lib.state_to_dict(state))
    assert checkpointer.restore_config(5) == config
    checkpointer.close()


def test_keeps_only_the_last_k(tmp_path):
    config = tiny_config()
    state_dict = train_lib.state_to_dict(train_lib.create_train_state(config, jax.random.key(0)))
    checkpointer = ckpt.Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        checkpointer.save(step, state_dict, config)
    checkpointer.close()
    assert ckpt.Checkpointer(tmp_path).all_steps() == [2, 3]


def test_locate_errors_and_forms(trained_workdir, tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="no checkpoints in"):
        ckpt.locate(workdir=tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="checkpoint not found"):
        ckpt.locate(checkpoint=tmp_path / "missing")
    for form in (trained_workdir, Workdir(trained_workdir).checkpoints):  # the newest intact step, found on restore
        checkpointer, step = ckpt.locate(checkpoint=form)
        assert step is None and checkpointer.latest_step() == 6
    for named in (6, 4):
        _, step = ckpt.locate(checkpoint=Workdir(trained_workdir).checkpoints / str(named))
        assert step == named


def test_model_config_mismatch_names_the_key():
    a, b = tiny_config(), tiny_config("model.block_depth=2")
    assert ckpt.model_config_mismatch(a, a) is None
    assert "model.block_depth is 2" in ckpt.model_config_mismatch(a, b)
    assert ckpt.model_config_mismatch(a, tiny_config("model.dtype=bfloat16")) is None


def test_corrupt_checkpoint_is_a_clear_error(trained_workdir, tmp_path):
    from ddim.sampling import load

    workdir = tmp_path / "corrupt"
    shutil.copytree(trained_workdir, workdir)
    for path in (Workdir(workdir).checkpoints / "6" / "state").rglob("*"):
        if path.is_file() and path.stat().st_size > 0:
            path.write_bytes(b"garbage")
    # Named, it is an error; the work directory falls back to step 4 (tests/test_faults.py has the variants).
    with pytest.raises(ckpt.CheckpointError, match="checkpoint .*/6 is damaged: .* not valid JSON"):
        load(Workdir(workdir).checkpoints / "6")
    assert load(workdir, warn=lambda message: None).step == 4

