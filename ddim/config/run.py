"""A whole run's configuration, :class:`Config`, and loading it from TOML with overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddim.config.data import DataConfig, validate_data
from ddim.config.distill import DistillConfig, validate_distill
from ddim.config.init import InitConfig, validate_init
from ddim.config.model import ModelConfig, validate_model
from ddim.config import named
from ddim.config.parsing import apply_overrides, build, drop_retired_keys, plain
from ddim.config.train import TrainConfig, validate_train


@dataclass(frozen=True)
class Config:
    """A complete run configuration."""

    name: str = "flowers64"
    """Name of the run; the default work directory is runs/<name>."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    init: InitConfig = field(default_factory=InitConfig)
    """Fine-tuning: the trained model the run starts from (empty: random weights)."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """Used by ``ddim distill`` only."""

    @property
    def step_batch_size(self) -> int:
        """Images per optimiser step of the run this config describes: a distilled student trains with
        ``[distill]``'s batch, not ``[train]``'s (its teacher's)."""
        return self.distill.batch_size if self.model.distilled_steps else self.train.batch_size

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts (tuples as lists), as stored in checkpoints and accepted by :func:`from_dict`."""
        return plain(dataclasses.asdict(self))

    def override(self, *overrides: str) -> "Config":
        """A validated copy with ``section.key=value`` overrides applied (see :func:`apply_overrides`)."""
        return from_dict(apply_overrides(self.to_dict(), list(overrides)))



def from_dict(values: dict[str, Any]) -> Config:
    """Build and validate a Config from nested dicts (e.g. a parsed TOML file; retired keys are dropped)."""
    config = build(Config, drop_retired_keys(values), "")
    validate(config)
    return config


def config_values(path: str | Path | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The nested values of a TOML config, a file or a packaged config's name (none when ``path`` is None) with overrides applied, not yet
    validated: the keys a user set, which fine-tuning tells apart from the defaults."""
    values: dict[str, Any] = {}
    if path is not None:
        values, file = named.read(path)
        values.setdefault("name", file.stem)
    return apply_overrides(values, list(overrides or []))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a TOML config (or the defaults when ``path`` is None) and apply overrides."""
    return from_dict(config_values(path, overrides))


def validate(config: Config) -> None:
    """Check the relations between values that types alone cannot express, section by section."""
    validate_model(config.model)
    validate_data(config.data)
    validate_train(config.train)
    validate_init(config.init)
    validate_distill(config.distill)
