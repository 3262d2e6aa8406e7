"""``[data]``: the training images, a folder of your own or a TFDS dataset, and how they are read."""

from __future__ import annotations

from dataclasses import dataclass

from ddim.config.parsing import ConfigError, at_least


@dataclass(frozen=True)
class DataConfig:
    """The training images: a folder of your own (``image_dir``) or a TFDS dataset, and how they are read."""

    image_dir: str = ""
    """Folder of training images (searched recursively; PNG, JPEG, WebP, BMP, TIFF, GIF). When set, the
    TFDS keys below are not used; ``ddim train --data PATH`` sets it."""
    val_fraction: float = 0.2
    """Image folders: fraction of images held out for validation, chosen by a hash of each file's path
    relative to the folder (so adding files never moves others between the splits). 0.2 as Flowers' 80/20."""
    min_image_size: int = 0
    """Image folders: skip images whose shorter side is below this many pixels; 0 means model.image_size
    (no image is upscaled)."""
    max_image_pixels: int = 89_478_485
    """Image folders: skip images with more pixels (width x height) than this as decompression bombs
    (Pillow's own limit by default)."""
    max_bad_fraction: float = 0.1
    """Image folders: refuse to train when more than this fraction of the image files is unusable
    (corrupt, truncated, too small, ...): a sign of the wrong folder or a broken copy."""
    cache_dir: str = ""
    """Directory of the preprocessed-image cache; empty means <workdir>/data_cache. Point several runs
    at one directory to share it."""
    workers: int = 0
    """Processes decoding images when the cache is built; 0 means one per CPU core."""
    prefetch: int = 4
    """Batches read ahead of the training step by background threads (0: read in the training thread)."""
    dataset: str = "oxford_flowers102"
    """TFDS dataset name; any TFDS dataset with an "image" feature works."""
    train_split: str = "train[:80%]+validation[:80%]+test[:80%]"
    """TFDS split expression of the training images (the Keras example's 80/20 re-split)."""
    val_split: str = "train[80%:]+validation[80%:]+test[80%:]"
    """TFDS split expression of the validation images (the complement of train_split)."""
    data_dir: str = ""
    """TFDS data directory; empty means TFDS's default (or $TFDS_DATA_DIR)."""
    dataset_repetitions: int = 5
    """Passes over the training images per epoch (as in the Keras example)."""
    min_epoch_images: int = 0
    """An epoch repeats the training images more than ``dataset_repetitions`` times where needed to hold at least
    this many, so that a small folder's epoch is not a single step (checkpoints and logs also come at every
    epoch's end, and sample grids every ``train.eval_every`` epochs); 0: ``dataset_repetitions`` alone."""
    holdout_min_images: int = 0
    """Image folders: with fewer usable images than this, none is held out (``val_fraction`` is not applied) and
    every image trains; a run says so in one line. 0: always hold ``val_fraction`` out."""



def validate_data(d: DataConfig) -> None:
    """Check the ``[data]`` values' ranges."""
    at_least(1, {"data.dataset_repetitions": d.dataset_repetitions, "data.max_image_pixels": d.max_image_pixels})
    at_least(0, {"data.min_image_size": d.min_image_size, "data.workers": d.workers, "data.prefetch": d.prefetch,
                 "data.min_epoch_images": d.min_epoch_images, "data.holdout_min_images": d.holdout_min_images})
    if not 0.0 <= d.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction must be in [0, 1), got {d.val_fraction}")
    if not 0.0 <= d.max_bad_fraction <= 1.0:
        raise ConfigError(f"data.max_bad_fraction must be in [0, 1], got {d.max_bad_fraction}")
