"""The UNet's convolutions on oneDNN's CPU kernels, as XLA custom calls (``ddim/csrc/onednn_conv.cc``).

XLA:CPU runs convolutions on Eigen. On a 2-core AVX-512 Xeon its forward pass and input gradient take 1.3-1.4x
oneDNN's time, and its weight gradient (a contraction over batch x height x width, after transposing the
activations to [C, H, W, N]) 3-4x: that is where a CPU training step of the UNet lost to the Keras example's,
which runs on oneDNN (docs/research/cpu-speed.md). Here the three
convolutions of a float32 3x3 or 1x1 layer run on oneDNN instead, through the JAX FFI.

The library is compiled with the system's C++ compiler against the oneDNN wheel (``onednn-cpu-gomp`` and its
headers, ``onednn-devel-cpu-gomp``, installed with ddim on x86-64 Linux) the first time a process needs it,
into ``~/.cache/ddim/kernels`` (the temporary directory when ``DDIM_COMPILATION_CACHE=off``): the commands that
run JAX do it before their first trace (:func:`prepare`), anything else when a trace first asks. Where anything
of that is missing, :func:`available` says False, why is in :func:`unavailable_reason` and in one stderr line
(:data:`NOTE`, once per process), and the network keeps XLA's convolutions. ``DDIM_ONEDNN=0`` turns it off,
silently. :func:`kernels` names the kernels a run's convolutions take, for its records.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import pkgutil
import platform
import sys
import sysconfig
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ddim import runtime

SOURCE = Path(__file__).resolve().parent / "csrc" / "onednn_conv.cc"
TARGETS = {
    "ddim_conv_forward": "DdimConvForward",
    "ddim_conv_input_gradient": "DdimConvInputGradient",
    "ddim_conv_weight_gradient": "DdimConvWeightGradient",
}
# The kernel sizes that run on oneDNN (the library takes 1 and 3).
KERNEL_SIZES = (1, 3)
_reason: str | None = None
_library: Path | None = None
_disabled = 0
INSTALL = "pip install onednn-cpu-gomp onednn-devel-cpu-gomp"
NOTE = ("oneDNN convolutions unavailable ({reason}); XLA's convolutions run instead, about 1.4x slower to train on "
        "a CPU; {fix} or set DDIM_ONEDNN=0 to silence this")
"""The line a process prints when the library cannot be built or loaded (ddim/runtime.py's :func:`note`)."""


def _prefixes() -> list[Path]:
    """Where pip puts a wheel's ``data`` files (``lib/``, ``include/``): this environment's prefixes."""
    found = []
    for name in ("data", "platbase"):
        path = sysconfig.get_paths().get(name)
        if path:
            found.append(Path(path))
    found += [Path(sys.prefix), Path(sys.base_prefix)]
    return list(dict.fromkeys(found))


def _find_onednn() -> tuple[Path, Path]:
    """(include directory, library directory) of the oneDNN wheel; raises NativeCodeUnavailable."""
    for prefix in _prefixes():
        include, lib = prefix / "include", prefix / "lib"
        if (include / "oneapi" / "dnnl" / "dnnl.hpp").is_file() and (lib / "libdnnl.so").exists():
            return include, lib
    raise runtime.NativeCodeUnavailable("oneDNN's library or headers not installed", INSTALL)


def _build() -> Path:
    """Compile the library (once per source, JAX and oneDNN version) and return its path; raises
    NativeCodeUnavailable."""
    include, lib = _find_onednn()

    def compiler() -> str:
        return runtime.find_compiler("CXX", ("g++", "c++"), "C++")

    flags = ["-std=c++17", f"-I{jax.ffi.include_dir()}", f"-I{include}", f"-L{lib}", "-ldnnl", f"-Wl,-rpath,{lib}"]
    try:
        return runtime.compile_library(SOURCE, compiler, flags,
                                       stamp=jax.__version__.encode() + str(lib.resolve()).encode())
    except runtime.NativeCodeUnavailable:
        raise  # (no compiler: its own fix)
    except (OSError, RuntimeError) as error:
        raise runtime.NativeCodeUnavailable(str(error), f"check the C++ compiler (CXX) and oneDNN ({INSTALL})") \
            from None


@functools.cache
def available() -> bool:
    """Whether the oneDNN convolutions can run in this process (built and registered on first call; a build
    that fails prints :data:`NOTE` once)."""
    global _reason, _library
    if runtime.switched_off("DDIM_ONEDNN"):
        _reason = "turned off by DDIM_ONEDNN=0"
        return False
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        _reason = f"only built on x86-64 Linux (this is {sys.platform} {platform.machine()})"
        return False
    try:
        import ctypes

        try:
            path = _build()
            library = ctypes.cdll.LoadLibrary(str(path))
            for name, symbol in TARGETS.items():
                jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
        except (OSError, AttributeError) as error:  # built, but not loadable
            raise runtime.NativeCodeUnavailable(str(error), f"reinstall oneDNN ({INSTALL})") from None
    except runtime.NativeCodeUnavailable as error:
        _reason = str(error)
        runtime.note("onednn", NOTE.format(reason=error, fix=error.fix))
        return False
    _library = path
    return True


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True or was not asked yet)."""
    return _reason


def library_path() -> Path | None:
    """The library loaded by :func:`available` (None before, or without it)."""
    return _library


def prepare() -> None:
    """Build and register the library now, before the first trace, where the network's convolutions can run on it:
    unless ``DDIM_ONEDNN=0``, or the process is expected to run on an accelerator (``JAX_PLATFORMS`` names one
    first, or a GPU/TPU plugin of JAX is installed; a CPU fallback there still builds it when first traced)."""
    if runtime.switched_off("DDIM_ONEDNN") or _accelerator_expected():
        return
    available()


def _accelerator_expected() -> bool:
    """Whether JAX is set up for a GPU or TPU, judged without starting its backends."""
    platforms = jax.config.jax_platforms
    if platforms:
        return platforms.split(",")[0].strip().lower() != "cpu"
    try:
        import jax_plugins  # the namespace of JAX's CUDA and ROCm plugins
    except ImportError:
        plugins = False
    else:
        plugins = any(True for _ in pkgutil.iter_modules(jax_plugins.__path__))
    return plugins or importlib.util.find_spec("libtpu") is not None


def kernels(backend: str, dtype: str) -> dict[str, str | None]:
    """What runs a network's convolutions on ``backend`` computing in ``dtype`` (``model.dtype``), as a run's
    records name it: ``conv_kernels`` (``"onednn"`` or ``"xla"``) and ``conv_kernels_reason`` (why XLA's, else
    None)."""
    if backend != "cpu":
        reason = f"{backend} backend"
    elif dtype != "float32":
        reason = f"model.dtype {dtype} (oneDNN runs float32)"
    elif available():
        return {"conv_kernels": "onednn", "conv_kernels_reason": None}
    else:
        reason = unavailable_reason()
    return {"conv_kernels": "xla", "conv_kernels_reason": reason}


@contextlib.contextmanager
def disabled():
    """Trace the network with XLA's convolutions inside this block.

    For XLA's cost analysis, which counts no FLOPs in a custom call: the benchmarks count a step's FLOPs on
    the same step traced this way; and for forward-mode differentiation (``jax.jvp``), which the custom call's
    ``custom_vjp`` does not allow (:func:`ddim.ops.forward_mode`).
    """
    global _disabled
    _disabled += 1
    try:
        yield
    finally:
        _disabled -= 1


def applies(x, kernel) -> bool:
    """Whether :func:`conv2d` serves this convolution: float32, a kernel size in ``KERNEL_SIZES``, on the CPU."""
    return (
        not _disabled
        and kernel.shape[0] == kernel.shape[1]
        and kernel.shape[0] in KERNEL_SIZES
        and x.dtype == jnp.float32
        and kernel.dtype == jnp.float32
        and jax.default_backend() == "cpu"
        and available()
    )


def _call(target: str, shape, a, b):
    if not available():  # registers the targets on first use
        raise RuntimeError(f"oneDNN convolutions unavailable: {unavailable_reason()}")
    return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(shape, np.float32), vmap_method="sequential")(a, b)


@jax.custom_vjp
def conv2d(x, kernel):
    """Stride-1 'SAME' convolution of NHWC float32 ``x`` with a 1x1 or 3x3 HWIO ``kernel``, on oneDNN."""
    return _call("ddim_conv_forward", x.shape[:3] + kernel.shape[3:], x, kernel)


def _forward(x, kernel):
    return conv2d(x, kernel), (x, kernel)


def _backward(residuals, gradient):
    x, kernel = residuals
    input_gradient = _call("ddim_conv_input_gradient", x.shape, gradient, kernel)
    kernel_gradient = _call("ddim_conv_weight_gradient", kernel.shape, x, gradient)
    return input_gradient, kernel_gradient


conv2d.defvjp(_forward, _backward)


def prepare_native_code() -> None:
    """Build and load the native code a command that runs JAX uses, before its first trace: the oneDNN
    convolutions (:func:`prepare`); and say, one line each, what runs slower for want of a compiler or headers
    (the large-block layer was built, or not, when the process started: :func:`ddim.runtime.note_allocator_fallback`)."""
    runtime.note_allocator_fallback()
    prepare()
