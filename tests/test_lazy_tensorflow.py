"""TensorFlow's lazy import (ddim/lazy_tensorflow.py): quiet unless debugging."""

import os
import subprocess
import sys

from ddim import lazy_tensorflow


def test_stderr_without_drops_the_noise_lines_and_keeps_the_rest(capfd):
    with lazy_tensorflow.stderr_without(("oneDNN custom operations are on",)):
        os.write(2, b"I0000 port.cc:153] oneDNN custom operations are on. You may see ...\n")
        os.write(2, b"something that matters\n")
    assert capfd.readouterr().err == "something that matters\n"


def test_importing_tensorflow_prints_nothing_unless_debugging():
    """TensorFlow's libraries log as they load whatever TF_CPP_MIN_LOG_LEVEL says (the oneDNN line, the CPU
    instructions line); a training log must not start with them."""
    code = "from ddim import lazy_tensorflow; lazy_tensorflow.tensorflow(); print('imported')"
    env = {key: value for key, value in os.environ.items() if key != "DDIM_DEBUG"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout == "imported\n", done.stderr
    assert not any(phrase in done.stderr for phrase in lazy_tensorflow.TF_IMPORT_NOISE), done.stderr
