"""Training: the train state and its jitted steps, the loop, and the loop's periodic actions.

- :mod:`ddim.train.state`: ``TrainState``, ``train_step``/``eval_step``, the EMA, (de)serialisation.
- :mod:`ddim.train.loop`: ``train(config, workdir)``, setting a run up (data, resume) and stepping.
- :mod:`ddim.train.actions`: logging, checkpointing, validation, sample grids, KID: one interface.
- :mod:`ddim.train.stop`: turning signals into a clean save-and-stop.
- :mod:`ddim.train.init`: fine-tuning, a run that starts from a trained model (``load_run_config(init=...)``).
"""

from ddim.train.actions import TrainingError
from ddim.train.init import load_run_config
from ddim.train.loop import TrainResult, train
from ddim.train.state import TrainState, create_train_state

__all__ = ["TrainResult", "TrainState", "TrainingError", "create_train_state", "load_run_config", "train"]
