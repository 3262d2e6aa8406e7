"""What ddim runs on, for bug reports (``ddim env``) and for a run's records.

:func:`report` gathers the versions (ddim, Python, the libraries it uses), the machine (CPU model and cores),
JAX's backend and devices, the native code in use (oneDNN's convolutions, the allocator layer that keeps large
blocks: :mod:`ddim.onednn`, :mod:`ddim.runtime`), the caches' locations and sizes and the environment variables
that change what ddim does; :func:`format_report` writes it as text. :func:`run_fields` is the part a training
run, a distillation or an evaluation records beside its results: which kernels ran the network's convolutions.
Like ``diffusers-cli env`` or ``jax.print_environment_info()``.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from ddim import compilation, runtime

PACKAGES = (
    "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "tensorflow", "tensorflow-datasets", "numpy",
    "pillow", "typer", "gradio", "onednn-cpu-gomp",
)
"""The distributions :func:`report` gives the version of (TensorFlow by whichever of its builds is installed)."""
ALTERNATIVES = {"tensorflow": ("tensorflow", "tensorflow-cpu")}

LABELS = {"onednn_convolutions": "oneDNN convolutions", "allocator_layer": "allocator layer",
          "malloc_huge_pages": "malloc huge pages", "compilation": "JAX compilation", "kernels": "native kernels",
          "data": "data", "fid_weights": "FID weights", "tfds_data": "TFDS data"}
"""How :func:`format_report` names the items of the native code and the caches."""

VARIABLES = ("TFDS_DATA_DIR", "XLA_FLAGS", "JAX_PLATFORMS", "GLIBC_TUNABLES", "LD_PRELOAD", "CC", "CXX",
             "XDG_CACHE_HOME")
"""Environment variables shown besides every ``DDIM_*`` one (those set)."""


def run_fields(dtype: str) -> dict[str, Any]:
    """What a run records of the machine it ran on: JAX's backend, the device count, which kernels ran the
    network's convolutions (``conv_kernels``: ``onednn`` or ``xla``, and ``conv_kernels_reason`` when XLA's) for a
    network computing in ``dtype`` (``model.dtype``), and whether the allocator layer was active."""
    import jax

    from ddim import onednn

    backend = jax.default_backend()
    return {"backend": backend, "devices": jax.device_count(), **onednn.kernels(backend, dtype),
            "allocator_layer": runtime.allocator_layer()[0]}


def training_record(config, start_step: int, total_steps: int) -> dict[str, Any]:
    """The ``train.jsonl`` line of a start of training (:func:`ddim.train.train`): when, which config, from which
    step towards how many, and :func:`run_fields`."""
    import datetime

    return {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "config": config.name, "start_step": start_step, "total_steps": total_steps,
            **run_fields(config.model.dtype)}


def report() -> dict[str, Any]:
    """Everything ``ddim env`` prints, as plain values (``ddim env --json``)."""
    return {
        "ddim": _ddim(),
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": _platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "jax": _jax(),
        "native_code": _native_code(),
        "caches": _caches(),
        "environment": {name: value for name, value in sorted(os.environ.items())
                        if name.startswith("DDIM_") or name in VARIABLES},
    }


def format_report(values: dict[str, Any]) -> str:
    """:func:`report` as text: a section per part, a line per item."""
    package, python, machine = values["ddim"], values["python"], values["platform"]
    git = f", git {package['git']}" if package.get("git") else ""
    cores = f"{machine['cores']} cores" + (f" ({machine['usable_cores']} usable)"
                                          if machine.get("usable_cores") not in (None, machine["cores"]) else "")
    lines = [
        f"ddim {package['version']} ({package['location']}{git})",
        f"Python {python['version']} ({python['executable']})",
        f"Platform: {machine['system']}, {machine['cpu']}, {cores}",
    ]

    def section(title: str, rows: list[tuple[str, str]]) -> None:
        lines.extend(["", title])
        width = max((len(name) for name, _ in rows), default=0)
        lines.extend(f"  {name:<{width}}  {value}" for name, value in rows)

    section("Packages", [(name, version or "not installed") for name, version in values["packages"].items()])
    jax_values = values["jax"]
    if "error" in jax_values:
        section("JAX", [("error", jax_values["error"])])
    else:
        kinds: dict[str, int] = {}
        for device in jax_values["devices"]:
            kind = device["kind"]
            kind += f" ({device['platform']})" if kind != device["platform"] else ""
            kinds[kind] = kinds.get(kind, 0) + 1
        devices = ", ".join(f"{count} x {kind}" for kind, count in kinds.items())
        section("JAX", [("backend", jax_values["backend"]), ("devices", devices)])
    section("Native code", [(LABELS.get(name, name), _state(item)) for name, item in values["native_code"].items()])
    section("Caches", [(LABELS.get(name, name), _cache_line(item)) for name, item in values["caches"].items()])
    variables = list(values["environment"].items())
    section("Environment variables", variables or [("(none of DDIM_*, " + ", ".join(VARIABLES) + " set)", "")])
    return "\n".join(line.rstrip() for line in lines)


def _state(item: dict[str, Any]) -> str:
    return f"{item['state']} ({item['detail']})" if item.get("detail") else item["state"]


def _cache_line(item: dict[str, Any]) -> str:
    if item["path"] is None:
        return item.get("note") or "off"
    size = _human(item["bytes"]) if item["bytes"] is not None else "not created yet"
    note = f"; {item['note']}" if item.get("note") else ""
    return f"{item['path']}  {size}{note}"


def _human(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"  # pragma: no cover


def _ddim() -> dict[str, Any]:
    from importlib import metadata

    location = Path(__file__).resolve().parent  # the package this module is part of, not its facade
    try:
        version = metadata.version("ddim")
    except metadata.PackageNotFoundError:  # a checkout on sys.path, not installed
        version = "not installed"
    return {"version": version, "location": str(location), "git": _git_commit(location.parent)}


def _git_commit(root: Path) -> str | None:
    """The short commit of a git checkout that ``root`` is (an editable install), else None."""
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, env=runtime.layer_free_environment())
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def _platform() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    libc, version = platform.libc_ver()
    return {"system": platform.platform(), "machine": platform.machine(), "cpu": cpu_model(),
            "cores": os.cpu_count(), "usable_cores": usable, "libc": f"{libc} {version}".strip() or None}


def cpu_model() -> str:
    """The CPU's model name as the system gives it (``AMD EPYC 7B13``), else the machine's architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _version(name: str) -> str | None:
    for distribution in ALTERNATIVES.get(name, (name,)):
        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
        return version if distribution == name else f"{version} ({distribution})"
    return None


