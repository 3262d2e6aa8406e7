"""Orbax checkpoints that carry their own config, so a checkpoint alone rebuilds the model.

- :mod:`ddim.checkpoint.checkpointer`: the :class:`Checkpointer` (save, wait, restore with fallback)
- :mod:`ddim.checkpoint.verify`: damaged checkpoints (what is wrong, setting them aside)
- :mod:`ddim.checkpoint.locate`: user paths -> checkpointer and step; :func:`model_config_mismatch`
- :mod:`ddim.checkpoint.ema`: :func:`load_ema`, the config and EMA weights sampling needs
- :mod:`ddim.checkpoint.quiet`: orbax imported with its log noise silenced
- :mod:`ddim.checkpoint.errors`: :class:`CheckpointError` and its subclasses
"""

from ddim.checkpoint.checkpointer import Checkpointer
from ddim.checkpoint.ema import LoadedCheckpoint, ema_variables, load_ema
from ddim.checkpoint.errors import CheckpointError, CheckpointSaveError, DamagedCheckpoint
from ddim.checkpoint.locate import checkpoint_dir, locate, model_config_mismatch
from ddim.checkpoint.verify import DAMAGED_SUFFIX

__all__ = [
    "DAMAGED_SUFFIX",
    "CheckpointError",
    "CheckpointSaveError",
    "Checkpointer",
    "DamagedCheckpoint",
    "LoadedCheckpoint",
    "checkpoint_dir",
    "ema_variables",
    "load_ema",
    "locate",
    "model_config_mismatch",
]
