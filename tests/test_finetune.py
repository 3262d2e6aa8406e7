"""Fine-tuning (``ddim train --init``, ddim/train/init.py): the start is the source, classes map by name, the
network's shape is the source's, resume wins, and a bad source is one error line."""

import json
import shutil

import jax
import numpy as np
import pytest

import ddim
from ddim.checkpoint import Checkpointer, checkpoint_dir
from ddim.config import ConfigError
from ddim.pretrained import export_checkpoint
from ddim.pretrained.render import describe_init
from ddim.pretrained.render import facts as describe_facts
from ddim.train import init as init_lib
from ddim.train import load_run_config, loop
from ddim.train.state import ema_variables
from tests.conftest import CONFIGS, CONDITIONAL_CLASSES, TINY, mock_flowers, tiny_config
from tests.image_folders import write_plain_folder
from tests.test_cli import assert_one_line_error, invoke

QUIET = dict(log=lambda message: None)


def finetune_config(source, *overrides):
    return load_run_config(CONFIGS / "smoke.toml", [*TINY, *overrides], init=str(source))


def first_state(config, workdir):
    """The state a run starts from, before its first update (its outputs closed again)."""
    run = loop.TrainingRun.prepare(config, workdir, **QUIET)
    run.close()
    return run


def class_table(variables):
    return np.asarray(variables["params"]["network"]["classes"]["table"]["embedding"])


def folder(root, classes, count=8):
    write_plain_folder(root, count, classes=classes, size=20)
    return [f"data.image_dir={json.dumps(str(root))}", "data.val_fraction=0.0", "train.eval_every=0",
            "train.batch_size=4"]


def test_a_finetune_that_changes_nothing_samples_as_its_source_before_its_first_update(trained_workdir, tmp_path):
    with mock_flowers():
        run = first_state(finetune_config(trained_workdir), tmp_path / "tuned")
    assert int(run.state.step) == 0
    source = ddim.load(trained_workdir)
    tuned = ddim.Pipeline(run.config, ema_variables(run.state))
    np.testing.assert_array_equal(tuned.generate(3, steps=2, seed=1), source.generate(3, steps=2, seed=1))
    # The weights being trained start as the averaged ones the source samples with; the optimiser is fresh.
    jax.tree.map(np.testing.assert_array_equal, run.state.params, source.variables["params"])
    assert run.config.init.source == str(trained_workdir) and run.config.init.source_step == 6
    assert len(run.config.init.source_sha256) == 64


def test_the_source_is_recorded_in_every_checkpoint_and_the_log(trained_workdir, tmp_path):
    lines = []
    with mock_flowers():
        loop.train(finetune_config(trained_workdir, "train.max_steps=2", "train.checkpoint_every=2"),
                   tmp_path / "tuned", log=lines.append)
    checkpointer = Checkpointer(checkpoint_dir(tmp_path / "tuned"))
    saved = checkpointer.restore_config(2)
    checkpointer.close()
    assert saved.init.source == str(trained_workdir) and saved.init.source_step == 6
    assert any(line.startswith(f"init: fine-tuning from {trained_workdir} (its step 6") for line in lines), lines
    # A bundle exported from the run says where it came from (its source path cut to the last two parts).
    manifest = export_checkpoint(tmp_path / "tuned", "tuned", root=tmp_path / "bundles")
    facts = dict(describe_facts(manifest))
    assert facts["fine-tuned"].startswith(f"from {trained_workdir.parent.name}/{trained_workdir.name} (its step 6,")


def test_the_network_comes_from_the_source_and_may_change_its_prediction(trained_workdir):
    config = load_run_config(None, ['model.prediction="velocity"', "model.dropout=0.1"], init=str(trained_workdir))
    assert (config.model.widths, config.model.image_size) == ((8, 16), 16)  # not the defaults' 64x64
    assert (config.model.prediction, config.model.dropout) == ("velocity", 0.1)
    assert config.name == "smoke-finetune"


@pytest.mark.parametrize("override, field", [("model.widths=[8, 32]", "model.widths"),
                                             ("model.image_size=32", "model.image_size"),
                                             ("model.attention_resolutions=[8]", "model.attention_resolutions"),
                                             ('model.embedding_injection="every-block"', "model.embedding_injection")])
