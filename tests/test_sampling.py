"""The Python API (ddim.load / Pipeline.generate / save_images)."""

import numpy as np
import pytest

import ddim
from ddim.checkpoint import CheckpointError


@pytest.fixture(scope="module")
def pipe(trained_workdir):
    return ddim.load(trained_workdir)


def test_load_and_generate_round_trip(pipe, tmp_path):
    assert pipe.step == 6 and pipe.config.model.image_size == 16
    images = pipe.generate(3, steps=2, seed=0)
    assert images.shape == (3, 16, 16, 3) and images.dtype == np.uint8
    np.testing.assert_array_equal(images, pipe.generate(3, steps=2, seed=0))
    assert not np.array_equal(images, pipe.generate(3, steps=2, seed=1))
    paths = ddim.save_images(images, tmp_path / "out")
    assert sorted(p.name for p in paths) == ["0000.png", "0001.png", "0002.png", "grid.png"]
    from PIL import Image

    np.testing.assert_array_equal(np.asarray(Image.open(paths[1])), images[1])


def test_batches_are_deterministic_and_bounded(pipe):
    counts = []
    images = pipe.generate(5, steps=2, seed=3, batch_size=2, on_batch=counts.append)
    assert images.shape == (5, 16, 16, 3) and counts == [2, 2, 1]
    np.testing.assert_array_equal(images, pipe.generate(5, steps=2, seed=3, batch_size=2))


def test_generate_rejects_bad_arguments(pipe):
    with pytest.raises(ValueError, match="diffusion steps must be an integer >= 1"):
        pipe.generate(2, steps=0)
    with pytest.raises(ValueError, match="number of images must be >= 1"):
        pipe.generate(0, steps=2)
    with pytest.raises(ValueError,
                       match=r"unknown sampler 'euler' \(choose from ddim, dpmpp-2m, dpmpp-3m, consistency\)"):
        pipe.generate(2, steps=2, sampler="euler")
    with pytest.raises(ValueError, match=r"unknown spacing 'linear' \(choose from uniform, logsnr, karras\)"):
        pipe.generate(2, steps=2, spacing="linear")
    with pytest.raises(ValueError, match="eta > 0 needs the ddim sampler"):
        pipe.generate(2, steps=2, sampler="dpmpp-2m", eta=1.0)
    with pytest.raises(ValueError, match="eta must be >= 0"):
        pipe.generate(2, steps=2, eta=-0.5)


def test_samplers_and_spacings_are_deterministic_and_differ(pipe):
    images = pipe.generate(2, steps=3, seed=0, sampler="dpmpp-2m", spacing="logsnr")
    assert images.shape == (2, 16, 16, 3) and images.dtype == np.uint8
    np.testing.assert_array_equal(images, pipe.generate(2, steps=3, seed=0, sampler="dpmpp-2m", spacing="logsnr"))
    assert not np.array_equal(images, pipe.generate(2, steps=3, seed=0))


def test_load_a_step_directory_and_a_missing_path(trained_workdir, tmp_path):
    """Every form of path is ``locate``'s (tests/test_checkpoint.py); here, that ``load`` passes them on."""
    assert ddim.load(trained_workdir / "checkpoints" / "4").step == 4
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        ddim.load(tmp_path / "nothing-here")


def test_checkpoint_with_an_incompatible_config_is_refused(trained_workdir, tmp_path):
    import json
    import shutil

    workdir = tmp_path / "edited"
    shutil.copytree(trained_workdir, workdir)
    config_file = workdir / "checkpoints" / "6" / "config" / "metadata"
    values = json.loads(config_file.read_text())
    values["model"]["widths"] = [8, 24]
    config_file.write_text(json.dumps(values))
    pipe = ddim.load(workdir)  # loading traces nothing: the first program's trace checks the weights
    with pytest.raises(CheckpointError, match="does not match its config"):
        pipe.generate(1)
