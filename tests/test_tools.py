"""DDIM's tools (Pipeline.invert/reconstruct/interpolate/edit/inpaint/trajectory and their commands)."""

import warnings

import numpy as np
import pytest
from PIL import Image

import ddim
from ddim.diffusion import slerp
from ddim.images import InputError
from tests.test_cli import assert_one_line_error, invoke


@pytest.fixture(scope="module")
def pipe(trained_workdir):
    return ddim.load(trained_workdir)


@pytest.fixture(scope="module")
def images(pipe):
    """Images the model itself generates (what it can reconstruct best), uint8 16x16."""
    return pipe.generate(4, steps=2, seed=11)


# --- slerp (no model) ---------------------------------------------------------------------------


def test_slerp_ends_are_the_inputs_and_frames_keep_the_norm():
    a, b = np.random.default_rng(0).standard_normal((2, 8, 8, 3))
    b = b * (np.linalg.norm(a) / np.linalg.norm(b))  # equal norms
    frames = np.asarray(slerp(a, b, np.linspace(0, 1, 7)))
    np.testing.assert_allclose(frames[0], a, atol=1e-5)
    np.testing.assert_allclose(frames[-1], b, atol=1e-5)
    norms = np.linalg.norm(frames.reshape(7, -1), axis=1)
    np.testing.assert_allclose(norms, np.linalg.norm(a), rtol=1e-5)
    # A straight line would lose norm in the middle; slerp goes round the sphere.
    assert np.linalg.norm((a + b) / 2) < 0.9 * norms[3]
    # Unequal norms: the norm moves linearly; parallel inputs: no division by zero.
    halfway = slerp(a, 3 * a, [0.5])[0]
    np.testing.assert_allclose(np.linalg.norm(halfway), 2 * np.linalg.norm(a), rtol=1e-5)
    np.testing.assert_allclose(halfway, 2 * a, atol=1e-4)


# --- the verbs -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_reconstruction_error_shrinks_with_steps(pipe, images):
    errors = [pipe.reconstruct(images, steps=steps).errors.mean() for steps in (2, 4, 16)]
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 1e-3, errors
    result = pipe.reconstruct(images, steps=4)
    assert result.images.shape == images.shape and result.images.dtype == np.uint8
    assert result.latents.shape == images.shape and result.latents.dtype == np.float32
    np.testing.assert_array_equal(result.inputs, images)
    # generate from the inverted latents with the same steps is the reconstruction.
    np.testing.assert_array_equal(pipe.generate(latents=result.latents, steps=4), result.images)
    assert result.errors == pytest.approx(np.mean((result.images / 255.0 - images / 255.0) ** 2, axis=(1, 2, 3)),
                                          abs=2e-4)


@pytest.mark.slow
def test_seeded_latents_and_edit_at_strength_one_are_plain_sampling(pipe, images):
    # (Shapes and steps shared with the other tests here, so that they share compilations.)
    seeded = pipe.generate(4, steps=2, seed=5)
    latents = pipe.latents(4, seed=5)
    np.testing.assert_array_equal(pipe.generate(latents=latents, steps=2), seeded)
    np.testing.assert_array_equal(pipe.edit(images, strength=1.0, steps=2, seed=5), seeded)
    # In batches, batch i's noise comes from its own key, as in generate: the first batch is unchanged.
    np.testing.assert_array_equal(pipe.latents(3, seed=5, batch_size=2)[:2], pipe.latents(2, seed=5))
    assert not np.array_equal(pipe.latents(3, seed=5, batch_size=2)[2], pipe.latents(3, seed=5)[2])
    # Lower strength keeps more of the input.
    close = pipe.edit(images, strength=0.2, steps=2, seed=5).astype(float)
    far = pipe.edit(images, strength=0.9, steps=2, seed=5).astype(float)
    assert np.abs(close - images).mean() < np.abs(far - images).mean()
    np.testing.assert_array_equal(pipe.edit(images, strength=0.2, steps=2, seed=5), close)


@pytest.mark.slow
def test_inpaint_keeps_the_known_region_and_fills_the_hole(pipe, images):
    holed = images.copy()
    mask = np.zeros((16, 16), bool)
    mask[4:12, 3:10] = True
    holed[:, mask] = 0  # a black hole: the filled region must not stay black
    filled = pipe.inpaint(holed, mask, steps=2, seed=1)
    np.testing.assert_array_equal(filled[:, ~mask], holed[:, ~mask])
    assert filled[:, mask].mean() > 20
    np.testing.assert_array_equal(pipe.inpaint(holed, mask, steps=2, seed=1), filled)
    # One mask per image, as uint8 (white = fill), gives the same.
    per_image = np.repeat((mask * 255).astype(np.uint8)[None], len(images), axis=0)
    np.testing.assert_array_equal(pipe.inpaint(holed, per_image, steps=2, seed=1), filled)


@pytest.mark.slow
def test_interpolation_ends_are_the_two_samples(pipe):
    latents = pipe.latents(4, seed=3)
    frames = pipe.interpolate(latents[0], latents[1], frames=4, steps=2)
    assert frames.shape == (4, 16, 16, 3)
    np.testing.assert_array_equal(frames[[0, -1]], pipe.generate(latents=latents, steps=2)[:2])


