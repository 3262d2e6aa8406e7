"""Write bundled models again with their weights stored in another dtype (float16: half the bytes).

Run:  python -m benchmarks.release.bundle_dtype flowers32 flowers64 --dtype float16 --out /tmp/f16
      DDIM_PRETRAINED_DIR=/tmp/f16 ddim eval --pretrained flowers32 --num 1000 --split all
      ddim eval --pretrained flowers32 --num 1000 --split all        (the same samples from the float32 weights)

Each model's config and record are kept; its SHA-256 and size follow the new file. ``--out`` is a directory of
bundled models (``$DDIM_PRETRAINED_DIR`` points ddim at it); ``--out`` the package's own ``ddim/pretrained``
with ``--overwrite`` converts the shipped bundles in place, which is only right once the FID of both is
measured level (docs/models.md, "Integrity").
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help="bundled models (ddim pretrained lists them)")
    parser.add_argument("--dtype", required=True, choices=("float32", "float16"), help="how to store the weights")
    parser.add_argument("--out", type=Path, required=True, help="the directory of bundled models to write into")
    parser.add_argument("--overwrite", action="store_true", help="replace bundles of those names in --out")
    args = parser.parse_args(argv)
    from ddim.pretrained import PretrainedError, find
    from ddim.pretrained.bundle import store_as

    written = []
    try:
        for name in args.names:
            before = find(name)
            after = store_as(before, args.dtype, args.out, overwrite=args.overwrite)
            print(f"{name}: {before.bytes / 1e6:.1f} MB in {before.weights_dtype} -> {after.bytes / 1e6:.1f} MB in "
                  f"{after.weights_dtype}, sha256 {after.sha256} ({after.directory})")
            written.append(after)
    except PretrainedError as error:
        raise SystemExit(f"error: {error}") from None
    return written


if __name__ == "__main__":
    main()
