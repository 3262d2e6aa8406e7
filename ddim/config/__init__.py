"""Typed configuration: dataclasses loaded from TOML, with ``section.key=value`` overrides.

Every value is documented where it is defined, one module per section
(:mod:`~ddim.config.model`, :mod:`~ddim.config.data`, :mod:`~ddim.config.train`,
:mod:`~ddim.config.init`, :mod:`~ddim.config.distill`), each with the checks of
its own values; :mod:`~ddim.config.parsing` reads TOML and overrides and builds
the dataclasses, :mod:`~ddim.config.run` is the whole :class:`Config`. The
defaults are the reference setup of the Keras DDIM example
(``ddim/configs/flowers64.toml`` spells them out). Unknown sections or keys and
values of the wrong type are errors (:class:`ConfigError`), never silently
ignored.

Configs are frozen values (hashable, so a Flax module can hold one): derive a
changed copy with :meth:`Config.override` rather than assigning to a field.
"""

from ddim.config.data import DataConfig
from ddim.config.distill import DistillConfig
from ddim.config.init import InitConfig
from ddim.config.model import ModelConfig
from ddim.config.parsing import RETIRED_KEYS, ConfigError, apply_overrides, drop_retired_keys, read_toml
from ddim.config.run import Config, config_values, from_dict, load_config, validate
from ddim.config.train import TrainConfig

__all__ = [
    "RETIRED_KEYS",
    "Config",
    "ConfigError",
    "DataConfig",
    "DistillConfig",
    "InitConfig",
    "ModelConfig",
    "TrainConfig",
    "apply_overrides",
    "config_values",
    "drop_retired_keys",
    "from_dict",
    "load_config",
    "read_toml",
    "validate",
]