@pytest.mark.slow
def test_trajectory_ends_with_the_sample(pipe):
    frames = pipe.trajectory(4, steps=2, seed=4)
    assert frames.shape == (2, 4, 16, 16, 3) and frames.dtype == np.uint8
    np.testing.assert_array_equal(frames[-1], pipe.generate(4, steps=2, seed=4))
    assert not np.array_equal(frames[0], frames[1])


@pytest.mark.slow
def test_images_of_another_size_are_cropped_and_resized_with_a_notice(pipe, images):
    big = np.repeat(np.repeat(images, 3, axis=1), 2, axis=2)  # 48x32: crop to 32x32, resize to 16x16
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        latents = pipe.invert(list(big[:3]) + [images[0]], steps=2)
    assert latents.shape == (4, 16, 16, 3)
    assert any("centre-cropped and resized to 16x16" in str(w.message) for w in caught)


def test_bad_inputs_are_one_clear_value_error_each(pipe):
    images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    mask = np.ones((16, 16), bool)
    cases = [
        (lambda: pipe.invert(images[:0]), "no images given"),
        (lambda: pipe.invert([]), "no images given"),
        (lambda: pipe.invert(images, steps=0), "steps must be an integer >= 1"),
        (lambda: pipe.invert(images[..., :2]), "has 2 channels, the model takes 3"),
        (lambda: pipe.invert(np.full((2, 16, 16, 3), 1.5, np.float32)), r"must have values in \[0, 1\]"),
        (lambda: pipe.invert(images.astype(np.int64)), "must be uint8 or float"),
        (lambda: pipe.invert(images, spacing="cosine"), "unknown spacing 'cosine'"),
        (lambda: pipe.invert("does-not-exist.png"), "does not exist"),
        (lambda: pipe.reconstruct(images, steps=-1), "steps must be"),
        (lambda: pipe.edit(images, strength=0.0), r"strength must be in \(0, 1\]"),
        (lambda: pipe.edit(images, strength=1.5), r"strength must be in \(0, 1\]"),
        (lambda: pipe.edit(images, strength=float("nan")), r"strength must be in \(0, 1\]"),
        (lambda: pipe.edit(images, sampler="euler"), "unknown sampler 'euler'"),
        (lambda: pipe.inpaint(images, np.ones((8, 8), bool)), "mask 0 is 8x8 but its image is 16x16"),
        (lambda: pipe.inpaint(images, np.zeros((16, 16), bool)), "marks nothing to fill"),
        (lambda: pipe.inpaint(images, [mask, mask]), "2 masks for 4 images"),
        (lambda: pipe.generate(latents=np.zeros((2, 8, 8, 3))), r"latents must have shape \(N, 16, 16, 3\)"),
        (lambda: pipe.generate(3, latents=np.zeros((2, 16, 16, 3))), "num_images is 3 but 2 latents"),
        (lambda: pipe.interpolate(np.zeros((16, 16, 3)), np.ones((16, 16, 3)), frames=1), "frames must be"),
        (lambda: pipe.interpolate(np.zeros((2, 16, 16, 3)), np.ones((16, 16, 3))), "one latent at each end"),
        (lambda: pipe.latents(0), "number of latents must be >= 1"),
        (lambda: pipe.trajectory(0), "number of images must be >= 1"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
        with pytest.raises(InputError):  # the CLI prints these as one error: line
            call()


# --- the commands --------------------------------------------------------------------------------


def write_image(path, size=(16, 16), seed=0):
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def test_every_tool_command_end_to_end(trained_workdir, tmp_path):
    a, b = write_image(tmp_path / "a.png"), write_image(tmp_path / "b.jpg", size=(24, 20), seed=1)
    mask = np.zeros((16, 16), np.uint8)
    mask[2:9, 5:12] = 255
    Image.fromarray(mask).save(tmp_path / "mask.png")
    common = ["--workdir", trained_workdir, "--steps", 2]

    result = invoke("invert", a, b, "--out", tmp_path / "latents.npz", *common)
    assert result.exit_code == 0, result.output
    assert "note: 1 image(s) (the first 20x24) centre-cropped and resized to 16x16" in result.output
    with np.load(tmp_path / "latents.npz") as stored:
        assert stored["latents"].shape == (2, 16, 16, 3) and int(stored["steps"]) == 2
        assert [str(f) for f in stored["files"]] == [str(a), str(b)] and str(stored["spacing"]) == "uniform"
    assert_one_line_error(invoke("invert", a, "--out", tmp_path / "latents.npz", *common), "already exists")

    result = invoke("reconstruct", a, b, "--out", tmp_path / "rec", *common)
    assert result.exit_code == 0, result.output
    assert "mean squared error" in result.output.splitlines()[-1]
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == ["a.png", "b.png", "comparison.png"]
    assert np.asarray(Image.open(tmp_path / "rec" / "comparison.png")).shape == (2 * 18 + 2, 2 * 18 + 2, 3)

    result = invoke("interpolate", "--from", 3, "--to", a, "--frames", 3, "--out", tmp_path / "morph", *common)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "morph").iterdir()) == [
        "0000.png", "0001.png", "0002.png", "interpolation.gif"]
    assert Image.open(tmp_path / "morph" / "interpolation.gif").n_frames == 3

    result = invoke("edit", a, "--strength", 0.5, "--out", tmp_path / "edit", "--seed", 1, *common)
    assert result.exit_code == 0, result.output
    edited = np.asarray(Image.open(tmp_path / "edit" / "a.png"))
    assert edited.shape == (16, 16, 3)

    result = invoke("inpaint", a, "--mask", tmp_path / "mask.png", "--out", tmp_path / "fill", *common)
    assert result.exit_code == 0, result.output
    filled, original = np.asarray(Image.open(tmp_path / "fill" / "a.png")), np.asarray(Image.open(a))
    np.testing.assert_array_equal(filled[mask == 0], original[mask == 0])

    result = invoke("sample", "--num", 2, "--trajectory", "--out", tmp_path / "traj", "--sampler", "dpmpp-2m",
                    *common)
    assert result.exit_code == 0, result.output
    gif = Image.open(tmp_path / "traj" / "trajectory.gif")
    assert gif.n_frames >= 2  # Pillow merges identical consecutive frames (the held last one)
    assert sorted(p.name for p in (tmp_path / "traj").iterdir()) == [
        "0000.png", "0001.png", "grid.png", "trajectory.gif"]