def test_a_change_of_shape_is_refused_naming_the_field_and_both_values(trained_workdir, override, field):
    with pytest.raises(ConfigError, match=rf"{field} is .* in this config but .* in the source model smoke"):
        finetune_config(trained_workdir, override)


def test_a_change_of_shape_on_the_command_line_is_one_error_line_and_writes_nothing(trained_workdir, tmp_path):
    workdir = tmp_path / "never"
    result = invoke("train", "--init", trained_workdir, "--workdir", workdir, "--set", "model.block_depth=2")
    assert_one_line_error(result, "model.block_depth is 2 in this config but 1 in the source model smoke")
    assert not workdir.exists()


def test_a_missing_or_damaged_source_is_one_error_line(trained_workdir, tmp_path):
    result = invoke("train", "--init", tmp_path / "nothing", "--workdir", tmp_path / "a")
    assert_one_line_error(result, "checkpoint not found")
    result = invoke("train", "--init", "pretrained:no-such-model", "--workdir", tmp_path / "b")
    assert_one_line_error(result, "no bundled model named 'no-such-model'")
    damaged = tmp_path / "damaged"
    shutil.copytree(trained_workdir, damaged)
    for step in (4, 6):
        for item in (damaged / "checkpoints" / str(step)).rglob("*"):
            if item.is_file() and item.stat().st_size > 100:
                item.write_bytes(b"\0" * 64)
    result = invoke("train", "--init", damaged / "checkpoints" / "6", "--workdir", tmp_path / "c")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1, result.output
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_a_damaged_bundled_source_is_refused(tmp_path, monkeypatch):
    shutil.copytree(ddim.pretrained.PACKAGE_ROOT / "flowers32", tmp_path / "models" / "flowers32")
    weights = tmp_path / "models" / "flowers32" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    monkeypatch.setenv("DDIM_PRETRAINED_DIR", str(tmp_path / "models"))
    result = invoke("train", "--init", "pretrained:flowers32", "--workdir", tmp_path / "run")
    assert_one_line_error(result, "do not match their SHA-256")


@pytest.mark.slow
def test_resume_wins_over_init(trained_workdir, tmp_path):
    workdir = tmp_path / "tuned"
    with mock_flowers():
        loop.train(finetune_config(trained_workdir, "train.max_steps=2", "train.checkpoint_every=2"), workdir, **QUIET)
        lines = []
        result = loop.train(finetune_config(trained_workdir, "train.max_steps=4", "train.checkpoint_every=2"),
                            workdir, log=lines.append)
    assert (result.start_step, result.final_step) == (2, 4)
    assert any("already has checkpoints: resuming from step 2" in line and "is not read" in line for line in lines)
    checkpointer = Checkpointer(checkpoint_dir(workdir))
    assert checkpointer.restore_config(4).init.source_step == 6  # the record of the source stays
    checkpointer.close()


def test_classes_map_by_name_and_new_classes_start_at_random_vectors(conditional_workdir, tmp_path):
    source = ddim.load(conditional_workdir)
    config = finetune_config(conditional_workdir, *folder(tmp_path / "images", ("sunflower", "tulip", "daisy")))
    assert config.init.new_classes == "random"  # the default
    run = first_state(config, tmp_path / "tuned")
    assert run.config.model.class_names == ("daisy", "sunflower", "tulip")  # a folder's classes, sorted
    old, new = class_table(source.variables), class_table(ema_variables(run.state))
    index = {name: i for i, name in enumerate(source.classes)}
    assert set(CONDITIONAL_CLASSES) == set(index) and (index["daisy"], index["sunflower"]) != (0, 1)
    np.testing.assert_array_equal(new[0], old[index["daisy"]])
    np.testing.assert_array_equal(new[1], old[index["sunflower"]])
    np.testing.assert_array_equal(new[-1], old[-1])
    # tulip, unknown to the source: a vector of its own, unlike every vector the source has.
    assert not any(np.allclose(new[2], row) for row in old) and not np.allclose(new[2], old[:-1].mean(0))
    # A known class samples as in the source.
    tuned = ddim.Pipeline(run.config, ema_variables(run.state))
    np.testing.assert_array_equal(tuned.generate(2, steps=2, seed=0, classes=["sunflower"]),
                                  source.generate(2, steps=2, seed=0, classes=["sunflower"]))


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["null", "mean"])
def test_new_classes_can_start_as_the_null_class_or_the_mean(conditional_workdir, tmp_path, choice):
    source = ddim.load(conditional_workdir)
    config = finetune_config(conditional_workdir, *folder(tmp_path / "images", ("tulip", "daisy")),
                             f'init.new_classes="{choice}"')
    run = first_state(config, tmp_path / "tuned")
    tulip = class_table(ema_variables(run.state))[run.config.model.class_names.index("tulip")]
    old = class_table(source.variables)
    if choice == "mean":
        np.testing.assert_allclose(tulip, old[:-1].mean(0), rtol=1e-6)
    else:  # the source's null class: the new class samples as the source's unconditional model
        np.testing.assert_array_equal(tulip, old[-1])
        tuned = ddim.Pipeline(run.config, ema_variables(run.state))
        null = {"label": np.full((2,), -1, np.int32)}
        np.testing.assert_array_equal(tuned.generate(2, steps=2, seed=0, classes=["tulip"]),
                                      source.generate(2, steps=2, seed=0, cond=null))


