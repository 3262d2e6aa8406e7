"""`ddim env` (ddim/environment.py), and what it reports on: the native code's build (a missing compiler is one
note line, built before the first trace), children started without the allocator layer, and the records that
name the convolutions' kernels."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddim import onednn, runtime
from ddim.cli import app
from ddim.workdir.records import read_records

SECTIONS = ("Packages", "JAX", "Native code", "Caches", "Environment variables")


def test_env_prints_every_section():
    result = CliRunner().invoke(app, ["env"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("ddim ") and lines[1].startswith("Python ") and lines[2].startswith("Platform: ")
    assert [line for line in lines if line in SECTIONS] == list(SECTIONS)
    for item in ("jax", "tensorflow-datasets", "orbax-checkpoint", "gradio", "backend", "devices",
                 "oneDNN convolutions", "allocator layer", "JAX compilation", "native kernels", "FID weights"):
        assert any(line.split()[:len(item.split())] == item.split() for line in lines), item
    assert "DDIM_COMPILATION_CACHE" in result.output  # the test session sets it


def test_env_json_parses_and_names_the_native_code_and_the_caches(monkeypatch, tmp_path):
    monkeypatch.setenv("DDIM_FID_CACHE", str(tmp_path))
    (tmp_path / "weights.npz").write_bytes(b"x" * 1000)
    result = CliRunner().invoke(app, ["env", "--json"])
    assert result.exit_code == 0, result.output
    values = json.loads(result.output)
    assert list(values) == ["ddim", "python", "platform", "packages", "jax", "native_code", "caches", "environment"]
    assert values["packages"]["jax"] and values["packages"]["numpy"]
    assert values["jax"]["backend"] == "cpu" and values["jax"]["devices"][0]["platform"] == "cpu"
    assert values["caches"]["fid_weights"] == {"path": str(tmp_path), "bytes": 1000, "note": None}
    convolutions = values["native_code"]["onednn_convolutions"]
    assert convolutions["state"] == ("available" if onednn.available() else "unavailable")
    assert values["native_code"]["allocator_layer"]["state"] in ("active", "not active", "off", "unavailable")
    assert values["environment"]["DDIM_FID_CACHE"] == str(tmp_path)


def test_env_says_when_the_convolutions_are_turned_off(monkeypatch):
    monkeypatch.setenv("DDIM_ONEDNN", "0")
    values = json.loads(CliRunner().invoke(app, ["env", "--json"]).output)
    assert values["native_code"]["onednn_convolutions"] == {"state": "off", "detail": "DDIM_ONEDNN=0"}


# -- a build that cannot happen costs one line --------------------------------------------------------------------


@pytest.fixture
def nothing_built(monkeypatch, tmp_path):
    """No library built yet (an empty kernel cache), no note printed yet in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("DDIM_COMPILATION_CACHE", raising=False)
    monkeypatch.setattr(runtime, "_noted", set())
    monkeypatch.setattr(onednn, "_reason", onednn._reason)
    monkeypatch.setattr(onednn, "_library", onednn._library)
    monkeypatch.delenv("DDIM_ONEDNN", raising=False)
    monkeypatch.delenv("DDIM_KEEP_LARGE_BLOCKS", raising=False)
    monkeypatch.delenv("DDIM_RESTART", raising=False)


