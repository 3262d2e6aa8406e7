"""A 3x3 convolution as Winograd's F(2x2, 3x3) against XLA's, forward and backward, at the UNet's layer shapes.

Run:  python -m benchmarks.speed.conv_winograd [--size 64] [--batch 64] [--repeats 5]

Winograd's minimal filtering (Lavin & Gray 2016) does a 3x3 convolution's multiplications in 16 matrix products
of 2x2 output tiles instead of 9 per pixel: 2.25x fewer. Written here in JAX (the input transform as strided
slices, the 16 products as one batched ``dot_general``, autodiff for the gradients), timed beside the
network's own convolution (``ddim.ops.conv2d``, XLA's) with ddim's XLA flags and allocator, at the shapes of the
Keras network's convolutions (the first convolution of each block takes the concatenated skip). Prints, per shape, the fastest
forward and the fastest vector-Jacobian product (input and weight gradients) of ``--repeats``, and the largest
relative difference of the outputs. The study it belongs to: docs/research/cpu-speed.md.
"""

from __future__ import annotations

import argparse
import time

import ddim  # noqa: F401  (sets the XLA flags before JAX starts)
from ddim import runtime
from ddim.ops import conv2d  # the network's own convolution, XLA's for a 3x3 kernel

if __name__ == "__main__":
    runtime.restart_with_fast_allocator()  # the allocator the `ddim` command runs with

import jax  # noqa: E402  (after the restart, which must come before anything heavy)
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

# (height as a fraction of --size, input channels, output channels): each level's two convolutions of a block.
SHAPES = ((1, 32, 32), (1, 64, 32), (2, 64, 64), (2, 96, 64), (4, 96, 96), (4, 160, 96), (8, 128, 128),
          (8, 224, 128))


def _input_transform(x, axis: int):
    """B^T of F(2, 3) along ``axis`` of the padded input (length 2T + 2): four arrays of length T."""
    size = x.shape[axis]
    tiles = size // 2 - 1
    even = lax.slice_in_dim(x, 0, size, 2, axis)  # rows 0, 2, ..., 2T
    odd = lax.slice_in_dim(x, 1, size, 2, axis)  # rows 1, 3, ..., 2T + 1
    d0, d2 = lax.slice_in_dim(even, 0, tiles, axis=axis), lax.slice_in_dim(even, 1, tiles + 1, axis=axis)
    d1, d3 = lax.slice_in_dim(odd, 0, tiles, axis=axis), lax.slice_in_dim(odd, 1, tiles + 1, axis=axis)
    return [d0 - d2, d1 + d2, d2 - d1, d1 - d3]


def conv_winograd(x, kernel):
    """Stride-1 'SAME' 3x3 convolution of NHWC ``x`` (even height and width) by F(2x2, 3x3)."""
    n, h, w, c = x.shape
    padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    tiles = jnp.stack([v for rows in _input_transform(padded, 1) for v in _input_transform(rows, 2)])
    g = jnp.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], kernel.dtype)
    transformed_kernel = jnp.einsum("ai,ijco,bj->abco", g, kernel, g).reshape(16, c, -1)
    products = lax.dot_general(tiles.reshape(16, -1, c), transformed_kernel, (((2,), (1,)), ((0,), (0,))))
    m = products.reshape(4, 4, n, h // 2, w // 2, -1)
    # A^T = [[1, 1, 1, 0], [0, 1, -1, -1]] along both tile axes, then the 2x2 outputs interleaved.
    r0, r1 = m[0] + m[1] + m[2], m[1] - m[2] - m[3]
    y00, y01 = r0[0] + r0[1] + r0[2], r0[1] - r0[2] - r0[3]
    y10, y11 = r1[0] + r1[1] + r1[2], r1[1] - r1[2] - r1[3]
    y = jnp.stack([jnp.stack([y00, y01], -2), jnp.stack([y10, y11], -2)], 2)
    return y.reshape(n, h, w, -1)


def fastest(function, args, repeats: int) -> float:
    jax.block_until_ready(function(*args))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(function(*args))
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=64, help="image size of the network's first level")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    key = jax.random.PRNGKey(0)
    for divisor, cin, cout in SHAPES:
        size = args.size // divisor
        x = jax.random.normal(key, (args.batch, size, size, cin))
        kernel = jax.random.normal(key, (3, 3, cin, cout)) * 0.1
        cotangent = jax.random.normal(jax.random.PRNGKey(1), (args.batch, size, size, cout))
        reference = conv2d(x, kernel)
        error = float(jnp.max(jnp.abs(reference - jax.jit(conv_winograd)(x, kernel))) / jnp.max(jnp.abs(reference)))
        row = []
        for conv in (conv2d, conv_winograd):
            forward = jax.jit(conv)
            backward = jax.jit(lambda x, k, g, conv=conv: jax.vjp(conv, x, k)[1](g))
            row += [fastest(forward, (x, kernel), args.repeats), fastest(backward, (x, kernel, cotangent), args.repeats)]
        print(f"{size}x{size} {cin}->{cout}: forward XLA {1e3 * row[0]:.1f} ms, Winograd {1e3 * row[2]:.1f} ms; "
              f"backward XLA {1e3 * row[1]:.1f} ms, Winograd {1e3 * row[3]:.1f} ms; largest relative difference "
              f"{error:.1e}", flush=True)


if __name__ == "__main__":
    main()
