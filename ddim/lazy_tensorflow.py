"""TensorFlow (TFDS decoding, TensorBoard events, the Keras InceptionV3), imported on first use with every GPU
hidden from it and the noise its libraries print as they load held back."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
from typing import Iterator

# What TensorFlow's C++ libraries print on stderr as they load, before their logging is set up and so whatever
# TF_CPP_MIN_LOG_LEVEL says (TensorFlow 2.21: once per library): that its oneDNN kernels are on, which CPU
# instructions the build leaves out. Nothing a user acts on; `ddim --debug` (DDIM_DEBUG=1) shows them.
TF_IMPORT_NOISE = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
    "cpu_feature_guard",
    "This TensorFlow binary is optimized to use available CPU instructions",
)


@contextlib.contextmanager
def stderr_without(noise: tuple[str, ...]) -> Iterator[None]:
    """Run the block with the process's stderr (file descriptor 2, which C++ libraries write to) held back,
    then write back every line that contains none of ``noise``, in order."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to hold back
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not any(phrase in line for phrase in noise)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


@functools.cache
def tensorflow():
    """TensorFlow, imported on first use, with every GPU hidden from it.

    Importing it is slow and only some paths need it; hiding the GPUs keeps it
    from taking accelerator memory that JAX needs. What its libraries print as
    they load (:data:`TF_IMPORT_NOISE`, which ``TF_CPP_MIN_LOG_LEVEL``, set by
    ``import ddim``, does not silence) is left out unless ``DDIM_DEBUG`` is set;
    its numerics (oneDNN's kernels included) are untouched.
    """
    from ddim.errors import debug

    with contextlib.nullcontext() if debug() else stderr_without(TF_IMPORT_NOISE):
        import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # pragma: no cover - devices were already initialised
        pass
    return tf
