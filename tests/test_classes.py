"""Class-conditional models: the class embedding, label dropout, classifier-free guidance, names and ids."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ddim
from ddim.config import ConfigError
from ddim.errors import InputError
from ddim.model import DiffusionModel, init_variables
from ddim.nn import ClassEmbedding
from ddim.sampling import Pipeline
from ddim.spec import SamplingSpec
from ddim.train import state as state_lib
from tests.conftest import CONFIGS, normal, run_once, tiny_config
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
        lambda p, x: x + normal(len(jax.tree_util.keystr(p)), x.shape, 0.2)
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


def test_a_class_named_by_digits_is_that_name_and_an_int_is_an_id():
    """Folder classes sort as strings: the folder ``2`` has id 3. ``--class 2`` (a string) means the folder."""
    from ddim.sampling.classes import ClassSpace

    space = ClassSpace(True, ("0", "1", "10", "2"))
    assert [space.class_id(v) for v in ("2", " 10", 2, np.int64(2), "3")] == [3, 2, 2, 2, 3]
    with pytest.raises(InputError, match="out of range"):
        space.class_id("4")


def test_classes_are_drawn_as_the_data_has_them(pipe):
    drawn = pipe.class_ids(None, 400, seed=0)
    assert set(drawn) == {0, 2}  # class 1 has no training images
    assert 0.65 < np.mean(drawn == 2) < 0.85  # 3 of 4
    np.testing.assert_array_equal(drawn, pipe.class_ids(None, 400, seed=0))


def test_guidance_one_is_the_conditional_prediction_and_zero_the_unconditional(pipe):
    model, variables = pipe.model, pipe.variables
    x = normal(1, (2, 16, 16, 3))
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


def test_a_mix_of_two_classes_is_each_class_at_weights_zero_and_one(pipe):
    table = pipe.variables["params"]["network"]["classes"]["table"]["embedding"]
    embed = functools.partial(ClassEmbedding(3, table.shape[1]).apply, {"params": {"table": {"embedding": table}}})
    start, end = jnp.array([0, 1, 2, -1]), jnp.array([2, 0, -1, 1])
    pure_start, pure_end = embed(start), embed(end)
    np.testing.assert_array_equal(embed(start, end, jnp.zeros(4)), pure_start)
    np.testing.assert_array_equal(embed(start, end, jnp.ones(4)), pure_end)
    np.testing.assert_allclose(embed(start, end, jnp.full(4, 0.25)), 0.75 * pure_start + 0.25 * pure_end, atol=1e-6)
    np.testing.assert_array_equal(pure_start[3, 0, 0], table[3])  # -1 is the null class, the table's last row
    assert not np.allclose(pure_start, pure_end)


def test_the_network_sees_a_mix_at_its_ends_as_the_pure_classes_also_when_guided(pipe):
    model, variables = pipe.model, pipe.variables
    x = normal(2, (2, 16, 16, 3))
    rates = jnp.full((2, 1, 1, 1), 0.6), jnp.full((2, 1, 1, 1), 0.8)
    start, end = jnp.array([0, 1]), jnp.array([2, 2])

    def denoise(cond):
        return model.apply(variables, x, *rates, False, cond, method=DiffusionModel.denoise)[0]

    for guidance in ({}, {"guidance": jnp.full(2, 3.0)}):
        mixed = {"label": start, "label_to": end, **guidance}
        pure_start, pure_end = denoise({"label": start, **guidance}), denoise({"label": end, **guidance})
        np.testing.assert_array_equal(denoise({**mixed, "label_mix": jnp.zeros(2)}), pure_start)
        np.testing.assert_array_equal(denoise({**mixed, "label_mix": jnp.ones(2)}), pure_end)
        halfway = denoise({**mixed, "label_mix": jnp.full(2, 0.5)})
        assert float(jnp.abs(halfway - pure_start).max()) > 1e-4
        assert float(jnp.abs(halfway - pure_end).max()) > 1e-4


def test_the_class_path_of_an_interpolation(pipe):
    spec, weights = SamplingSpec(), np.linspace(0, 1, 5)
    two = pipe.class_space.path_condition(weights, spec, ["daisy", "Sunflower"])
    assert sorted(two) == ["label", "label_mix", "label_to"]
    np.testing.assert_array_equal(two["label"], [2] * 5)
    np.testing.assert_array_equal(two["label_to"], [1] * 5)
    np.testing.assert_array_equal(two["label_mix"], weights.astype(np.float32))
    for one in ("daisy", ["daisy"], ["daisy", 2]):  # one class, or twice the same: the plain class path
        cond = pipe.class_space.path_condition(weights, spec, one)
        assert sorted(cond) == ["label"] and list(cond["label"]) == [2] * 5
    guided = pipe.class_space.path_condition(weights, spec.replace(guidance=2.0), [0, 1])
    np.testing.assert_array_equal(guided["guidance"], np.full(5, 2.0, np.float32))
    assert pipe.class_space.path_condition(weights, spec, None) is None  # the null class all along


def test_interpolation_checks_its_classes(pipe):
    a = pipe.latents(1, seed=0)[0]
    cases = [
        ({"classes": ["daisy", "sunflower", "daisy"]}, "one class for the whole path or two .* got 3"),
        ({"classes": []}, "one class for the whole path or two .* got 0"),
        ({"classes": ["daisy", "sunflowr"]}, r"unknown class 'sunflowr'; closest: 'sunflower'"),
        ({"classes": ["daisy", 3]}, "class id 3 is out of range"),
        ({"guidance": 2.0}, "a guidance scale needs a class to guide towards"),
        ({"classes": "daisy", "guidance": -1.0}, "guidance scale must be >= 0"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InputError, match=message):
            pipe.interpolate(a, a, frames=3, steps=1, **kwargs)


@pytest.mark.slow
def test_interpolation_between_two_classes_ends_as_generate_with_each_class(pipe):
    """The first frame is generate with the start class, the last with the end class, from the same latents."""
    a, b = pipe.latents(2, seed=3)
    classes = ["daisy", "daisy", "sunflower", "sunflower"]
    same_latent = pipe.interpolate(a, a, frames=4, steps=2, classes=["daisy", "sunflower"])
    generated = pipe.generate(latents=np.stack([a] * 4), steps=2, classes=classes)
    np.testing.assert_array_equal(same_latent[[0, -1]], generated[[0, -1]])
    assert np.abs(same_latent[0].astype(float) - same_latent[-1]).mean() > 1  # the class changes the image
    # Two latents, guided: the same holds with the guidance scale on both sides.
    guided = pipe.interpolate(a, b, frames=4, steps=2, classes=["daisy", "sunflower"], guidance=3.0)
    generated = pipe.generate(latents=np.stack([a, a, b, b]), steps=2, classes=classes, guidance=3.0)
    np.testing.assert_array_equal(guided[[0, -1]], generated[[0, -1]])
    # A class mix is a cond like any other: every sampler takes it (here at weight 1, the end class itself).
    latents = np.stack([a, b])
    mixed = {"label": np.array([2, 2]), "label_to": np.array([1, 1]), "label_mix": np.ones(2, np.float32)}
    np.testing.assert_array_equal(pipe.generate(latents=latents, steps=3, sampler="dpmpp-2m", cond=mixed),
                                  pipe.generate(latents=latents, steps=3, sampler="dpmpp-2m", classes="sunflower"))


@pytest.mark.slow
def test_guidance_moves_samples_towards_the_class(pipe):
    """More guidance, further from the unconditional sample along the class direction."""
    uncond = pipe.generate(4, steps=4, classes="sunflower", guidance=0.0)
    cond = pipe.generate(4, steps=4, classes="sunflower", guidance=1.0)
    strong = pipe.generate(4, steps=4, classes="sunflower", guidance=3.0)
    direction = cond.astype(float) - uncond.astype(float)
    assert np.abs(direction).mean() > 0.5
    assert np.sum((strong.astype(float) - uncond) * direction) > np.sum(direction * direction)


@pytest.fixture(scope="module")
def adm():
    """A tiny model with ``model.class_embedding = "adm"``: ``(config, initial variables, denoise(cond))``.

    ``denoise`` runs it with its head and the blocks' scale-and-shift, which start at zero, moved, so that the
    output depends on the class.
    """
    config = conditional_config('model.embedding_injection="every-block"', 'model.class_embedding="adm"')
    model = DiffusionModel(config.model)
    variables = run_once(lambda k: init_variables(model, k), jax.random.key(0))
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x + normal(3, x.shape, 0.2)
        if "head" in jax.tree_util.keystr(p) or "scale_shift" in jax.tree_util.keystr(p) else x, variables["params"])
    x = normal(1, (2, 16, 16, 3))
    rates = jnp.full((2, 1, 1, 1), 0.6), jnp.full((2, 1, 1, 1), 0.8)

    def denoise(cond):
        return model.apply({**variables, "params": params}, x, *rates, False, cond, method=DiffusionModel.denoise)[0]

    return config, variables, denoise


def test_adm_class_embedding_adds_unit_vectors_to_the_block_embedding_and_guides_as_the_default(adm):
    """``model.class_embedding = "adm"``: a unit-normal class vector per class, as wide as the block embedding,
    added after its MLP; the class changes the output, and guidance works as with the default."""
    config, variables, denoise = adm
    table = variables["params"]["network"]["classes"]["table"]["embedding"]
    assert table.shape == (4, 4 * config.model.embedding_dims)  # 3 classes and the null class
    assert 0.8 < float(jnp.std(table)) < 1.2  # the default's is 1/sqrt(4) = 0.5
    labels = jnp.array([1, 2])
    conditional, unconditional = denoise({"label": labels}), denoise({"label": jnp.array([-1, -1])})
    assert float(jnp.abs(conditional - unconditional).max()) > 1e-3
    guided = denoise({"label": labels, "guidance": jnp.full(2, 3.0)})
    np.testing.assert_allclose(guided, unconditional + 3 * (conditional - unconditional), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_adm_class_embedding_mixes_two_classes_and_trains(adm):
    config, variables, denoise = adm
    mixed = {"label": jnp.array([1, 2]), "label_to": jnp.array([0, 0])}
    np.testing.assert_array_equal(denoise({**mixed, "label_mix": jnp.zeros(2)}), denoise({"label": mixed["label"]}))
    np.testing.assert_array_equal(denoise({**mixed, "label_mix": jnp.ones(2)}), denoise({"label": jnp.array([0, 0])}))

    state = state_lib.create_train_state(config, jax.random.key(0))
    step = jax.jit(functools.partial(state_lib.train_step, ema_decay=0.999, ema_warmup=True, label_dropout=0.1))
    images = jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8))
    before = np.asarray(state.params["network"]["classes"]["table"]["embedding"])
    state, metrics = step(state, {"image": images, "label": jnp.array([0, 1, 2, 1])}, jax.random.key(1))
    assert all(np.isfinite(float(value)) for value in metrics.values())
    moved = state.params["network"]["classes"]["table"]["embedding"] - before
    assert float(jnp.abs(moved[:3]).max()) > 0  # the class vectors train


def test_adm_class_embedding_needs_the_every_block_embedding():
    with pytest.raises(ConfigError, match='class_embedding "adm".*every-block'):
        conditional_config('model.class_embedding="adm"')
    with pytest.raises(ConfigError, match="model.class_embedding must be one of"):
        conditional_config('model.class_embedding="late"')


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
        with pytest.raises(InputError, match="not class-conditional"):
            pipe.interpolate(*pipe.latents(2), frames=3, steps=1, **kwargs)
    images = np.zeros((1, 16, 16, 3), np.uint8)
    for verb in (pipe.invert, pipe.reconstruct):
        with pytest.raises(InputError, match="not class-conditional"):
            verb(images, steps=1, classes="daisy")


@pytest.fixture(scope="module")
def conditional_run(tmp_path_factory):
    """A class-conditional model trained for 2 steps on a folder of two classes: ``(data, workdir)``."""
    from tests.test_cli import invoke

    root = tmp_path_factory.mktemp("conditional")
    data = root / "images"
    write_plain_folder(data / "cats", 6, size=20)
    write_plain_folder(data / "owls", 6, size=20, start=6)
    write_plain_folder(data, 2, size=20, start=12)  # in the root folder: no class, the null class only
    workdir = root / "run"
    trained = invoke("train", "--config", CONFIGS / "smoke.toml", "--data", data, "--workdir", workdir,
                     "--set", "model.class_conditional=true", "--set", "train.max_steps=2", "--set", "train.eval_every=0",
                     "--set", "data.val_fraction=0.0", "--set", "train.batch_size=4")
    assert trained.exit_code == 0, trained.output
    return data, workdir


def test_class_conditional_training_on_a_folder_then_sampling_by_name(conditional_run, tmp_path):
    from tests.test_cli import assert_one_line_error, invoke

    data, workdir = conditional_run
    listed = invoke("sample", "--workdir", workdir, "--list-classes")
    assert listed.exit_code == 0 and "cats" in listed.output and "owls" in listed.output
    out = tmp_path / "samples"
    sampled = invoke("sample", "--workdir", workdir, "--num", 2, "--steps", 2, "--class", "owls", "--class", 0,
                     "--guidance", 2, "--out", out)
    assert sampled.exit_code == 0, sampled.output
    assert json.loads((out / "classes.json").read_text()) == {
        "0000.png": {"class": 1, "name": "owls"}, "0001.png": {"class": 0, "name": "cats"}}
    # --trajectory samples the same classes with the same guidance: its last frame is the sample.
    traced = invoke("sample", "--workdir", workdir, "--num", 2, "--steps", 2, "--class", "owls", "--class", 0,
                    "--guidance", 2, "--trajectory", "--out", tmp_path / "traced")
    assert traced.exit_code == 0 and (tmp_path / "traced" / "trajectory.gif").is_file(), traced.output
    for name in ("0000.png", "0001.png", "classes.json"):
        assert (tmp_path / "traced" / name).read_bytes() == (out / name).read_bytes()
    assert_one_line_error(invoke("sample", "--workdir", workdir, "--class", "owl", "--out", tmp_path / "x"),
                          "unknown class 'owl'; closest: 'owls' (ddim sample --list-classes lists them)")
    edited = invoke("edit", data / "cats" / "img_00000.png", "--workdir", workdir, "--class", "owls", "--guidance", 3,
                    "--steps", 2, "--out", tmp_path / "edits")
    assert edited.exit_code == 0 and (tmp_path / "edits" / "img_00000.png").is_file(), edited.output


@pytest.mark.slow
def test_interpolating_from_one_class_to_another_and_inverting_with_a_class_on_the_command_line(
        conditional_run, tmp_path):
    from PIL import Image

    from tests.test_cli import assert_one_line_error, invoke

    data, workdir = conditional_run
    common = ["--workdir", workdir, "--steps", 2]
    out = tmp_path / "morph"
    result = invoke("interpolate", "--from", 5, "--to", 5, "--class", "cats", "--class", "owls", "--guidance", 2,
                    "--frames", 3, "--out", out, *common)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["0000.png", "0001.png", "0002.png", "interpolation.gif"]
    # The ends are what sampling the seed's noise with each class gives (ddim sample --seed 5 --num 1 --class ...).
    pipe = ddim.load(workdir)
    for frame, name in ((0, "cats"), (2, "owls")):
        expected = pipe.generate(latents=np.repeat(pipe.latents(1, seed=5), 3, axis=0), steps=2, classes=name,
                                 guidance=2.0)[frame]
        np.testing.assert_array_equal(np.asarray(Image.open(out / f"{frame:04d}.png")), expected)

    image = data / "owls" / "img_00006.png"
    result = invoke("interpolate", "--from", 1, "--to", image, "--class", "cats", "--class", "owls", "--frames", 2,
                    "--out", tmp_path / "to-image", *common)
    assert result.exit_code == 0 and (tmp_path / "to-image" / "0001.png").is_file(), result.output
    result = invoke("invert", image, "--class", "owls", "--out", tmp_path / "latents.npz", *common)
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "latents.npz") as stored:
        assert list(stored["classes"]) == [1]
    result = invoke("reconstruct", image, "--class", 1, "--out", tmp_path / "rec", *common)
    assert result.exit_code == 0 and (tmp_path / "rec" / "img_00006.png").is_file(), result.output

    morph = ["interpolate", "--from", 1, "--to", 2, "--frames", 2, *common]
    assert_one_line_error(invoke(*morph, "--class", "cats", "--class", "owl", "--out", tmp_path / "e1"),
                          "unknown class 'owl'; closest: 'owls'")
    assert_one_line_error(invoke(*morph, "--guidance", 2, "--out", tmp_path / "e2"),
                          "a guidance scale needs a class to guide towards")
    assert_one_line_error(invoke(*morph, "--class", "a", "--class", "b", "--class", "c", "--out", tmp_path / "e3"),
                          "--class: give one class for the whole path, or two (a start and an end class), not 3", 2)
    assert_one_line_error(invoke("invert", image, "--class", "dogs", "--out", tmp_path / "e4.npz", *common),
                          "unknown class 'dogs'")
