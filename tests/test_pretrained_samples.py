"""Every model bundled in ddim/pretrained/ makes flowers, not noise (by the standard FID Inception's features).

A bundled model's samples must be much nearer real Oxford Flowers images than uniform noise is: the mean
pool feature of 16 samples (20 steps, or a student's own count, seed 0) at most half as far from that of 64 real
images of the model's size as the mean feature of 16 uniform-noise images. The check runs in a process of its
own with XLA's usual optimisation: the test run switches LLVM's optimisations off (tests/conftest.py), which
makes this check of a real network 1.5 times slower (flowers64: 90 s against 59 s on two cores). Measured on
the Keras recipe at 32x32 after 1,000 training steps (FID 92.6), the ratio is 0.38-0.45 over seeds 0-4; a
randomly initialised network gives 1.04, a grey image 0.98. One case per bundled model (flowers64, flowers32);
the negative case shows the same check fails for a model whose samples are noise. Needs the FID Inception's
weights ($DDIM_FID_WEIGHTS, as .ci/run provides them) and the prepared Flowers copy ($TFDS_DATA_DIR), else
skipped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import ddim
from ddim.pretrained import ENV, PACKAGE_ROOT, available, export_checkpoint
from tests.conftest import NO_FLOWERS, REPO, real_data_dir
from tests.test_fid_inception import standard_weights  # noqa: F401  (a fixture)

REAL_IMAGES, SAMPLES, STEPS = 64, 16, 20
FACTOR = 2.0
"""How many times nearer the real images' mean feature the samples' must be than uniform noise's."""

needs_flowers = pytest.mark.skipif(real_data_dir() is None, reason=NO_FLOWERS)


def real_flowers(config, cache_dir) -> np.ndarray:
    """The first :data:`REAL_IMAGES` images of the TFDS ``test`` split, preprocessed to the model's size."""
    from ddim.data import load_split

    data = dataclasses.replace(config.data, data_dir=str(real_data_dir()), image_dir="")
    return np.asarray(load_split(dataclasses.replace(config, data=data), f"test[:{REAL_IMAGES}]", cache_dir))


def mean_feature_distances(pipe, extractor, cache_dir) -> tuple[float, float]:
    """How far the mean FID pool feature of ``pipe``'s samples, and of as many uniform-noise images, lies from
    the real images' mean feature."""
    real = extractor(real_flowers(pipe.config, cache_dir)).mean(axis=0)
    # At 20 steps, or the only count a distilled student takes.
    samples = pipe.generate(SAMPLES, steps=pipe.config.model.distilled_steps or STEPS, seed=0)
    noise = np.random.default_rng(0).integers(0, 256, samples.shape, dtype=np.uint8)
    return tuple(float(np.linalg.norm(extractor(images).mean(axis=0) - real)) for images in (samples, noise))


def distances_in_a_process_of_its_own(name: str, weights, cache_dir) -> tuple[float, float]:
    """:func:`mean_feature_distances` of the bundled model ``name``, run by this module as a script in a fresh
    interpreter with XLA's default optimisation level (3)."""
    flags = re.sub(r"--xla_backend_optimization_level=\S+", "", os.environ.get("XLA_FLAGS", ""))
    env = {**os.environ, "XLA_FLAGS": f"{flags} --xla_backend_optimization_level=3".strip()}
    done = subprocess.run([sys.executable, "-m", "tests.test_pretrained_samples", name, str(weights), str(cache_dir)],
                          cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    samples, noise = json.loads(done.stdout.splitlines()[-1])
    return samples, noise


def assert_flowers(model: str, samples: float, noise: float) -> None:
    assert samples * FACTOR < noise, (
        f"{model}: the mean FID feature of its samples is {samples:.2f} from real Flowers', not under "
        f"1/{FACTOR:g} of uniform noise's {noise:.2f}: its samples are not flowers")


@needs_flowers
# The default model in the default run; every bundle with `pytest -m "slow or not slow"` (20-35 s each on 2 cores).
@pytest.mark.parametrize("name", [pytest.param(manifest.name, marks=() if number == 0 else pytest.mark.slow)
                                  for number, manifest in enumerate(available(PACKAGE_ROOT))])
def test_a_bundled_models_samples_are_flowers_not_noise(name, standard_weights, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.delenv(ENV, raising=False)
    assert_flowers(name, *distances_in_a_process_of_its_own(name, standard_weights, tmp_path))


@needs_flowers
@pytest.mark.slow  # the check's negative control (about 20 s); the default run keeps the positive case
def test_the_check_fails_for_a_model_whose_samples_are_noise(trained_workdir, standard_weights, tmp_path,  # noqa: F811
                                                             monkeypatch):
    """The tiny checkpoint (6 steps on random mock images) exported as a bundled model makes noise."""
    export_checkpoint(trained_workdir, "noise16", root=tmp_path / "bundles")
    monkeypatch.setenv(ENV, str(tmp_path / "bundles"))  # the check's process inherits it
    with pytest.raises(AssertionError, match="its samples are not flowers"):
        assert_flowers("noise16", *distances_in_a_process_of_its_own("noise16", standard_weights, tmp_path))


if __name__ == "__main__":
    # python -m tests.test_pretrained_samples NAME WEIGHTS CACHE_DIR: the distances for a bundled model, as JSON.
    from ddim.evaluation.fid_inception import FIDInceptionExtractor

    name, weights, cache_dir = sys.argv[1:]
    distances = mean_feature_distances(ddim.load(f"pretrained:{name}"),
                                       FIDInceptionExtractor.from_file(weights, batch_size=16), cache_dir)
    print(json.dumps(distances))
