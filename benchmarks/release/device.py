"""The device a rebuild's stages run on, in the words of a bundle's record: JAX's backend, device kind and hardware.

Run:  python -m benchmarks.release.device     (prints one JSON object: backend, kind, hardware)

The rebuild asks a child process (:func:`probe`), as its stages are children too: a process that starts JAX on a
GPU or TPU holds the device (on a GPU, most of its memory) for as long as it lives, and the rebuild lives as long
as all of its stages.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from dataclasses import dataclass

from ddim.environment import cpu_model

from benchmarks.common import REPO
from benchmarks.release import stage_commands
from benchmarks.release.recipe_files import RebuildError


@dataclass(frozen=True)
class Device:
    backend: str
    kind: str
    hardware: str
    """In the words of the records: ``1x NVIDIA H100 80GB HBM3 (JAX 0.7.2)``, ``a 2-core CPU (AMD EPYC, JAX ...)``."""

    def __str__(self) -> str:
        return self.backend if self.kind.lower() == self.backend else f"{self.backend}, {self.kind}"


def current_device() -> Device:
    """The device JAX computes on in this process (this starts JAX's backend)."""
    import jax

    devices = jax.devices()
    kind = devices[0].device_kind
    if jax.default_backend() == "cpu":
        hardware = f"a {os.cpu_count()}-core CPU ({cpu_model()}, JAX {jax.__version__})"
    else:
        hardware = f"{len(devices)}x {kind} (JAX {jax.__version__})"
    return Device(jax.default_backend(), kind, hardware)


def probe() -> Device:
    """:func:`current_device` of a child process, started as the stages are (in this process's environment)."""
    command = stage_commands.python_module("benchmarks.release.device", [])
    done = subprocess.run(command, cwd=REPO, env=stage_commands.child_environment({}), capture_output=True,
                          text=True)
    lines = done.stdout.strip().splitlines()
    try:
        return Device(**json.loads(lines[-1]))
    except (IndexError, ValueError, TypeError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RebuildError(f"cannot tell the device (exit {done.returncode}): {last}") from None


def main() -> None:
    import ddim  # noqa: F401  (its XLA flags, as every stage has them)

    print(json.dumps(dataclasses.asdict(current_device())), flush=True)


if __name__ == "__main__":
    main()
