"""The page's header: which checkpoint, work directory, model size and device it serves."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ddim.workdir.layout import Workdir


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """What the page's header says about the checkpoint and the device."""

    checkpoint: Path | None
    workdir: Path | None
    step: int | None
    config_name: str
    image_size: int
    parameters: int
    device: str
    classes: int = 0  # of a class-conditional model
    pretrained: str | None = None  # the bundled model's name (``ddim.load("pretrained:NAME")``), else None

    @classmethod
    def of(cls, pipeline) -> "ModelCard":
        import jax

        path = Path(pipeline.path) if pipeline.path is not None else None
        parameters = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(pipeline.variables["params"]))
        return cls(
            checkpoint=path,
            workdir=workdir_of(path),
            step=pipeline.step,
            config_name=pipeline.config.name,
            image_size=pipeline.config.model.image_size,
            parameters=parameters,
            device=describe_devices(jax.devices()),
            classes=len(pipeline.classes),
            pretrained=pipeline.pretrained,
        )

    def markdown(self) -> str:
        size = f"{self.image_size}x{self.image_size}"
        where = f"work directory `{self.workdir}` · " if self.workdir is not None else ""
        classes = f" · {self.classes} classes" if self.classes else ""
        # A bundled model by its name: its path is somewhere inside the installed package.
        source = f"bundled model `{self.pretrained}`" if self.pretrained else f"checkpoint `{self.checkpoint}`"
        return (
            f"**ddim** · {where}{source} (step {self.step}, config `{self.config_name}`) · "
            f"{size} images{classes} · {format_count(self.parameters)} parameters (EMA weights) · "
            f"device: {self.device}"
        )


def workdir_of(checkpoint: Path | None) -> Path | None:
    """The work directory a step directory lies in (``<workdir>/checkpoints/<step>``), or None if it lies in none."""
    if checkpoint is None:
        return None
    root = Workdir.of_checkpoint(checkpoint).root
    return None if root == checkpoint.absolute() else root


def describe_devices(devices: Sequence[Any]) -> str:
    """``'cpu'``, ``'4 x NVIDIA H100 80GB HBM3 (gpu)'``, ..."""
    kinds = sorted({getattr(d, "device_kind", "?") for d in devices})
    platform = devices[0].platform if devices else "?"
    count = f"{len(devices)} x " if len(devices) > 1 else ""
    kind = ", ".join(kinds)
    return platform if kind.lower() == platform else f"{count}{kind} ({platform})"


def format_count(count: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return str(count)
