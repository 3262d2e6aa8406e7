"""Training data: an image folder or a TFDS dataset, preprocessed once into an on-disk cache.

Modules, one job each (this file only re-exports):

- :mod:`~ddim.data.sources`: :func:`load` and :func:`load_split`, the entry points, and where the cache lives
- :mod:`~ddim.data.report`: :class:`Data`, what was loaded, and its JSON report
- :mod:`~ddim.data.loader`: Grain batches ``{"image", "label"}``; data order a pure function of ``(seed, epoch)``
- :mod:`~ddim.data.cache`: the uint8 cache files and :class:`ImageRows`, their random-access reader
- :mod:`~ddim.data.folder`: an image folder (scan, parallel decoding, incremental rebuilds, labels)
- :mod:`~ddim.data.tfds`: a TFDS dataset (TensorFlow decodes; imported lazily)
- :mod:`~ddim.data.decode`: reading one file with Pillow (formats, modes, EXIF, every bad-file reason)
- :mod:`~ddim.data.preprocess`: the one crop-and-resize both sources use (TensorFlow-exact, numpy only)
- :mod:`~ddim.data.split`: the hash-based validation split of a folder
- :mod:`~ddim.data.errors`: :class:`DataError`

:func:`load` returns a :class:`Data` whose ``train`` and ``val`` are
:class:`ImageRows` (array-like, read from disk on indexing, with their labels),
so no split is ever held in memory. Nothing here imports TensorFlow unless
the source is TFDS.
"""

from ddim.data.cache import ImageRows
from ddim.data.errors import DataError
from ddim.data.loader import (COPYING_PASSES, BatchOrder, batch_order, copying_warning, epoch_batches, eval_batches,
                              first_batches, read_batch, total_steps, train_batches)
from ddim.data.preprocess import center_crop_resize
from ddim.data.report import REPORT_FILE, Data, previous_fingerprint, write_report
from ddim.data.sources import cache_root, load, load_split, load_split_labels, min_image_size, split_fingerprint
from ddim.lazy_tensorflow import tensorflow

__all__ = [
    "BatchOrder", "COPYING_PASSES", "Data", "DataError", "ImageRows", "REPORT_FILE", "batch_order", "cache_root", "center_crop_resize",
    "copying_warning", "epoch_batches", "eval_batches", "first_batches", "load", "load_split", "load_split_labels",
    "min_image_size", "previous_fingerprint", "read_batch", "split_fingerprint", "tensorflow", "total_steps",
    "train_batches", "write_report",
]
