"""JAX compilation: the persistent cache that lets repeated runs skip it, and a cheap compile for programs that
run once.

The cache lives in ``~/.cache/ddim/jax`` (:func:`cache_root`, which the native kernels of
:func:`ddim.runtime.kernel_cache_dir` share); ``DDIM_COMPILATION_CACHE`` (or ``--compilation-cache``) names
another directory, or ``off``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Iterator

# The values of DDIM_COMPILATION_CACHE (or --compilation-cache) that turn the caches off.
CACHE_OFF = ("off", "none", "0")

# JAX's monitoring events (jax.monitoring): every program handed to XLA records the first, whether XLA compiles
# it or it is read from the persistent cache; a read from the persistent cache also records the second.
BUILD_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def cache_root() -> Path:
    """ddim's per-user cache directory: ``$XDG_CACHE_HOME/ddim``, else ``~/.cache/ddim``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ddim"


def default_cache_dir() -> Path:
    return cache_root() / "jax"


def compilation_cache_dir(directory: str | os.PathLike | None = None) -> Path | None:
    """``directory`` (else ``$DDIM_COMPILATION_CACHE``, else ``~/.cache/ddim/jax``); None when that is ``"off"``."""
    choice = directory if directory is not None else os.environ.get("DDIM_COMPILATION_CACHE")
    if choice is not None and str(choice).lower() in (*CACHE_OFF, ""):
        return None
    return Path(choice) if choice is not None else default_cache_dir()


def enable_compilation_cache(directory: str | os.PathLike | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache so repeated runs skip compilation.

    ``directory`` (else ``$DDIM_COMPILATION_CACHE``, else ``~/.cache/ddim/jax``);
    ``"off"`` disables it. Returns the directory used, or None.
    """
    path = compilation_cache_dir(directory)
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # an unusable cache only costs compile time
    import jax

    jax.config.update("jax_compilation_cache_dir", str(path))
    # Cache every program that took noticeable time to compile, whatever its size.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def compile_for_one_call(jitted, *args):
    """Compile ``jitted`` for ``args`` the cheap way, for code that runs once (parameter init).

    On CPU, LLVM's optimisations are switched off: initialising the flowers64 model
    draws from the RNG 88 times, and optimising that unrolled threefry code takes
    ~9 s to compile versus ~3 s without (the result is bit-identical, and the run
    takes 0.1 s either way). Other backends compile as usual.
    """
    import jax

    options = {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else None
    return jitted.lower(*args).compile(compiler_options=options)


@dataclasses.dataclass
class CompileCount:
    """The programs built while :func:`counting_compilations` was open."""

    built: int = 0  # handed to XLA: compiled, or read from the persistent cache
    from_cache: int = 0  # read from the persistent compilation cache

    @property
    def compiled(self) -> int:
        """Programs XLA compiled (not read from the cache)."""
        return self.built - self.from_cache


@contextlib.contextmanager
def counting_compilations() -> Iterator[CompileCount]:
    """Count the programs compiled, and those read from the persistent cache, inside the block.

    JAX's listeners are process-wide: programs other threads build meanwhile are counted too.
    """
    import jax

    count = CompileCount()

    def on_duration(event: str, duration: float, **kwargs) -> None:
        if event == BUILD_EVENT:
            count.built += 1

    def on_event(event: str, **kwargs) -> None:
        if event == CACHE_HIT_EVENT:
            count.from_cache += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_duration_listener(on_duration)
        jax.monitoring.unregister_event_listener(on_event)
