"""Class-conditional models: the class embedding, label dropout, classifier-free guidance, names and ids."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddim.errors import InputError
from ddim.model import DiffusionModel, init_variables
from ddim.sampling import Pipeline
from ddim.train import state as state_lib
from tests.conftest import CONFIGS, run_once, tiny_config
from tests.image_folders import write_plain_folder

NAMES = ("pink primrose", "sunflower", "daisy")


def conditional_config(*overrides):
    return tiny_config("model.class_conditional=true", "model.num_classes=3",
                       f"model.class_names={json.dumps(list(NAMES))}", "model.class_counts=[1, 0, 3]", *overrides)


@pytest.fixture(scope="module")
def pipe():
    config = conditional_config()
    model = DiffusionModel(config.model)
    variables = run_once(lambda k: init_variables(model, k), jax.random.key(0))
    # Non-zero head and class vectors, so the output depends on the class.
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x + 0.2 * jax.random.normal(jax.random.key(len(jax.tree_util.keystr(p))), x.shape)
        if "head" in jax.tree_util.keystr(p) or "classes" in jax.tree_util.keystr(p) else x,
        variables["params"])
    return Pipeline(config, {**variables, "params": params})


def test_names_and_ids_resolve_the_same_way(pipe):
    assert pipe.classes == NAMES
    np.testing.assert_array_equal(pipe.class_ids(["Sunflower", 1, "1", " daisy"], 4), [1, 1, 1, 2])
    np.testing.assert_array_equal(pipe.class_ids("sunflower", 3), [1, 1, 1])
    with pytest.raises(InputError, match=r"unknown class 'sunflowr'; closest: 'sunflower'"):
        pipe.class_ids("sunflowr", 1)
    with pytest.raises(InputError, match="out of range"):
        pipe.class_ids(7, 1)
    with pytest.raises(InputError, match="2 classes for 3 images"):
        pipe.class_ids(["daisy", "sunflower"], 3)


def test_classes_are_drawn_as_the_data_has_them(pipe):
    drawn = pipe.class_ids(None, 400, seed=0)
    assert set(drawn) == {0, 2}  # class 1 has no training images
    assert 0.65 < np.mean(drawn == 2) < 0.85  # 3 of 4
    np.testing.assert_array_equal(drawn, pipe.class_ids(None, 400, seed=0))


def test_guidance_one_is_the_conditional_prediction_and_zero_the_unconditional(pipe):
    model, variables = pipe.model, pipe.variables
    x = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
    rates = jnp.full((2, 1, 1, 1), 0.6), jnp.full((2, 1, 1, 1), 0.8)
    labels = jnp.array([1, 2])

    def denoise(cond):
        return model.apply(variables, x, *rates, False, cond, method=DiffusionModel.denoise)[0]

    conditional, unconditional = denoise({"label": labels}), denoise({"label": jnp.array([-1, -1])})
    assert float(jnp.abs(conditional - unconditional).max()) > 1e-3
    np.testing.assert_allclose(denoise({"label": labels, "guidance": jnp.ones(2)}), conditional, atol=1e-6)
    np.testing.assert_allclose(denoise({"label": labels, "guidance": jnp.zeros(2)}), unconditional, atol=1e-5)
    guided = denoise({"label": labels, "guidance": jnp.full(2, 3.0)})
    np.testing.assert_allclose(guided, unconditional + 3 * (conditional - unconditional), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_guidance_moves_samples_towards_the_class(pipe):
    """More guidance, further from the unconditional sample along the class direction."""
    uncond = pipe.generate(4, steps=4, classes="sunflower", guidance=0.0)
    cond = pipe.generate(4, steps=4, classes="sunflower", guidance=1.0)
    strong = pipe.generate(4, steps=4, classes="sunflower", guidance=3.0)
    direction = cond.astype(float) - uncond.astype(float)
    assert np.abs(direction).mean() > 0.5
    assert np.sum((strong.astype(float) - uncond) * direction) > np.sum(direction * direction)


@pytest.mark.slow
def test_label_dropout_one_trains_exactly_as_the_null_class():
    config = conditional_config("train.label_dropout=1.0")
    state = state_lib.create_train_state(config, jax.random.key(0))
    step = jax.jit(functools.partial(state_lib.train_step, ema_decay=0.999, ema_warmup=True, label_dropout=1.0))
    images = jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8))
    labelled, _ = step(state, {"image": images, "label": jnp.array([0, 1, 2, 1])}, jax.random.key(1))
    null, _ = step(state, {"image": images, "label": jnp.full((4,), -1)}, jax.random.key(1))  # not donated
    for a, b in zip(jax.tree.leaves(labelled.params), jax.tree.leaves(null.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_an_unconditional_model_refuses_classes_and_guidance():
    config = tiny_config()
    model = DiffusionModel(config.model)
    pipe = Pipeline(config, run_once(lambda k: init_variables(model, k), jax.random.key(0)))
    assert pipe.classes == ()
    for kwargs in ({"classes": "daisy"}, {"guidance": 2.0}):
        with pytest.raises(InputError, match="not class-conditional"):
            pipe.generate(1, steps=1, **kwargs)


@pytest.mark.slow
def test_class_conditional_training_on_a_folder_then_sampling_by_name(tmp_path):
    from tests.test_cli import assert_one_line_error, invoke

    data = tmp_path / "images"
    write_plain_folder(data / "cats", 6, size=20)
    write_plain_folder(data / "owls", 6, size=20, start=6)
    write_plain_folder(data, 2, size=20, start=12)  # in the root folder: no class, the null class only
    workdir = tmp_path / "run"
    trained = invoke("train", "--config", CONFIGS / "smoke.toml", "--data", data, "--workdir", workdir,
                     "--set", "model.class_conditional=true", "--set", "train.max_steps=2", "--set", "train.eval_every=0",
                     "--set", "data.val_fraction=0.0", "--set", "train.batch_size=4")
    assert trained.exit_code == 0, trained.output
    listed = invoke("sample", "--workdir", workdir, "--list-classes")
    assert listed.exit_code == 0 and "cats" in listed.output and "owls" in listed.output
    out = tmp_path / "samples"
    sampled = invoke("sample", "--workdir", workdir, "--num", 2, "--steps", 2, "--class", "owls", "--class", 0,
                     "--guidance", 2, "--out", out)
    assert sampled.exit_code == 0, sampled.output
    assert json.loads((out / "classes.json").read_text()) == {
        "0000.png": {"class": 1, "name": "owls"}, "0001.png": {"class": 0, "name": "cats"}}
    assert_one_line_error(invoke("sample", "--workdir", workdir, "--class", "owl", "--out", tmp_path / "x"),
                          "unknown class 'owl'; closest: 'owls' (ddim sample --list-classes lists them)")
    edited = invoke("edit", data / "cats" / "img_00000.png", "--workdir", workdir, "--class", "owls", "--guidance", 3,
                    "--steps", 2, "--out", tmp_path / "edits")
    assert edited.exit_code == 0 and (tmp_path / "edits" / "img_00000.png").is_file(), edited.output
