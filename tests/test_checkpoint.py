"""Checkpoints (ddim/checkpoint/): round trip, stored config, loading the EMA weights, and clear errors."""

import json
import shutil
import subprocess
import sys

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


def test_keep_every_also_keeps_the_multiples_for_good(tmp_path):
    config = tiny_config("train.keep_checkpoints=1", "train.keep_checkpoints_every=2")
    state_dict = train_lib.state_to_dict(train_lib.create_train_state(config, jax.random.key(0)))
    checkpointer = ckpt.Checkpointer.of_run(tmp_path, config.train)  # as ddim train and ddim distill open it
    for step in (1, 2, 3, 4, 5):
        checkpointer.save(step, state_dict, config)
    checkpointer.close()
    assert ckpt.Checkpointer(tmp_path).all_steps() == [2, 4, 5]


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
    # An unconditional run resumes under a config that only changes how a class would be embedded.
    adm = tiny_config('model.embedding_injection="every-block"', 'model.class_embedding="adm"')
    assert ckpt.model_config_mismatch(tiny_config('model.embedding_injection="every-block"'), adm) is None
    by_class = ("model.class_conditional=true", 'model.embedding_injection="every-block"')
    assert "model.class_embedding is 'adm'" in ckpt.model_config_mismatch(
        tiny_config(*by_class), tiny_config(*by_class, 'model.class_embedding="adm"'))


def test_corrupt_checkpoint_is_a_clear_error(trained_workdir, tmp_path):
    from ddim.sampling import load

    workdir = tmp_path / "corrupt"
    shutil.copytree(trained_workdir, workdir)
    for path in (Workdir(workdir).checkpoints / "6" / "state").rglob("*"):
        if path.is_file() and path.stat().st_size > 0:
            path.write_bytes(b"garbage")
    # Named, it is an error; the work directory falls back to step 4 (the variants: tests/test_faults_checkpoints.py).
    with pytest.raises(ckpt.CheckpointError, match="checkpoint .*/6 is damaged: .* not valid JSON"):
        load(Workdir(workdir).checkpoints / "6")
    assert load(workdir, warn=lambda message: None).step == 4


def test_load_ema_returns_the_ema_weights_of_the_newest_or_named_step(trained_workdir):
    checkpoints = Workdir(trained_workdir).checkpoints
    loaded = ckpt.load_ema(trained_workdir)
    assert isinstance(loaded, ckpt.LoadedCheckpoint)
    assert (loaded.step, loaded.path, loaded.config) == (6, checkpoints / "6", tiny_config())
    state = ckpt.Checkpointer(checkpoints, create=False).restore_state(6)
    jax.tree.map(np.testing.assert_array_equal, loaded.variables, ckpt.ema_variables(state))
    assert set(loaded.variables) == {"params", "batch_stats"}
    assert ckpt.load_ema(checkpoints / "4").step == 4
    assert ckpt.load_ema(trained_workdir, step=4).path == checkpoints / "4"


def test_load_ema_skips_a_damaged_newest_checkpoint_with_one_warning(trained_workdir, tmp_path):
    workdir = tmp_path / "damaged"
    shutil.copytree(trained_workdir, workdir)
    (Workdir(workdir).checkpoints / "6" / "state" / "_METADATA").write_text("{garbage")
    with pytest.raises(ckpt.DamagedCheckpoint, match="state/_METADATA is not valid JSON"):
        ckpt.load_ema(Workdir(workdir).checkpoints / "6")
    warnings = []
    assert ckpt.load_ema(workdir, warn=warnings.append).step == 4
    assert len(warnings) == 1 and warnings[0].startswith("warning: skipping damaged checkpoint")


def test_load_ema_refuses_weights_that_do_not_fit_or_are_missing(trained_workdir, tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="checkpoint not found"):
        ckpt.load_ema(tmp_path / "missing")
    edited = tmp_path / "edited"
    shutil.copytree(trained_workdir, edited)
    config_file = Workdir(edited).checkpoints / "6" / "config" / "metadata"
    values = json.loads(config_file.read_text())
    values["model"]["widths"] = [8, 24]
    config_file.write_text(json.dumps(values))
    with pytest.raises(ckpt.CheckpointError, match=r"checkpoint .*/6 does not match its config \(.*widths \(8, 24\)"):
        ckpt.load_ema(edited)
    config = tiny_config()
    state_dict = train_lib.state_to_dict(train_lib.create_train_state(config, jax.random.key(0)))
    del state_dict["ema_params"]
    checkpointer = ckpt.Checkpointer(Workdir(tmp_path / "no-ema").checkpoints)
    checkpointer.save(1, state_dict, config)
    checkpointer.close()
    with pytest.raises(ckpt.CheckpointError, match=r"checkpoint .*/1 has no EMA weights \('ema_params'\)"):
        ckpt.load_ema(tmp_path / "no-ema")


def test_load_ema_needs_neither_the_training_nor_the_sampling_code(trained_workdir):
    code = (
        "import sys, ddim.checkpoint as c; assert 'jax' not in sys.modules, 'import loaded JAX'; "
        f"c.load_ema({str(trained_workdir)!r}); "
        "print(sorted(m for m in sys.modules if m.startswith(('ddim.train', 'ddim.sampling'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
