"""Process-level JAX settings: XLA flags for fast CPU code and the persistent compilation cache.

``configure_xla_flags`` must run before JAX initialises its backend (importing
``jax`` is fine, running the first computation is not); ``import ddim`` calls
it. Flags the user already set in ``XLA_FLAGS`` are never overridden, and
``DDIM_XLA_FLAGS=0`` turns this off.
"""

from __future__ import annotations

import os
from pathlib import Path

# XLA:CPU's default convolutions are slow on many x86 CPUs; routing convolutions, matmuls and
# the elementwise/reduction ops around them to YNNPACK is markedly faster (see the README's
# benchmark section). These flags only concern the CPU backend: GPU and TPU ignore them.
CPU_XLA_FLAGS = {
    "--xla_cpu_experimental_ynn_fusion_type": "dot,eltwise,reduce,individual_convolution,individual_dot",
}


def configure_xla_flags() -> str:
    """Add the CPU flags to ``XLA_FLAGS`` (keeping the user's own settings); returns the result."""
    current = os.environ.get("XLA_FLAGS", "")
    if os.environ.get("DDIM_XLA_FLAGS", "1").lower() in ("0", "false", "no", "off"):
        return current
    present = {flag.split("=", 1)[0] for flag in current.split()}
    extra = [f"{name}={value}" for name, value in CPU_XLA_FLAGS.items() if name not in present]
    if extra:
        os.environ["XLA_FLAGS"] = " ".join([current, *extra]).strip()
    return os.environ.get("XLA_FLAGS", "")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ddim" / "jax"


def enable_compilation_cache(directory: str | os.PathLike | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache so repeated runs skip compilation.

    ``directory`` (else ``$DDIM_COMPILATION_CACHE``, else ``~/.cache/ddim/jax``);
    ``"off"`` disables it. Returns the directory used, or None.
    """
    choice = directory if directory is not None else os.environ.get("DDIM_COMPILATION_CACHE")
    if choice is not None and str(choice).lower() in ("off", "none", "0", ""):
        return None
    path = Path(choice) if choice is not None else default_cache_dir()
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
