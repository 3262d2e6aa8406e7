"""A checkpoint -> a bundled model: its EMA weights, config and training record (``ddim pretrained export``).

The weights are exactly the checkpoint's (float32, the variables
:func:`ddim.checkpoint.load_ema` gives), so the bundle samples the same pixels;
or rounded to float16 (``weights_dtype``), half the bytes.
Paths of the training machine (the TFDS and cache directories, the KID
weights; a fine-tune's source path is cut to its last two parts) are cleared from the stored config: they mean nothing elsewhere. A model
trained on a copy of a dataset (a folder exported from TFDS on a machine without
TensorFlow) can name the dataset itself as the data ``ddim eval`` scores it against
(``real_data``); where it was trained is kept in the record.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable

from ddim.checkpoint.ema import load_ema
from ddim.config import Config, DataConfig
from ddim.pretrained.bundle import Manifest, write_bundle
from ddim.pretrained.record import fid_from_eval_file, given_fid, training_record, workdir_eval_file
from ddim.pretrained.registry import bundled_root, check_name, pretrained_name


def portable_config(config: Config, real_data: DataConfig | None = None) -> Config:
    """``config`` without the paths of the machine it was trained on; its data ``real_data`` when given."""
    data = dataclasses.replace(real_data if real_data is not None else config.data, data_dir="", cache_dir="")
    train = dataclasses.replace(config.train, inception_weights="")
    init = config.init
    if init.source and pretrained_name(init.source) is None:  # a path: its last two parts, as the record's checkpoint
        init = dataclasses.replace(init, source="/".join(Path(init.source).parts[-2:]))
    return dataclasses.replace(config, data=data, train=train, init=init)


def export_checkpoint(
    checkpoint: str | os.PathLike,
    name: str,
    *,
    root: str | os.PathLike | None = None,
    fid: float | None = None,
    fid_protocol: str | None = None,
    eval_file: str | os.PathLike | None = None,
    hardware: str | None = None,
    recipe: str | None = None,
    real_data: DataConfig | None = None,
    overwrite: bool = False,
    warn: Callable[[str], None] | None = None,
    weights_dtype: str = "float32",
) -> Manifest:
    """Bundle the newest intact checkpoint of ``checkpoint`` (a work directory or a step directory) as ``root/name``.

    ``root`` defaults to :func:`~ddim.pretrained.registry.bundled_root` (the
    package's ``ddim/pretrained/``). The FID is ``fid`` with ``fid_protocol``
    (how it was measured) when given, else read from ``eval_file`` (default: the
    work directory's ``eval.jsonl``), else ``None``: never made up.
    ``hardware`` and ``recipe`` are the user's words, recorded as given.
    ``real_data``: the data section the bundle keeps (what ``ddim eval`` of it
    scores against; class ids are matched by name) instead of the checkpoint's;
    the checkpoint's data are then recorded as ``trained_on_data``.
    ``weights_dtype``: ``"float32"`` (exact) or ``"float16"`` (half the bytes; measure the FID of both first).
    """
    check_name(name)
    measured = given_fid(fid, fid_protocol) if fid is not None else None
    loaded = load_ema(checkpoint, warn=warn)
    if measured is None:
        source = Path(eval_file) if eval_file is not None else workdir_eval_file(loaded.path)
        measured = fid_from_eval_file(source, loaded.path, loaded.step, loaded.config.name)
    record = training_record(loaded.config, loaded.step, loaded.path, fid=measured, hardware=hardware, recipe=recipe)
    if real_data is not None:
        trained_on = loaded.config.data
        record["trained_on_data"] = ({"image_dir": trained_on.image_dir} if trained_on.image_dir else
                                     {"dataset": trained_on.dataset, "train_split": trained_on.train_split})
    return write_bundle(root if root is not None else bundled_root(), name, portable_config(loaded.config, real_data),
                        loaded.variables, record, overwrite=overwrite, weights_dtype=weights_dtype)