@pytest.mark.slow
def test_a_class_conditional_source_on_images_without_classes_trains_through_its_null_class(conditional_workdir,
                                                                                          tmp_path):
    config = finetune_config(conditional_workdir, *folder(tmp_path / "images", ()), "train.max_steps=2",
                             "train.checkpoint_every=2")
    loop.train(config, tmp_path / "tuned", **QUIET)
    pipe = ddim.load(tmp_path / "tuned")
    assert pipe.config.model.num_classes == 0 and pipe.classes == ()
    assert class_table(pipe.variables).shape[0] == 1  # the null class alone
    assert pipe.generate(2, steps=2, seed=0).shape == (2, 16, 16, 3)
    with pytest.raises(ValueError, match="not class-conditional"):
        pipe.generate(2, steps=2, classes=["daisy"])


def test_an_unconditional_source_on_images_by_class_gets_a_class_embedding(trained_workdir, tmp_path):
    config = finetune_config(trained_workdir, *folder(tmp_path / "images", ("cats", "owls")),
                             "model.class_conditional=true", 'init.new_classes="null"')
    run = first_state(config, tmp_path / "tuned")
    table = class_table(ema_variables(run.state))
    assert table.shape[0] == 3 and not table.any()  # zero vectors: every class starts as the source
    tuned = ddim.Pipeline(run.config, ema_variables(run.state))
    assert tuned.classes == ("cats", "owls")
    np.testing.assert_array_equal(tuned.generate(2, steps=2, seed=0, classes=["owls"]),
                                  ddim.load(trained_workdir).generate(2, steps=2, seed=0))


@pytest.mark.slow
def test_adapt_sets_the_normaliser_to_the_new_data_and_keep_leaves_the_source(trained_workdir, tmp_path):
    source = ddim.load(trained_workdir).variables["batch_stats"]["normalizer"]
    stats = {}
    for choice in ("keep", "adapt"):
        config = finetune_config(trained_workdir, *folder(tmp_path / "images", ()), f'init.normalizer="{choice}"')
        run = first_state(config, tmp_path / choice)
        stats[choice] = ema_variables(run.state)["batch_stats"]["normalizer"]
    np.testing.assert_array_equal(stats["keep"]["mean"], source["mean"])
    assert not np.allclose(stats["adapt"]["mean"], source["mean"])


def test_a_distilled_student_is_not_a_source():
    with pytest.raises(Exception, match="distilled student"):
        init_lib.load_source("pretrained:flowers32-consistency")


def test_learning_from_the_source_needs_a_source_and_a_known_choice():
    with pytest.raises(ConfigError, match='init.targets = "source" needs a source model'):
        load_run_config(CONFIGS / "smoke.toml", ['init.targets="source"'])
    with pytest.raises(ConfigError, match="init.targets"):
        load_run_config(CONFIGS / "smoke.toml", ['init.targets="teacher"'])


