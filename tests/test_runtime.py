"""Process-level speed settings (ddim/runtime.py): XLA flags and the allocator restart."""

import os
import subprocess
import sys

import pytest

from ddim import runtime


@pytest.fixture
def linux_with_huge_pages(monkeypatch):
    monkeypatch.setattr(runtime.sys, "platform", "linux")
    monkeypatch.setattr(runtime.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(runtime, "_transparent_huge_pages_available", lambda: True)


def test_allocator_tunable_is_added_to_the_users_tunables(linux_with_huge_pages):
    assert runtime.fast_allocator_environment({}) == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    extra = runtime.fast_allocator_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert extra == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}


@pytest.mark.parametrize(
    "environ",
    [
        {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"},  # the user's own choice wins
        {"DDIM_RESTART": "0"},
        {"DDIM_RESTARTED": "1"},  # never restart twice
    ],
)
def test_no_restart_when_set_disabled_or_done(linux_with_huge_pages, environ):
    assert runtime.fast_allocator_environment(environ) == {}


@pytest.mark.parametrize("libc", [("glibc", "2.31"), ("", ""), ("musl", "1.2")])
def test_no_restart_without_a_glibc_that_knows_the_tunable(monkeypatch, linux_with_huge_pages, libc):
    monkeypatch.setattr(runtime.platform, "libc_ver", lambda: libc)
    assert runtime.fast_allocator_environment({}) == {}


def test_no_restart_off_linux(monkeypatch, linux_with_huge_pages):
    monkeypatch.setattr(runtime.sys, "platform", "darwin")
    assert runtime.fast_allocator_environment({}) == {}


def test_restart_re_executes_with_the_same_arguments_once():
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "DDIM_RESTART", "DDIM_RESTARTED")}
    if not runtime.fast_allocator_environment(env):
        pytest.skip("this machine does not take the huge-page tunable")
    script = (
        "import os, sys\n"
        "from ddim import runtime\n"
        "print('start', flush=True)\n"
        "runtime.restart_with_fast_allocator()\n"
        "print(os.environ['GLIBC_TUNABLES'], sys.argv[1:])\n"
    )
    out = subprocess.run([sys.executable, "-c", script, "a b", "c"], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["start", "start", "glibc.malloc.hugetlb=1 ['a b', 'c']"]


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
