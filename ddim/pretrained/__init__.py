"""Models bundled inside the package: ``ddim.load("pretrained:flowers32")``, ``--pretrained NAME``.

- :mod:`~ddim.pretrained.bundle`: one model's files (safetensors weights, a JSON manifest), checked by SHA-256
- :mod:`~ddim.pretrained.registry`: which models are bundled, finding and loading one by name
- :mod:`~ddim.pretrained.bundle_record`: how a model was made and what it scores, as types (:class:`BundleRecord`)
- :mod:`~ddim.pretrained.scores`: a measurement into a record (``ddim eval`` lines, ``sample_time``)
- :mod:`~ddim.pretrained.render`: the records in words (``ddim pretrained``'s table and ``--details``)
- :mod:`~ddim.pretrained.export`: a checkpoint -> a bundled model and its training record (``ddim pretrained export``)
- :mod:`~ddim.pretrained.errors`: :class:`PretrainedError`

Each model is a directory ``ddim/pretrained/<name>/`` shipped with the wheel.
"""

from ddim.pretrained.bundle import MAX_BYTES, Manifest, read_manifest, read_variables, write_bundle
from ddim.pretrained.bundle_record import BundleRecord, Score
from ddim.pretrained.errors import PretrainedError
from ddim.pretrained.export import export_checkpoint
from ddim.pretrained.render import describe
from ddim.pretrained.registry import (
    ENV,
    PACKAGE_ROOT,
    PREFIX,
    available,
    best_guidance,
    bundled_root,
    default_model,
    find,
    load_pretrained,
    pretrained_name,
    source_of,
)

__all__ = [
    "ENV",
    "MAX_BYTES",
    "PACKAGE_ROOT",
    "PREFIX",
    "BundleRecord",
    "Manifest",
    "PretrainedError",
    "Score",
    "available",
    "best_guidance",
    "bundled_root",
    "default_model",
    "describe",
    "export_checkpoint",
    "find",
    "load_pretrained",
    "pretrained_name",
    "read_manifest",
    "read_variables",
    "source_of",
    "write_bundle",
]
