"""Process-level settings for speed: XLA flags, the C allocator, native code built on demand.

``configure_xla_flags`` must run before JAX initialises its backend (importing
``jax`` is fine, running the first computation is not); ``import ddim`` calls
it. Flags the user already set in ``XLA_FLAGS`` are never overridden, and
``DDIM_XLA_FLAGS=0`` turns this off.

``restart_with_fast_allocator`` re-executes the process with glibc's malloc
tuned for XLA and a small layer in front of it that keeps large blocks for
reuse (both only settable before a process starts); the ``ddim`` command and
the benchmarks call it first thing. ``DDIM_RESTART=0`` turns it off,
``DDIM_KEEP_LARGE_BLOCKS=0`` the layer alone. What the restart adds is for
that process alone: its children (compilers, data workers, another ``ddim``,
which restarts itself) start with the environment the user gave.

Native code that cannot be built (no compiler, no headers, a compiler error)
costs speed, never a failure: :func:`note` says so in one stderr line per
process, and ``ddim env`` (:mod:`ddim.environment`) shows what runs.

JAX's persistent compilation cache is :mod:`ddim.compilation`'s, TensorFlow's
lazy import :mod:`ddim.lazy_tensorflow`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from ddim.compilation import CACHE_OFF, cache_root

# XLA:CPU hands reductions (BatchNorm statistics, bias gradients: ~5x faster than XLA's own
# loops) and stand-alone matmuls (the 1x1 convolutions) to YNNPACK. Convolutions stay with
# XLA's Eigen kernels, ~2x faster here than YNNPACK's, and elementwise fusions stay with XLA
# (YNNPACK's eltwise fusion swallows the convolutions and is slow on the upsampling
# interleave). Gradient of the flowers64 loss on a 2-core AVX-512 machine: 5.7 s/step with YNNPACK
# for everything (dot,eltwise,reduce,individual_convolution,individual_dot), 4.2 s with this
# choice (docs/benchmarks.md). Only the CPU backend reads these; GPU/TPU ignore them.
CPU_XLA_FLAGS = {
    "--xla_cpu_experimental_ynn_fusion_type": "reduce,individual_dot",
}

# glibc's malloc serves XLA's large buffers from fresh mmaps, so each training step touches
# ~2.2 GB of new 4 KiB pages: ~560k page faults, about a fifth of the step. Backing them with
# transparent huge pages (glibc >= 2.35) cuts that to ~2k faults: 4.2 s -> 3.4-3.6 s per step.
FAST_MALLOC_TUNABLE = "glibc.malloc.hugetlb=1"
RESTARTED_MARK = "DDIM_RESTARTED"

# XLA:CPU allocates a step's temporaries as one block (1.6 GB for a flowers64 training step) and frees it at the
# end; glibc unmaps blocks that large, so the next step faults all of it in again: on a 2-core virtual machine
# every other step took 0.8-1.0 s longer than the 1.8 s it takes with the block kept. This C layer, preloaded in
# front of glibc's malloc, keeps such blocks mapped for reuse (ddim/csrc/keep_large_blocks.c;
# docs/research/cpu-speed.md).
KEEP_LARGE_BLOCKS_SOURCE = Path(__file__).resolve().parent / "csrc" / "keep_large_blocks.c"

class NativeCodeUnavailable(RuntimeError):
    """Native code that cannot be built or loaded here: the reason (the message) and how to get it (``fix``)."""

    def __init__(self, reason: str, fix: str):
        super().__init__(reason)
        self.fix = fix


_noted: set[str] = set()


def note(key: str, message: str) -> bool:
    """Print ``note: message`` on stderr once per process and ``key``; returns whether it printed."""
    if key in _noted:
        return False
    _noted.add(key)
    print(f"note: {message}", file=sys.stderr, flush=True)
    return True


def find_compiler(variable: str, names: tuple[str, ...], language: str) -> str:
    """The compiler ``$variable`` names, else the first of ``names`` on the PATH; raises
    :class:`NativeCodeUnavailable` (what is missing, and what to install) when there is none."""
    chosen = os.environ.get(variable)
    if chosen:
        found = shutil.which(chosen)
        if found is None:
            raise NativeCodeUnavailable(f"{language} compiler {variable}={chosen} not found",
                                        f"point {variable} at an installed compiler")
        return found
    for name in names:
        found = shutil.which(name)
        if found is not None:
            return found
    raise NativeCodeUnavailable(f"no {language} compiler found: {names[0]}",
                                f"install {names[0]} (apt-get install {names[0]})")


def layer_free_environment(environ=None) -> dict[str, str]:
    """``environ`` (default: this process's) without the large-block layer in ``LD_PRELOAD``: for children that
    do not allocate XLA's buffers (compilers, data workers, git); the user's own preloads stay."""
    env = dict(os.environ if environ is None else environ)
    kept = [path for path in env.pop("LD_PRELOAD", "").split() if not _is_layer(path)]
    if kept:
        env["LD_PRELOAD"] = " ".join(kept)
    return env


def _is_layer(path: str) -> bool:
    return Path(path).name.startswith(KEEP_LARGE_BLOCKS_SOURCE.stem + "-")


def configure_xla_flags() -> str:
    """Add the CPU flags to ``XLA_FLAGS`` (keeping the user's own settings); returns the result."""
    current = os.environ.get("XLA_FLAGS", "")
    if switched_off("DDIM_XLA_FLAGS"):
        return current
    present = {flag.split("=", 1)[0] for flag in current.split()}
    extra = [f"{name}={value}" for name, value in CPU_XLA_FLAGS.items() if name not in present]
    if extra:
        os.environ["XLA_FLAGS"] = " ".join([current, *extra]).strip()
    return os.environ.get("XLA_FLAGS", "")


def switched_off(variable: str, environ=None) -> bool:
    """Whether the switch ``variable`` (on by default) was turned off."""
    return (os.environ if environ is None else environ).get(variable, "1").lower() in ("0", "false", "no", "off")


def _transparent_huge_pages_available() -> bool:
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[never]" not in mode


def fast_allocator_environment(environ=None) -> dict[str, str]:
    """The environment variables to add so XLA's buffers come fast: huge pages, large blocks kept.

    ``GLIBC_TUNABLES`` with glibc's huge-page tunable (Linux with glibc >= 2.35 and transparent huge pages,
    unless the user set it) and ``LD_PRELOAD`` with :func:`keep_large_blocks_library` (Linux with glibc and
    a C compiler, unless ``DDIM_KEEP_LARGE_BLOCKS=0``). Empty when the process already restarted, or when
    ``DDIM_RESTART=0``.
    """
    environ = os.environ if environ is None else environ
    if switched_off("DDIM_RESTART", environ) or environ.get(RESTARTED_MARK) or sys.platform != "linux":
        return {}
    library, version = platform.libc_ver()
    if library != "glibc":
        return {}
    extra = {}
    tunables = environ.get("GLIBC_TUNABLES", "")
    try:
        new_enough = tuple(int(p) for p in version.split(".")[:2]) >= (2, 35)
    except ValueError:
        new_enough = False
    if "glibc.malloc.hugetlb" not in tunables and new_enough and _transparent_huge_pages_available():
        extra["GLIBC_TUNABLES"] = ":".join(t for t in (tunables, FAST_MALLOC_TUNABLE) if t)
    if not switched_off("DDIM_KEEP_LARGE_BLOCKS", environ):
        layer = keep_large_blocks_library()
        preloaded = environ.get("LD_PRELOAD", "")
        if layer is not None and str(layer) not in preloaded:
            extra["LD_PRELOAD"] = " ".join(p for p in (str(layer), preloaded) if p)
    return extra


def kernel_cache_dir() -> Path:
    """Where compiled native code is kept: ``~/.cache/ddim/kernels``, a temporary directory when
    ``DDIM_COMPILATION_CACHE=off``."""
    if os.environ.get("DDIM_COMPILATION_CACHE", "").lower() in CACHE_OFF:
        return Path(tempfile.gettempdir()) / f"ddim-kernels-{os.getuid()}"
    return cache_root() / "kernels"


def compile_library(source: Path, compiler: str | Callable[[], str], flags: list[str], stamp: bytes = b"") -> Path:
    """``source`` compiled into a shared library in :func:`kernel_cache_dir` (once per source, ``flags`` and
    ``stamp``); returns its path. ``compiler`` may be a function that finds it, called only when there is
    something to compile. Raises RuntimeError naming the compiler's first error when it fails (the whole
    message in its ``output``)."""
    text = source.read_bytes()
    digest = hashlib.sha256(text + " ".join(flags).encode() + stamp).hexdigest()[:16]
    output = kernel_cache_dir() / f"{source.stem}-{digest}.so"
    if output.is_file():
        return output
    if callable(compiler):
        compiler = compiler()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_suffix(f".{os.getpid()}.tmp")
    command = [compiler, "-O2", "-shared", "-fPIC", str(source), "-o", str(partial), *flags]
    result = subprocess.run(command, capture_output=True, text=True, env=layer_free_environment())
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        first = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else "no message")
        error = RuntimeError(f"compiling {source.name} failed: {first[:300]}")
        error.output = result.stderr
        raise error
    partial.replace(output)  # atomic: a concurrent process sees the whole file or none
    return output


def build_keep_large_blocks() -> Path:
    """The compiled large-block layer (built on first use, about 0.1 s); raises :class:`NativeCodeUnavailable`."""
    def compiler() -> str:
        return find_compiler("CC", ("gcc", "cc"), "C")

    try:
        return compile_library(KEEP_LARGE_BLOCKS_SOURCE, compiler, ["-lpthread", "-ldl"])
    except NativeCodeUnavailable:
        raise  # (no compiler: its own fix)
    except (OSError, RuntimeError) as error:
        raise NativeCodeUnavailable(str(error), "check the C compiler (CC)") from None


def keep_large_blocks_library() -> Path | None:
    """The compiled large-block layer (built on first use, about 0.1 s), or None where it cannot be built."""
    try:
        return build_keep_large_blocks()
    except NativeCodeUnavailable:
        return None  # it only costs speed: allocator_layer() says why


LAYER_NOTE = ("the large-block allocator layer unavailable ({reason}); glibc's malloc runs alone, about 1.15x "
              "slower to train on a CPU; {fix} or set DDIM_KEEP_LARGE_BLOCKS=0 to silence this")


def allocator_layer(environ=None) -> tuple[bool, str, NativeCodeUnavailable | None]:
    """``(active, what, failure)`` of the large-block layer in this process: whether it is loaded, its path or
    why not, and the build failure when that is why (then :data:`LAYER_NOTE` applies)."""
    environ = os.environ if environ is None else environ
    loaded = _loaded_layer()
    if loaded is not None:
        return True, loaded, None
    if switched_off("DDIM_KEEP_LARGE_BLOCKS", environ):
        return False, "turned off by DDIM_KEEP_LARGE_BLOCKS=0", None
    if switched_off("DDIM_RESTART", environ):
        return False, "turned off by DDIM_RESTART=0", None
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False, f"only on Linux with glibc (this is {sys.platform})", None
    try:
        build_keep_large_blocks()
    except NativeCodeUnavailable as failure:
        return False, str(failure), failure
    return False, "this process did not start through the ddim command", None


def _loaded_layer() -> str | None:
    """The path of the large-block layer mapped into this process (Linux), else None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address, permissions, offset, device, inode, path
        path = fields[5] if len(fields) == 6 else ""
        if path.startswith("/") and _is_layer(path):
            return path
    return None


def note_allocator_fallback() -> None:
    """One :func:`note` line when this process went through :func:`restart_with_fast_allocator` and runs without
    the large-block layer because it could not be built."""
    if not _restart_checked:
        return
    active, _, failure = allocator_layer()
    if not active and failure is not None:
        note("allocator", LAYER_NOTE.format(reason=failure, fix=failure.fix))


_restart_checked = False
_started_tunables: str | None = None  # GLIBC_TUNABLES as this process started, once restart_with_fast_allocator ran


def huge_pages() -> bool | None:
    """Whether glibc's malloc in this process backs large blocks with huge pages (``glibc.malloc.hugetlb`` in the
    ``GLIBC_TUNABLES`` it started with); None when not known (the process did not go through
    :func:`restart_with_fast_allocator`)."""
    if not _restart_checked:
        return None
    settings = dict(item.split("=", 1) for item in (_started_tunables or "").split(":") if "=" in item)
    return settings.get("glibc.malloc.hugetlb", "0") != "0"


def restart_with_fast_allocator() -> None:
    """Re-execute this process (same interpreter and arguments) with :func:`fast_allocator_environment`.

    glibc reads ``GLIBC_TUNABLES`` only when a program starts, hence the restart; it
    happens at most once and before anything heavy is imported. Returns only when no
    restart is needed (or possible), with what the restart added taken out of
    ``os.environ`` again (:func:`_for_this_process_only`).
    """
    global _restart_checked, _started_tunables
    if _restart_checked or "--multiprocessing-fork" in getattr(sys, "orig_argv", ()):
        return  # (a pool's worker importing its parent's main module: the parent's pipe forbids a restart)
    extra = fast_allocator_environment()
    if extra:
        # The mark says what the variables were before, so the restarted process can give its children those.
        before = json.dumps({name: os.environ.get(name) for name in extra})
        environ = {**os.environ, **extra, RESTARTED_MARK: before}
        argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            os.execve(sys.executable, argv, environ)
        except OSError:
            pass  # cannot re-execute (unusual sandboxes): run on with the default allocator
    _restart_checked, _started_tunables = True, os.environ.get("GLIBC_TUNABLES")
    _for_this_process_only(os.environ)


def _for_this_process_only(environ) -> None:
    """Take the restart's settings out of ``environ`` (they are in effect already): the variables it changed go
    back to what they were, and the large-block layer leaves ``LD_PRELOAD`` however it got there. A child that
    is ``ddim`` again restarts itself; any other child starts as the user would start it."""
    mark = environ.pop(RESTARTED_MARK, None)
    try:
        before = json.loads(mark) if mark else {}
    except ValueError:
        before = {}
    for name, value in (before.items() if isinstance(before, dict) else ()):
        if value is None:
            environ.pop(name, None)
        elif isinstance(value, str):
            environ[name] = value
    kept = layer_free_environment(environ).get("LD_PRELOAD")
    if kept is None:
        environ.pop("LD_PRELOAD", None)
    else:
        environ["LD_PRELOAD"] = kept
