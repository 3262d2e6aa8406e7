"""Process-level speed settings (ddim/runtime.py): XLA flags and the allocator restart."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddim import runtime


LAYER = "/cache/keep_large_blocks-0123.so"


@pytest.fixture
def linux_with_huge_pages(monkeypatch):
    monkeypatch.setattr(runtime.sys, "platform", "linux")
    monkeypatch.setattr(runtime.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(runtime, "_transparent_huge_pages_available", lambda: True)
    monkeypatch.setattr(runtime, "keep_large_blocks_library", lambda: Path(LAYER))


def test_allocator_settings_are_added_to_the_users_own(linux_with_huge_pages):
    assert runtime.fast_allocator_environment({}) == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "LD_PRELOAD": LAYER}
    extra = runtime.fast_allocator_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "LD_PRELOAD": "/x.so"})
    assert extra == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "LD_PRELOAD": f"{LAYER} /x.so"}


@pytest.mark.parametrize(
    "environ,expected",
    [
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, {"LD_PRELOAD": LAYER}),  # the user's own choice wins
        ({"DDIM_KEEP_LARGE_BLOCKS": "0"}, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}),
        ({"DDIM_RESTART": "0"}, {}),
        ({"DDIM_RESTARTED": "1"}, {}),  # never restart twice
    ],
)
def test_settings_the_user_turned_off_or_already_has_are_not_added(linux_with_huge_pages, environ, expected):
    assert runtime.fast_allocator_environment(environ) == expected


def test_an_older_glibc_gets_the_layer_but_not_the_tunable(monkeypatch, linux_with_huge_pages):
    monkeypatch.setattr(runtime.platform, "libc_ver", lambda: ("glibc", "2.31"))
    assert runtime.fast_allocator_environment({}) == {"LD_PRELOAD": LAYER}


@pytest.mark.parametrize("libc", [("", ""), ("musl", "1.2")])
def test_no_restart_without_glibc(monkeypatch, linux_with_huge_pages, libc):
    monkeypatch.setattr(runtime.platform, "libc_ver", lambda: libc)
    assert runtime.fast_allocator_environment({}) == {}


def test_no_restart_off_linux(monkeypatch, linux_with_huge_pages):
    monkeypatch.setattr(runtime.sys, "platform", "darwin")
    assert runtime.fast_allocator_environment({}) == {}


def test_restart_re_executes_with_the_same_arguments_once():
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "LD_PRELOAD", "DDIM_RESTART", "DDIM_RESTARTED", "DDIM_KEEP_LARGE_BLOCKS")}
    env["GLIBC_TUNABLES"] = "glibc.malloc.arena_max=4"  # the user's own, which the children get back
    extra = runtime.fast_allocator_environment(env)
    if not extra:
        pytest.skip("this machine takes neither the huge-page tunable nor the large-block layer")
    script = (
        "import os, subprocess, sys\n"
        "from ddim import runtime\n"
        "print('start', flush=True)\n"
        "runtime.restart_with_fast_allocator()\n"
        "runtime.restart_with_fast_allocator()  # a second call changes nothing\n"
        "print(runtime.allocator_layer()[0], sys.argv[1:])\n"
        "print(os.environ.get('GLIBC_TUNABLES'), os.environ.get('LD_PRELOAD'), os.environ.get('DDIM_RESTARTED'))\n"
        "child = 'import os; print(os.environ.get(\"LD_PRELOAD\"), os.environ.get(\"GLIBC_TUNABLES\"))'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout.strip())\n"
    )
    out = subprocess.run([sys.executable, "-c", script, "a b", "c"], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[:3] == ["start", "start", f"{'LD_PRELOAD' in extra} ['a b', 'c']"]
    # What the restart added is this process's alone: its children start with the user's environment.
    assert out[3:] == ["glibc.malloc.arena_max=4 None None", "None glibc.malloc.arena_max=4"]


def test_the_restarted_process_gives_its_children_the_environment_from_before():
    before = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "LD_PRELOAD": None}
    environ = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "LD_PRELOAD": f"{LAYER}",
               "DDIM_RESTARTED": json.dumps(before), "HOME": "/home/u"}
    runtime._for_this_process_only(environ)
    assert environ == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/home/u"}
    # Without the mark (a parent put the layer there), only the layer leaves; the user's own preloads stay.
    environ = {"LD_PRELOAD": f"/x.so {LAYER}", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    runtime._for_this_process_only(environ)
    assert environ == {"LD_PRELOAD": "/x.so", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


LAYER_CHECK = """
import ctypes, os, sys
libc = ctypes.CDLL(None)
libc.malloc.restype = libc.realloc.restype = libc.aligned_alloc.restype = ctypes.c_void_p
libc.malloc.argtypes, libc.free.argtypes = [ctypes.c_size_t], [ctypes.c_void_p]
libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
libc.malloc_usable_size.argtypes, libc.malloc_usable_size.restype = [ctypes.c_void_p], ctypes.c_size_t
big = 100 << 20
first = libc.malloc(big)
ctypes.memset(first, 7, big)
assert libc.malloc_usable_size(first) >= big
libc.free(first)
again = libc.malloc(big - (1 << 20))  # about the same size: the kept block again, not a fresh mapping
assert again == first, (again, first)
assert ctypes.string_at(again, 8) == bytes([7]) * 8  # still mapped, never handed back to the kernel
other = libc.malloc(big)  # the first is in use: a block of its own
assert other != again
grown = libc.realloc(again, 2 * big)  # grows into a new block, contents kept
assert ctypes.string_at(grown + big - (1 << 20) - 8, 8) == bytes([7]) * 8
aligned = ctypes.c_void_p()
assert libc.posix_memalign(ctypes.byref(aligned), 4096, big) == 0 and aligned.value % 4096 == 0
wide = libc.aligned_alloc(1 << 16, big)  # wider than a page: glibc's
assert wide % (1 << 16) == 0
small = libc.malloc(1000)
ctypes.memset(small, 1, 1000)
for pointer in (grown, other, aligned.value, wide, small):
    libc.free(pointer)
