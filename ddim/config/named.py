"""The configs that ship inside the package (``ddim/configs/*.toml``), found by name.

Every command that takes ``--config`` takes a packaged config's name (``--config finetune32``) or a path to a
TOML file of one's own; ``ddim configs`` lists the packaged ones and prints one to start a file from. A
packaged config's first comment line says what it is for: :func:`describe` shows it beside the image size and
how the run starts (from random weights, from a trained model, or as a distillation).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddim.config.model import ModelConfig
from ddim.config.parsing import ConfigError, read_toml

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
"""Where the packaged configs live (package data of ``ddim``)."""
SUFFIX = ".toml"


def names() -> list[str]:
    """The packaged configs' names, sorted."""
    return sorted(path.stem for path in CONFIG_DIR.glob(f"*{SUFFIX}"))


def resolve(config: str | Path) -> Path:
    """The file ``config`` names: a TOML file that exists, else a packaged config of that name.

    Neither is one :class:`ConfigError` line that lists the packaged names."""
    path = Path(config)
    if path.is_file():
        return path
    known = f"packaged configs: {', '.join(names())}; `ddim configs` describes them"
    if path.parent != Path(".") or path.suffix not in ("", SUFFIX):
        raise ConfigError(f"config file not found: {config} ({known})")
    packaged = CONFIG_DIR / f"{path.stem}{SUFFIX}"
    if not packaged.is_file():
        what = "config file not found" if path.suffix else "no packaged config named"
        raise ConfigError(f"{what} {str(config)!r} ({known})")
    return packaged


@dataclass(frozen=True)
class PackagedConfig:
    """What a packaged config is for: one line of ``ddim configs``."""

    name: str
    image_size: int | None
    """Its ``model.image_size``; None where the model comes from elsewhere (a fine-tune's source, a
    distillation's teacher)."""
    kind: str
    """How a run of it starts: "from scratch", "fine-tune" or "distillation"."""
    source: str
    """A fine-tune's ``init.source`` (empty otherwise)."""
    summary: str
    """The file's first comment line: what it is for."""


def describe(name: str) -> PackagedConfig:
    """What the packaged config ``name`` is for, read from the file itself (its values and first comment)."""
    values, path = read(name)
    source = str((values.get("init") or {}).get("source", ""))
    size = int((values.get("model") or {}).get("image_size", ModelConfig.image_size))
    kind = "distillation" if "distill" in values else "fine-tune" if source else "from scratch"
    return PackagedConfig(path.stem, None if kind != "from scratch" else size, kind, source,
                          summary_line(path.read_text()))


def read(config: str | Path) -> tuple[dict, Path]:
    """The values of the config ``config`` names (:func:`resolve`), not yet validated, and its file."""
    path = resolve(config)
    return read_toml(path), path


def summary_line(text: str) -> str:
    """The first comment line of a TOML file, without its ``#``; empty when it opens with no comment."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        return stripped.lstrip("#").strip() if stripped.startswith("#") else ""
    return ""