def test_source_targets_are_the_sources_prediction_in_the_runs_parameterisation(trained_workdir):
    from ddim.model import bind_denoiser
    from ddim.objective import Objective, noise_and_image_from_velocity

    source = ddim.load(trained_workdir)
    teacher = init_lib.SourceTeacher(source.config.model, None)
    batch = Objective().noisy_batch(jax.random.key(3), jax.random.normal(jax.random.key(4), (4, 16, 16, 3)))
    goal = init_lib.source_targets(teacher, source.variables, batch, None)
    noises, images = bind_denoiser(ddim.model.DiffusionModel(source.config.model), source.variables)(
        batch.noisy_images, batch.noise_rates, batch.signal_rates)
    assert np.abs(np.asarray(noises)).mean() > 0.01  # a trained network, not the zero output of a fresh one
    # Unchanged prediction: the target is the source's own output; the noisy images and rates are the run's.
    np.testing.assert_array_equal(Objective(prediction="noise").target(goal), noises)
    np.testing.assert_array_equal(goal.noisy_images, batch.noisy_images)
    # Velocity: the one velocity that gives back the source's noise and image at this noisy input.
    velocity = Objective(prediction="velocity").target(goal)
    back = noise_and_image_from_velocity(batch.noisy_images, velocity, batch.noise_rates, batch.signal_rates)
    np.testing.assert_allclose(back[0], noises, atol=2e-5)
    np.testing.assert_allclose(back[1], images, atol=2e-5)


def test_the_source_sees_the_runs_classes_by_name():
    from ddim.config import ModelConfig

    source = ModelConfig(class_conditional=True, num_classes=3, class_names=("a", "b", "c"))
    run = ModelConfig(class_conditional=True, num_classes=3, class_names=("c", "x", "a"))
    teacher = init_lib.SourceTeacher(source, init_lib.label_rows(source, run))
    assert teacher.label_rows == (2, -1, 0)
    labels = init_lib.source_condition(teacher, {"label": np.array([0, 1, 2, -1])}, 4)["label"]
    np.testing.assert_array_equal(labels, [2, -1, 0, -1])  # a class the source lacks: its null class
    assert init_lib.label_rows(ModelConfig(), run) is None  # an unconditional source gets no classes
    unconditional_run = init_lib.SourceTeacher(source, init_lib.label_rows(source, ModelConfig()))
    np.testing.assert_array_equal(init_lib.source_condition(unconditional_run, None, 2)["label"], [-1, -1])


def test_a_run_that_learns_from_its_source_resumes_only_with_the_same_source(trained_workdir, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(trained_workdir, source)
    workdir = tmp_path / "tuned"

    def config(steps):
        return finetune_config(source, 'model.prediction="velocity"', 'init.targets="source"',
                               f"train.max_steps={steps}", "train.checkpoint_every=2")

    with mock_flowers():
        first = loop.train(config(2), workdir, **QUIET)
        assert np.isfinite(first.last_metrics["loss"]) and first.last_metrics["loss"] > 0
        assert loop.train(config(4), workdir, **QUIET).final_step == 4  # the source is read again, unchanged
        shutil.rmtree(source / "checkpoints" / "6")  # the source's newest weights are now its step 4
        with pytest.raises(Exception, match="is not the one this run started from"):
            loop.train(config(6), workdir, **QUIET)
    checkpointer = Checkpointer(checkpoint_dir(workdir))
    saved = checkpointer.restore_config(4)
    checkpointer.close()
    assert checkpointer.latest_step() == 4 and saved.init.targets == "source"
    assert describe_init(saved).endswith("learning the source's own predictions")  # a bundle's record says so


def test_a_finetune_that_learns_its_own_prediction_from_its_source_starts_near_zero_loss(trained_workdir, tmp_path):
    from ddim.train import state as state_lib

    losses = {}
    with mock_flowers():
        for targets in ("data", "source"):
            run = loop.TrainingRun.prepare(finetune_config(trained_workdir, f'init.targets="{targets}"',
                                                           "model.dropout=0.0"), tmp_path / targets, **QUIET)
            step, _ = state_lib.compiled_steps(run.config, run.mesh, source=run.source)
            batch = next(run.train_batches())
            metrics = step(run.state, batch, run.train_rng)[1]
            losses[targets] = float(metrics.get("loss", metrics["noise_loss"]))  # the Keras loss is the noise MAE
            run.close()
    # Against the data the loss is the source's own training loss; against itself only the difference of the
    # BatchNorm batch statistics (training mode) from the running ones (the source's sampling mode) is left.
    assert losses["source"] < 0.25 * losses["data"], losses
