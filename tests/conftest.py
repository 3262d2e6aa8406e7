"""Shared fixtures: tiny configs, mock TFDS data and a small trained checkpoint."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Before JAX starts: JAX's persistent compilation cache in a directory of this test session's own, whatever
# the environment says, so nothing is written into the user's home and nothing from an earlier session is
# reused. Many tests train, resume or sample the same tiny programs, in this process and in the CLI
# subprocesses they start (which read the variable); each program is compiled once per session.
os.environ["DDIM_COMPILATION_CACHE"] = tempfile.mkdtemp(prefix="ddim-test-compilation-cache-")
atexit.register(shutil.rmtree, os.environ["DDIM_COMPILATION_CACHE"], ignore_errors=True)
# LLVM's optimisations off for everything the test run compiles (and its CLI subprocesses, which inherit the
# variable), unless XLA_FLAGS already chooses a level: the suite is mostly compiling tiny programs, which this
# halves (a tiny model's training step 8 -> 4 s on two cores, a jax.random draw 2-5 -> 0.3 s), while the few
# cases that run a real network (the FID Inception, a bundled model's sampling) run slower; every test passes
# either way. How long the default run takes: pyproject.toml's addopts comment.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()
# Data caches of calls without a work directory go to a temporary directory, not the user's home.
if "DDIM_DATA_CACHE" not in os.environ:
    os.environ["DDIM_DATA_CACHE"] = tempfile.mkdtemp(prefix="ddim-test-data-cache-")
    atexit.register(shutil.rmtree, os.environ["DDIM_DATA_CACHE"], ignore_errors=True)

from ddim import compilation, runtime  # noqa: E402  (after the variables: ddim sets JAX's flags on import)

compilation.enable_compilation_cache()
# The allocator setting that each `ddim` command would otherwise restart itself to get (a second interpreter
# start, about 0.35 s on two cores): the suite's many CLI subprocesses start with it.
os.environ.update(runtime.fast_allocator_environment())

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "ddim" / "configs"

# Small enough to compile and run a step in about a second on a 2-core CPU.
TINY = [
    "model.image_size=16",
    "model.widths=[8, 16]",
    "model.block_depth=1",
    "model.embedding_dims=8",
    "data.dataset_repetitions=1",
    "train.batch_size=8",
    "train.log_every=2",
    "train.checkpoint_every=4",
    "train.eval_batches=1",
    "train.normalizer_batches=1",
    "train.grid_rows=1",
    "train.grid_cols=2",
    "train.sample_steps=2",
    "train.num_epochs=100",
    "train.max_steps=6",
]


def run_once(fn, *args):
    """``jax.jit(fn)(*args)``, compiled the cheap way (LLVM optimisations off on CPU, same results):
    for structure tests that run a function once, where compiling dominates."""
    import jax

    from ddim import compilation

    return compilation.compile_for_one_call(jax.jit(fn), *args)(*args)


def normal(seed: int, shape, scale: float = 1.0):
    """A float32 array of normal draws (times ``scale``) from NumPy's generator ``seed``: test inputs without
    ``jax.random``, whose threefry program compiles anew for every shape when called outside a jit (2-5 s each
    on two cores)."""
    import jax.numpy as jnp
    import numpy as np

    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def uniform(seed: int, shape):
    """A float32 array of draws uniform in [0, 1) from NumPy's generator ``seed`` (see :func:`normal`)."""
    import jax.numpy as jnp
    import numpy as np

    return jnp.asarray(np.random.default_rng(seed).uniform(size=shape), jnp.float32)


def tiny_config(*overrides: str):
    from ddim.config import load_config

    return load_config(CONFIGS / "smoke.toml", [*TINY, *overrides])


NO_FLOWERS = "needs a prepared oxford_flowers102 copy in $TFDS_DATA_DIR (the tests download nothing)"


def real_data_dir() -> Path | None:
    """The prepared oxford_flowers102 copy in $TFDS_DATA_DIR, if there is one (else the tests that need it skip)."""
    candidate = os.environ.get("TFDS_DATA_DIR")
    if candidate and (Path(candidate) / "oxford_flowers102").is_dir():
        # Absolute: a relative $TFDS_DATA_DIR would not resolve from the symlinks and work directories that tests
        # make under tmp_path.
        return Path(candidate).resolve()
    return None


@contextlib.contextmanager
def mock_flowers(num_examples: int = 32):
    """TFDS mock data: random images of random sizes, ``num_examples`` per split expression."""
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=num_examples):
        yield


@pytest.fixture(scope="session")
def trained_workdir(tmp_path_factory) -> Path:
    """A tiny model trained for 6 steps on mock data (checkpoints at steps 4 and 6)."""
    from ddim.train import train

    workdir = tmp_path_factory.mktemp("trained")
    with mock_flowers():
        train(tiny_config(), workdir, log=lambda message: None)
    return workdir


# The classes of `conditional_workdir`: a name with a space (quoted in commands) and one of digits (an id to the CLI).
CONDITIONAL_CLASSES = ("daisy", "pink primrose", "2", "sunflower")


@pytest.fixture(scope="session")
def conditional_workdir(tmp_path_factory) -> Path:
    """A tiny class-conditional model trained for 2 steps on an image folder of :data:`CONDITIONAL_CLASSES`."""
    import json

    from ddim.train import train
    from tests.image_folders import write_plain_folder

    root = tmp_path_factory.mktemp("conditional")
    for index, name in enumerate(CONDITIONAL_CLASSES):
        write_plain_folder(root / "images" / name, 2 + index, start=10 * index)
    config = tiny_config("model.class_conditional=true", f"data.image_dir={json.dumps(str(root / 'images'))}",
                         "data.val_fraction=0.0", "train.eval_every=0", "train.batch_size=4", "train.max_steps=2",
                         "train.checkpoint_every=2")
    train(config, root / "run", log=lambda message: None)
    return root / "run"


@pytest.fixture(scope="session")
def ui_server(trained_workdir):
    """``ddim serve`` on the tiny trained model (127.0.0.1, a free port), for the API and browser tests.

    Stopped with SIGTERM at the end of the session; it must exit cleanly and remove its temporary files.
    """
    from tests.ui_harness import serving

    with serving(trained_workdir, "--max-images", "8", "--max-steps", "400") as server:
        yield server
    assert server.process.returncode == 0, server.output
    assert not server.temp_dir.exists(), f"{server.temp_dir} was not removed"


@pytest.fixture(scope="session")
def conditional_ui_server(conditional_workdir):
    """``ddim serve`` on the tiny class-conditional model, as :func:`ui_server`."""
    from tests.ui_harness import serving

    with serving(conditional_workdir, "--max-images", "8", "--max-steps", "50") as server:
        yield server
    assert server.process.returncode == 0, server.output