def _jax() -> dict[str, Any]:
    try:
        import jax

        devices = jax.devices()
        return {"backend": jax.default_backend(),
                "devices": [{"id": device.id, "kind": device.device_kind, "platform": device.platform}
                            for device in devices]}
    except Exception as error:  # a broken install or driver is what the report is for
        return {"error": f"{type(error).__name__}: {error}"}


def _native_code() -> dict[str, dict[str, Any]]:
    from ddim import onednn

    if runtime.switched_off("DDIM_ONEDNN"):
        convolutions = {"state": "off", "detail": "DDIM_ONEDNN=0"}
    elif onednn.available():
        convolutions = {"state": "available", "detail": str(onednn.library_path())}
    else:
        convolutions = {"state": "unavailable", "detail": onednn.unavailable_reason()}
    active, what, failure = runtime.allocator_layer()
    if active:
        layer = {"state": "active", "detail": what}
    elif failure is not None:
        layer = {"state": "unavailable", "detail": what}
    else:
        layer = {"state": "off" if "turned off" in what else "not active", "detail": what}
    pages = runtime.huge_pages()
    if pages is None:
        huge = {"state": "unknown", "detail": "this process did not start through the ddim command"}
    else:
        huge = {"state": "on" if pages else "off",
                "detail": "glibc.malloc.hugetlb in GLIBC_TUNABLES" if pages else None}
    return {"onednn_convolutions": convolutions, "allocator_layer": layer, "malloc_huge_pages": huge}


def _caches() -> dict[str, dict[str, Any]]:
    from ddim.config import Config
    from ddim.data import cache_root
    from ddim.evaluation.fid_weights import cache_dir as fid_cache_dir

    jax_cache = compilation.compilation_cache_dir()
    tfds = os.environ.get("TFDS_DATA_DIR") or str(Path.home() / "tensorflow_datasets")
    return {
        "compilation": _cache(jax_cache, None if jax_cache else "off (DDIM_COMPILATION_CACHE)"),
        "kernels": _cache(runtime.kernel_cache_dir()),
        "data": _cache(cache_root(Config()), "a run's own is <workdir>/data_cache"),
        "fid_weights": _cache(fid_cache_dir()),
        "tfds_data": _cache(Path(tfds).expanduser()),
    }


def _cache(path: Path | None, note: str | None = None) -> dict[str, Any]:
    return {"path": str(path) if path is not None else None, "bytes": _size(path) if path is not None else None,
            "note": note}


def _size(path: Path) -> int | None:
    """The bytes of the files under ``path`` (links not followed); None when it does not exist."""
    if not path.exists():
        return None
    total, pending = 0, [path]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(Path(entry.path))
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return total
