"""Export a TFDS dataset's images, preprocessed as training preprocesses them, as an image folder.

For a machine without TensorFlow (a GPU machine with JAX alone, say): `ddim train --data FOLDER`
reads the folder there with Pillow alone. Every image of the config's train and val splits (for Oxford Flowers
102, all 8,189) is centre-cropped and resized to ``model.image_size`` by the function training uses, then saved
in one subfolder per class, named by the dataset's class names (so a class-conditional model keeps them; the
folder's class ids are those names in sorted order, and `ddim eval` matches classes by name). The folder's
loader leaves an image of the model's size as it is (its resize to the same size is the identity).

Formats: ``jpeg`` (quality 95, no chroma subsampling: 8,189 Flowers at 64x64 take 31 MiB, PSNR 40.5 dB to the
exact pixels; small enough to travel with a GPU call) or ``png`` (lossless, 66 MiB).

Run:  TFDS_DATA_DIR=... python -m benchmarks.release.export_flowers_folder OUT --config flowers64-fast
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="the folder to write (one subfolder per class)")
    parser.add_argument("--config", default="flowers64-fast")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    parser.add_argument("--format", choices=("jpeg", "png"), default="jpeg")
    args = parser.parse_args(argv)

    from PIL import Image

    import ddim
    from ddim.data import load

    config = ddim.load_config(args.config, args.overrides)
    data = load(config, None, ("train", "val"), print)
    out = Path(args.out)
    written = 0
    for part in (data.train, data.val):
        labels = part.label_array()
        for row in range(len(part)):
            name = data.class_names[labels[row]] if labels[row] >= 0 else ""
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            image = Image.fromarray(np.asarray(part[row]))
            if args.format == "jpeg":
                image.save(folder / f"{written:05d}.jpg", quality=95, subsampling=0)
            else:
                image.save(folder / f"{written:05d}.png", optimize=True)
            written += 1
    print(f"wrote {written} images of {len(data.class_names)} classes to {out}")
    return written


if __name__ == "__main__":
    main()
