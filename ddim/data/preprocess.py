"""The one preprocessing of every data source: centre crop to a square, antialiased resize, uint8.

Both the TFDS path and the image-folder path call :func:`center_crop_resize`,
so the same source image gives the same pixels whichever way it arrives.

It reproduces, bit for bit, what the Keras DDIM example (and this project
before it had its own implementation) does in TensorFlow::

    crop = tf.image.crop_to_bounding_box(image, (h - s) // 2, (w - s) // 2, s, s)   # s = min(h, w)
    image = tf.image.resize(crop, [size, size], "bilinear", antialias=True)
    uint8(clip(round(image), 0, 255))

``tf.image.resize(antialias=True)`` is TensorFlow's ``ScaleAndTranslate``
kernel (``tensorflow/core/kernels/image/scale_and_translate_op.cc``) with the
triangle kernel stretched by the downscaling factor, computed in float32:
per output row/column a span of input pixels with normalised weights, rows
first, then columns, each sum accumulated in input order. Numpy float32
arithmetic rounds every multiply and add like that C++ code does, so doing
the same operations in the same order gives the same floats, and after
``round`` the same bytes (tested against TensorFlow on every Oxford Flowers
image). No TensorFlow is needed: the folder path runs without it.
"""

from __future__ import annotations

import functools

import numpy as np

# Bump when the pixels this module produces change: it is part of every cache key.
PREPROCESS_VERSION = 1

_F32 = np.float32


@functools.lru_cache(maxsize=64)
def resize_spans(input_size: int, output_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, weights)`` of TensorFlow's antialiased triangle-kernel resize along one axis.

    ``starts[i]`` is the first input pixel of output pixel ``i``; ``weights[i, k]``
    the weight of input pixel ``starts[i] + k`` (zero past the span's end).
    Mirrors ``ComputeSpansCore`` with ``translate = 0``, operation by operation.
    """
    scale = _F32(_F32(output_size) / _F32(input_size))  # tf.image.resize: float32(new) / float32(old)
    inv_scale = _F32(1.0 / float(scale))  # C++: `const float inv_scale = 1.0 / scale;` (double divide)
    kernel_scale = max(inv_scale, _F32(1.0))  # antialias: widen the kernel when downsampling
    radius = _F32(1.0)  # the triangle kernel's support
    span_size = min(2 * int(np.ceil(radius * kernel_scale)) + 1, input_size)
    one_over_kernel_scale = _F32(_F32(1.0) / kernel_scale)
    starts = np.zeros(output_size, np.int64)
    weights = np.zeros((output_size, span_size), np.float32)
    for x in range(output_size):
        sample = _F32(_F32(x + _F32(0.5)) * inv_scale)  # + inv_translate, which is 0
        start = int(np.ceil(_F32(_F32(sample - _F32(radius * kernel_scale)) - _F32(0.5))))
        end = int(np.floor(_F32(_F32(sample + _F32(radius * kernel_scale)) - _F32(0.5))))
        start = min(max(start, 0), input_size - 1)
        end = min(max(end, 0), input_size - 1) + 1
        sources = np.arange(start, end)
        positions = (sources.astype(np.float32) + _F32(0.5)) - sample
        taps = np.abs(positions * one_over_kernel_scale)
        taps = np.where(taps < _F32(1.0), _F32(1.0) - taps, _F32(0.0)).astype(np.float32)
        total = _F32(0.0)
        for tap in taps:  # sequential float32 sum, as in the C++ loop
            total = _F32(total + tap)
        if abs(total) >= 1000.0 * np.finfo(np.float32).tiny:
            weights[x, : len(taps)] = taps * _F32(_F32(1.0) / total)
        starts[x] = start
    return starts, weights


def _gather_axis0(image: np.ndarray, starts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``out[i] = sum_k weights[i, k] * image[starts[i] + k]`` in float32, summed in order of ``k``."""
    out = np.zeros((len(starts), *image.shape[1:]), np.float32)
    term = np.empty_like(out)
    last = image.shape[0] - 1
    for k in range(weights.shape[1]):
        # Past a span's end the weight is 0 and TensorFlow skips the term; adding 0 * x changes nothing.
        rows = np.minimum(starts + k, last)
        # uint8 (or float32) times float32 is a float32 product, as static_cast<float>(in) * w in C++.
        np.multiply(weights[:, k, None, None], image[rows], out=term)
        out += term
    return out


def resize_antialiased(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``tf.image.resize(image, [height, width], "bilinear", antialias=True)`` of one ``(H, W, C)`` image.

    Returns float32 ``(height, width, C)``, equal to TensorFlow's result.
    """
    image = np.asarray(image)
    in_height, in_width = image.shape[:2]
    row_starts, row_weights = resize_spans(in_height, height)
    col_starts, col_weights = resize_spans(in_width, width)
    rows_done = _gather_axis0(image, row_starts, row_weights)  # (height, in_width, C): rows first
    return _gather_axis0(rows_done.transpose(1, 0, 2), col_starts, col_weights).transpose(1, 0, 2)


def center_crop_resize(image: np.ndarray, size: int) -> np.ndarray:
    """Centre-crop ``(H, W, C)`` uint8 to a square, antialiased resize to ``size``, round back to uint8."""
    image = np.asarray(image)
    if image.ndim != 3:
        raise ValueError(f"expected an (H, W, C) image, got shape {image.shape}")
    height, width = image.shape[:2]
    crop = min(height, width)
    top, left = (height - crop) // 2, (width - crop) // 2
    square = image[top : top + crop, left : left + crop]
    resized = resize_antialiased(square, size, size)
    return np.clip(np.round(resized), 0.0, 255.0).astype(np.uint8)  # np.round: half to even, like tf.round