@pytest.mark.parametrize(
    "args,text,code",
    [
        (["invert", "missing.png"], "image missing.png does not exist", 1),
        (["reconstruct", "a.png", "--steps", "0"], "--steps must be >= 1", 2),
        (["edit", "a.png", "--strength", "0"], "--strength must be in (0, 1]", 2),
        (["edit", "a.png", "--strength", "1.2"], "--strength must be in (0, 1]", 2),
        (["edit", "a.png", "--sampler", "euler"], "unknown --sampler 'euler'", 2),
        (["inpaint", "a.png", "--mask", "missing.png"], "mask missing.png does not exist", 1),
        (["interpolate", "--from", "1", "--to", "nope", "--frames", "4"], "--to 'nope' is neither a seed", 2),
        (["interpolate", "--from", "1", "--to", "2", "--frames", "1"], "--frames must be >= 2", 2),
        (["interpolate", "--from", "1", "--to", "2", "--class", "a", "--class", "b", "--class", "c"],
         "--class: give one class for the whole path, or two (a start and an end class), not 3", 2),
        (["interpolate", "--from", "1", "--to", "2", "--guidance", "-1"], "--guidance must be >= 0", 2),
        (["reconstruct", "a.png", "sub/a.png"], "would both be written as a.png", 1),
    ],
)
def test_tool_commands_reject_bad_input_before_loading_the_model(tmp_path, monkeypatch, args, text, code):
    monkeypatch.chdir(tmp_path)
    write_image(tmp_path / "a.png")
    (tmp_path / "sub").mkdir()
    write_image(tmp_path / "sub" / "a.png")
    # A work directory that does not exist: these errors must come before any attempt to load it.
    assert_one_line_error(invoke(*args, "--workdir", tmp_path / "no-run"), text, code)


@pytest.mark.slow
def test_tool_commands_report_unusable_files(trained_workdir, tmp_path):
    (tmp_path / "broken.png").write_bytes(b"not a png")
    write_image(tmp_path / "a.png")
    write_image(tmp_path / "wrong-size-mask.png", size=(8, 8))
    common = ["--workdir", trained_workdir, "--steps", 1]
    assert_one_line_error(invoke("edit", tmp_path / "broken.png", "--out", tmp_path / "o", *common),
                          "cannot read image")
    assert_one_line_error(invoke("inpaint", tmp_path / "a.png", "--mask", tmp_path / "broken.png",
                                 "--out", tmp_path / "o2", *common), "cannot read image")
    assert_one_line_error(invoke("inpaint", tmp_path / "a.png", "--mask", tmp_path / "wrong-size-mask.png",
                                 "--out", tmp_path / "o3", *common), "mask 0 is 8x8 but its image is 16x16")


def test_an_unconditional_checkpoint_refuses_classes_and_guidance_in_every_tool(trained_workdir, tmp_path):
    image = write_image(tmp_path / "a.png")
    common = ["--workdir", trained_workdir, "--steps", 1]
    refusals = [
        (["interpolate", "--from", 1, "--to", 2, "--class", "daisy"], "takes no classes"),
        (["interpolate", "--from", 1, "--to", 2, "--class", 0, "--class", 1], "takes no classes"),
        (["interpolate", "--from", 1, "--to", 2, "--guidance", 2], "takes no guidance scale"),
        (["invert", image, "--class", 0], "takes no classes"),
        (["reconstruct", image, "--class", "daisy"], "takes no classes"),
    ]
    for index, (args, text) in enumerate(refusals):
        out = tmp_path / ("out.npz" if args[0] == "invert" else f"out{index}")
        refusal = f"this model is not class-conditional (trained without model.class_conditional), so it {text}"
        assert_one_line_error(invoke(*args, "--out", out, *common), refusal)