pid = os.fork()  # the layer's lock survives a fork
if pid == 0:
    child = libc.malloc(big)
    libc.free(child)
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
import numpy as np
x = np.arange(50_000_000, dtype=np.float32)  # 200 MB through numpy
assert float(x[-1] + (x * 2).sum() / 2) == float(np.float32(49_999_999) + np.float32(x.sum()))
print("ok")
"""


def test_the_large_block_layer_reuses_blocks_and_passes_everything_else_to_glibc():
    if sys.platform != "linux" or runtime.platform.libc_ver()[0] != "glibc":
        pytest.skip("the layer is for Linux with glibc")
    layer = runtime.keep_large_blocks_library()
    if layer is None:
        pytest.skip("no C compiler")
    env = {**os.environ, "LD_PRELOAD": str(layer)}
    done = subprocess.run([sys.executable, "-c", LAYER_CHECK], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_xla_flags_keep_the_users_own(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=dot --xla_dump_to=/tmp/x")
    monkeypatch.delenv("DDIM_XLA_FLAGS", raising=False)
    assert runtime.configure_xla_flags() == "--xla_cpu_experimental_ynn_fusion_type=dot --xla_dump_to=/tmp/x"
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    flags = runtime.configure_xla_flags()
    assert flags.startswith("--xla_dump_to=/tmp/x ") and "--xla_cpu_experimental_ynn_fusion_type=" in flags
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv("DDIM_XLA_FLAGS", "0")
    assert runtime.configure_xla_flags() == ""


def test_a_layer_that_does_not_compile_is_left_out(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime, "kernel_cache_dir", lambda: tmp_path)
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    assert runtime.keep_large_blocks_library() is None
    assert not list(tmp_path.iterdir())  # nothing half-written left behind