def no_compilers(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    which = runtime.shutil.which
    monkeypatch.setattr(runtime.shutil, "which",
                        lambda name, *a, **k: None if name in ("g++", "c++", "gcc", "cc") else which(name, *a, **k))


@pytest.mark.skipif(sys.platform != "linux", reason="oneDNN's library is built on x86-64 Linux")
def test_no_cxx_compiler_is_one_note_line_naming_what_runs_instead(nothing_built, monkeypatch, capfd):
    if not onednn.available():
        pytest.skip(f"oneDNN unavailable here: {onednn.unavailable_reason()}")
    no_compilers(monkeypatch)
    available = onednn.available.__wrapped__  # the uncached check
    assert not available() and not available()
    assert onednn.unavailable_reason() == "no C++ compiler found: g++"
    lines = capfd.readouterr().err.splitlines()
    assert lines == ["note: oneDNN convolutions unavailable (no C++ compiler found: g++); XLA's convolutions run "
                     "instead, about 1.4x slower to train on a CPU; install g++ (apt-get install g++) or set "
                     "DDIM_ONEDNN=0 to silence this"]


def test_convolutions_turned_off_print_nothing(nothing_built, monkeypatch, capfd):
    no_compilers(monkeypatch)
    monkeypatch.setenv("DDIM_ONEDNN", "0")
    assert not onednn.available.__wrapped__()
    onednn.prepare()
    assert capfd.readouterr().err == ""


def test_no_c_compiler_is_one_note_line_for_the_allocator_layer(nothing_built, monkeypatch, capfd):
    no_compilers(monkeypatch)
    monkeypatch.setattr(runtime.sys, "platform", "linux")
    monkeypatch.setattr(runtime.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(runtime, "_loaded_layer", lambda: None)
    monkeypatch.setattr(runtime, "_restart_checked", True)  # this process went through the ddim command's start
    assert runtime.keep_large_blocks_library() is None
    runtime.note_allocator_fallback()
    runtime.note_allocator_fallback()
    assert capfd.readouterr().err.splitlines() == [
        "note: the large-block allocator layer unavailable (no C compiler found: gcc); glibc's malloc runs alone, "
        "about 1.15x slower to train on a CPU; install gcc (apt-get install gcc) or set DDIM_KEEP_LARGE_BLOCKS=0 "
        "to silence this"]
    monkeypatch.setattr(runtime, "_noted", set())
    monkeypatch.setenv("DDIM_KEEP_LARGE_BLOCKS", "0")
    runtime.note_allocator_fallback()
    assert capfd.readouterr().err == ""
    assert runtime.allocator_layer()[1] == "turned off by DDIM_KEEP_LARGE_BLOCKS=0"


NO_COMPILER_RUN = """
import jax, jax.numpy as jnp
from ddim import onednn, ops
from ddim.cli.app import setup_runtime
setup_runtime("off")
from jax._src import xla_bridge
built_before_any_trace = onednn.available.cache_info().currsize == 1 and not xla_bridge.backends_are_initialized()
x, kernel = jnp.ones((1, 4, 4, 8)), jnp.ones((3, 3, 8, 8))
jax.jit(jax.grad(lambda x, k: ops.conv2d(x, k).sum(), argnums=(0, 1)))(x, kernel)
print(built_before_any_trace, onednn.available())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="oneDNN's library is built on x86-64 Linux")
@pytest.mark.parametrize("cxx", [None, "/nonexistent/g++"])
def test_a_command_builds_the_library_before_its_first_trace_and_notes_a_missing_compiler_once(tmp_path, cxx):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "DDIM_ONEDNN": "1"}
    env.pop("CXX", None)
    if cxx:
        env["CXX"] = cxx
    done = subprocess.run([sys.executable, "-c", NO_COMPILER_RUN], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    notes = [line for line in done.stderr.splitlines() if line.startswith("note:")]
    if cxx is None:
        if not onednn.available():
            pytest.skip(f"oneDNN unavailable here: {onednn.unavailable_reason()}")
        assert done.stdout.split() == ["True", "True"] and notes == []
    else:
        assert done.stdout.split() == ["True", "False"]
        note = onednn.NOTE.format(reason=f"C++ compiler CXX={cxx} not found", fix="point CXX at an installed compiler")
        assert notes == [f"note: {note}"]


def test_a_built_library_needs_no_compiler(nothing_built, monkeypatch):
    if runtime.keep_large_blocks_library() is None:
        pytest.skip("no C compiler")
    no_compilers(monkeypatch)
    assert runtime.keep_large_blocks_library() is not None  # from the kernel cache


# -- children start without the layer ------------------------------------------------------------------------------


def test_the_compiler_runs_without_the_layer(monkeypatch, tmp_path):
    layer = "/cache/ddim/kernels/keep_large_blocks-0123.so"
    monkeypatch.setenv("LD_PRELOAD", f"/user/own.so {layer}")
    monkeypatch.setattr(runtime, "kernel_cache_dir", lambda: tmp_path)
    seen = {}

    def run(command, **options):
        seen.update(options["env"])
        Path(command[command.index("-o") + 1]).write_bytes(b"")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(runtime.subprocess, "run", run)
    runtime.compile_library(runtime.KEEP_LARGE_BLOCKS_SOURCE, "cc", ["-DTEST"])
    assert seen["LD_PRELOAD"] == "/user/own.so"
    monkeypatch.setenv("LD_PRELOAD", layer)
    assert "LD_PRELOAD" not in runtime.layer_free_environment()


CHILDREN = """
import multiprocessing, os, subprocess, sys
from ddim import runtime
runtime.restart_with_fast_allocator()  # also where the spawned worker imports this file: it must not restart

def preload():
    return os.environ.get("LD_PRELOAD")

if __name__ == "__main__":
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('LD_PRELOAD'))"],
                           capture_output=True, text=True).stdout.strip()
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # as the data decoding workers start
        worker = pool.apply(preload)
    print(runtime.allocator_layer()[0], child, worker)
"""


def test_children_of_a_restarted_process_start_without_the_layer(tmp_path):
    if sys.platform != "linux" or runtime.platform.libc_ver()[0] != "glibc" or \
            runtime.keep_large_blocks_library() is None:
        pytest.skip("the layer is for Linux with glibc and a C compiler")
    script = tmp_path / "children.py"
    script.write_text(CHILDREN)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "DDIM_RESTART", "DDIM_RESTARTED",
                                                            "DDIM_KEEP_LARGE_BLOCKS")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "None", "None"]


# -- records name the kernels -------------------------------------------------------------------------------------


def test_the_kernels_a_record_names(monkeypatch):
    monkeypatch.setattr(onednn, "available", lambda: True)
    assert onednn.kernels("cpu", "float32") == {"conv_kernels": "onednn", "conv_kernels_reason": None}
    assert onednn.kernels("gpu", "float32") == {"conv_kernels": "xla", "conv_kernels_reason": "gpu backend"}
    assert onednn.kernels("cpu", "bfloat16") == {
        "conv_kernels": "xla", "conv_kernels_reason": "model.dtype bfloat16 (oneDNN runs float32)"}
    monkeypatch.setattr(onednn, "available", lambda: False)
    monkeypatch.setattr(onednn, "_reason", "no C++ compiler found: g++")
    assert onednn.kernels("cpu", "float32") == {"conv_kernels": "xla",
                                                "conv_kernels_reason": "no C++ compiler found: g++"}


def test_a_training_run_records_its_kernels(trained_workdir):
    from ddim.workdir import Workdir

    records = read_records(Workdir(trained_workdir).train_file)
    assert len(records) == 1
    record = records[0]
    assert (record["start_step"], record["total_steps"], record["backend"]) == (0, 6, "cpu")
    assert record["conv_kernels"] == ("onednn" if onednn.available() else "xla")
    assert (record["conv_kernels_reason"] is None) == onednn.available()
    assert isinstance(record["allocator_layer"], bool)
